package fhir

// The resource types beyond the typed four (docs/FHIR.md "Resource types beyond the typed
// four"): every other R4 type, served from the generic store (processors/patients/resources.go)
// with create, read, vread, update (update as create included) and search by the common
// parameters.

import (
	"net/http"
	"slices"
	"strconv"

	"github.com/gorilla/mux"

	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/processors/patients"
)

// genericParams are the search parameters of the generic store's patient data; directory types
// (Organization, Practitioner …) take those that do not name a patient or an encounter.
var genericParams = [][2]string{{"_id", "token"}, {"_lastUpdated", "date"}, {"patient", "reference"}, {"subject", "reference"},
	{"encounter", "reference"}, {"code", "token"}, {"category", "token"}, {"status", "token"}, {"identifier", "token"},
	{"date", "date"}}

var directoryParams = [][2]string{{"_id", "token"}, {"_lastUpdated", "date"}, {"code", "token"}, {"category", "token"},
	{"status", "token"}, {"identifier", "token"}, {"date", "date"}}

var genericSorts = []string{"_id", "_lastUpdated", "date", "status", "code"}

// served reports whether the base serves resource type t.
func served(t string) bool {
	_, typed := resourceTypes[t]
	return typed || patients.GenericType(t)
}

// paramsOf are the search parameters of type t.
func paramsOf(t string) [][2]string {
	switch {
	case t == "Encounter" || !served(t):
		return genericParams
	case searchParams[t] != nil:
		return searchParams[t]
	case patients.PatientData(t):
		return genericParams
	}
	return directoryParams
}

// sortsOf are what _sort takes for type t.
func sortsOf(t string) []string {
	if s, ok := sortParams[t]; ok && t != "Encounter" {
		return s
	}
	return genericSorts
}

// generic reports whether t is read and searched in the generic store (Encounter is: the store
// serves the typed table's encounters beside its own).
func generic(t string) bool {
	return patients.GenericType(t)
}

// createGeneric creates a resource of the generic store, conditionally with If-None-Exist.
func (h handler) createGeneric(r *http.Request, t, ifNoneExist string, read func(int64) ([]byte, error)) created {
	body, err := read(resourceBodyLimit)
	if err != nil {
		return created{err: err}
	}
	c, err := parseCondition(t, ifNoneExist, "If-None-Exist")
	if err != nil {
		return created{err: err}
	}
	var cond *patients.Identifier
	switch {
	case c != nil && c.ident != nil: // matched in the create's transaction, under a lock
		cond = c.ident
	case c != nil: // any other search: run as the search is, then the create
		if existing, err := h.match(r, t, c); err != nil || existing != nil {
			return matched(existing, err)
		}
	}
	doc, isNew, err := h.Patients.CreateResource(r.Context(), t, withoutServerElements(body), cond)
	if f := fault.As(err); f != nil && f.Kind == fault.KindConflict && cond != nil {
		err = &statusError{status: http.StatusPreconditionFailed, msg: f.Message, param: "If-None-Exist"}
	}
	if err != nil {
		return created{err: err}
	}
	status := http.StatusCreated
	if !isNew {
		status = http.StatusOK
	}
	id, version := idVersion(doc)
	return created{doc: doc, id: ids.FHIR(id), version: version, status: status}
}

// updateGeneric serves PUT [type]/{id} for the generic store: a new version, or the resource
// created under the client's id (201).
func (h handler) updateGeneric(w http.ResponseWriter, r *http.Request, t string) {
	body, id, want, ok := readUpdate(w, r, t)
	if !ok {
		return
	}
	doc, isNew, err := h.Patients.UpdateResource(r.Context(), t, id, body, want)
	if err != nil {
		writeErrorAt(w, r, versionError(t, err), t)
		return
	}
	status := http.StatusOK
	if isNew {
		status = http.StatusCreated
	}
	_, version := idVersion(doc)
	w.Header().Set("Location", baseURL(r)+"/"+t+"/"+ids.FHIR(id)+"/_history/"+version)
	if minimal(r, t) {
		w.Header().Set("ETag", `W/"`+version+`"`)
		writeMinimal(w, status)
		return
	}
	writeDoc(w, r, status, doc)
}

// removeGeneric serves DELETE [type]/{id} for the generic store: kept in the history, honouring
// If-Match; 409 while a stored resource refers to it.
func (h handler) removeGeneric(w http.ResponseWriter, r *http.Request, t string) {
	want, err := ifMatch(r.Header.Get("If-Match"))
	if err != nil {
		writeError(w, r, err)
		return
	}
	id := ids.FromFHIR(mux.Vars(r)["id"])
	d, err := h.Patients.DeleteResource(r.Context(), t, id, want)
	if err != nil {
		writeErrorAt(w, r, versionError(t, err), t)
		return
	}
	w.Header().Set("ETag", etag(strconv.Itoa(d.Version)))
	w.Header().Set("Last-Modified", d.At.UTC().Format(http.TimeFormat))
	msg := t + "/" + ids.FHIR(id) + " deleted: version " + strconv.Itoa(d.Version) + " of its history"
	if d.Already {
		msg = t + "/" + ids.FHIR(id) + " was already deleted (version " + strconv.Itoa(d.Version) + ")"
	}
	writeResource(w, http.StatusOK, Outcome{ResourceType: "OperationOutcome",
		Issue: []Issue{{Severity: "information", Code: "informational", Diagnostics: msg}}})
}

// genericEntry is the Bundle entry of a generic create or its refusal.
func genericEntry(r *http.Request, t string, res created) entry {
	if res.err != nil {
		return errorEntry(r, res.err, t)
	}
	status := "201 Created"
	if res.status == http.StatusOK {
		status = "200 OK"
	}
	e := entry{FullURL: baseURL(r) + "/" + t + "/" + res.id, Resource: res.doc, Response: &entryResponse{Status: status,
		Location: t + "/" + res.id + "/_history/" + res.version, Etag: `W/"` + res.version + `"`}}
	if minimal(r, t) {
		e.Resource = nil
	}
	return e
}

// servedTypes lists every type the base serves, typed first.
func servedTypes() []string {
	out := []string{"Patient", "Observation", "Encounter", "RiskAssessment"}
	for _, t := range patients.GenericTypes() {
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// searchIncludes are the _include values type t takes: its subject Patient, for patient data.
func searchIncludes(t string) []string {
	if t == "Patient" || !patients.PatientData(t) {
		return nil
	}
	return []string{t + ":patient", t + ":subject"}
}

// genericDocumentation is the CapabilityStatement's word on a type of the generic store.
func genericDocumentation(t string) string {
	doc := "Create assigns a new id whatever id the body carries; update creates the resource under the client's id when it does not exist. " +
		"Conditional create: If-None-Exist (or the POST's query string) with any search of the type; identifier=system|value is atomic. Every reference must name a resource of this organization " +
		"(a transaction resolves urn:uuid fullUrls and Type?identifier= conditional references). "
	if patients.PatientData(t) {
		doc += "Patient data: reads need read:patients, writes write:patients; test keys see only synthetic patients' data."
	} else {
		doc += "Not patient data: any credential of the organization reads it; writes need write:patients."
	}
	if t == "Encounter" {
		doc += " Encounters written by carehub's integrations are served beside those written here (version 1 only)."
	}
	return doc
}
