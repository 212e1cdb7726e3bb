package fhir

// FHIR Bulk Data Access v2 (https://hl7.org/fhir/uv/bulkdata/): the asynchronous kick-off at the
// system, Patient and Group levels, status polling, the completion manifest, the files, and
// cancellation. processors/patients (bulk.go, bulk_runner.go) keeps the jobs and writes the files.

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"carehub/api/envelope"
	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/processors/patients"
)

// mediaNDJSON is the media type of an export's files.
const mediaNDJSON = "application/fhir+ndjson"

// outputFormats are what _outputFormat takes: the spec's NDJSON, by any of its names.
var outputFormats = []string{"application/fhir+ndjson", "application/ndjson", "ndjson"}

// mountBulk mounts the Bulk Data routes on authed; Mount calls it before the resource routes,
// which would otherwise take Patient/$export as a read. Every one needs read:patients, checked
// before anything of the request is: a credential without it learns nothing of the parameters
// or of an export's existence.
func (h handler) mountBulk(authed *mux.Router) {
	authed.HandleFunc(Base+"/$export", readingPatients(h.kickOff(patients.ExportSystem))).Methods(http.MethodGet, http.MethodPost)
	authed.HandleFunc(Base+"/Patient/$export", readingPatients(h.kickOff(patients.ExportPatient))).Methods(http.MethodGet, http.MethodPost)
	authed.HandleFunc(Base+"/Group/{id}/$export", readingPatients(h.kickOff(patients.ExportGroup))).Methods(http.MethodGet, http.MethodPost)
	authed.HandleFunc(Base+"/$export-status/{id}", readingPatients(h.exportStatus)).Methods(http.MethodGet)
	authed.HandleFunc(Base+"/$export-status/{id}", readingPatients(h.cancelExport)).Methods(http.MethodDelete)
	authed.HandleFunc(Base+"/$export-file/{id}/{file}", readingPatients(h.exportFile)).Methods(http.MethodGet)
}

// readingPatients answers 403 to a credential without read:patients before next runs.
func readingPatients(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, err := access.Require(r.Context(), access.ReadPatients); err != nil {
			writeError(w, r, err)
			return
		}
		next(w, r)
	}
}

// kickOff starts an export of level: 202 with the status URL in Content-Location.
func (h handler) kickOff(level string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		err := checkFormat(r)
		if err != nil {
			writeError(w, r, err)
			return
		}
		if !preferAsync(r) {
			writeError(w, r, &statusError{status: http.StatusBadRequest, msg: "a Bulk Data export runs asynchronously: " +
				"send Prefer: respond-async"})
			return
		}
		params := r.URL.Query()
		if r.Method == http.MethodPost {
			params, err = postedParameters(w, r)
			if err != nil {
				writeError(w, r, err)
				return
			}
		} else if params.Has("patient") {
			writeError(w, r, badParam("patient", "is a parameter of the POST kick-off (a Parameters resource), not of GET"))
			return
		}
		req, ignored, err := exportRequest(r, params, level)
		if err != nil {
			writeError(w, r, err)
			return
		}
		id, err := h.Patients.StartExport(r.Context(), req)
		if err != nil {
			writeError(w, r, err)
			return
		}
		w.Header().Set("Content-Location", baseURL(r)+"/$export-status/"+ids.FHIR(id))
		oo := Outcome{ResourceType: "OperationOutcome", Issue: []Issue{{Severity: "information", Code: "informational",
			Diagnostics: "export " + ids.FHIR(id) + " started: poll the Content-Location for its progress and, once complete, its manifest"}}}
		if len(ignored) > 0 {
			oo.Issue = append(oo.Issue, Issue{Severity: "warning", Code: "not-supported", Expression: ignored,
				Diagnostics: "parameters ignored (Prefer: handling=lenient): " + strings.Join(ignored, ", ")})
		}
		writeResource(w, http.StatusAccepted, oo)
	}
}

// preferAsync reports whether the Prefer header asks for respond-async.
func preferAsync(r *http.Request) bool {
	for _, v := range r.Header.Values("Prefer") {
		for _, part := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(part), "respond-async") {
				return true
			}
		}
	}
	return false
}

// kickOffBodyLimit bounds a POST kick-off's Parameters resource.
const kickOffBodyLimit = 1 << 20

// postedParameters reads a POST kick-off's Parameters resource into the names and values a GET
// kick-off has in its query: _outputFormat, _since, _type and _typeFilter as strings, and each
// patient as its reference. The query may hold _format only.
func postedParameters(w http.ResponseWriter, r *http.Request) (url.Values, error) {
	for name := range r.URL.Query() {
		if name != "_format" {
			return nil, badParam(name, "a POST kick-off takes its parameters in its Parameters body, not in the URL")
		}
	}
	body, err := readBody(w, r, kickOffBodyLimit)
	if err != nil {
		return nil, err
	}
	var doc struct {
		ResourceType string `json:"resourceType"`
		Parameter    []struct {
			Name           string  `json:"name"`
			ValueString    *string `json:"valueString"`
			ValueInstant   *string `json:"valueInstant"`
			ValueDateTime  *string `json:"valueDateTime"`
			ValueCode      *string `json:"valueCode"`
			ValueReference *struct {
				Reference string `json:"reference"`
			} `json:"valueReference"`
		} `json:"parameter"`
	}
	if err := json.Unmarshal(body, &doc); err != nil || doc.ResourceType != "Parameters" {
		return nil, fault.Invalid("a POST kick-off's body is a FHIR Parameters resource (resourceType Parameters)")
	}
	v := url.Values{}
	for i, p := range doc.Parameter {
		var value *string
		switch p.Name {
		case "patient":
			if p.ValueReference != nil {
				value = &p.ValueReference.Reference
			}
		case "_since":
			value = cmp.Or(p.ValueInstant, p.ValueDateTime, p.ValueString)
		default:
			value = cmp.Or(p.ValueString, p.ValueCode)
		}
		if value == nil {
			return nil, fault.Invalid("parameter[%d] (%s) has no value of the type $export takes for it "+
				"(patient: valueReference; _since: valueInstant; the others: valueString)", i, p.Name)
		}
		v.Add(p.Name, *value)
	}
	return v, nil
}

// exportRequest reads a kick-off's parameters, v: _outputFormat, _since, _type, _typeFilter and
// (from a POST) patient. Another parameter (the IG's includeAssociatedData, _elements, …) is
// refused, or with Prefer: handling=lenient ignored and named in ignored, as the IG allows.
func exportRequest(r *http.Request, v url.Values, level string) (req patients.ExportRequest, ignored []string, err error) {
	req = patients.ExportRequest{Level: level, GroupID: ids.FromFHIR(mux.Vars(r)["id"]), Request: selfURL(r)}
	lenient := envelope.Prefers(r, "handling", "lenient")
	for _, name := range slices.Sorted(maps.Keys(v)) {
		switch name {
		case "_outputFormat", "_since", "_format":
			if len(v[name]) > 1 {
				return req, nil, badParam(name, "may be given once")
			}
		case "_type", "_typeFilter", "patient":
		default:
			if !lenient {
				return req, nil, badParam(name, "not a parameter of $export (supported: _outputFormat, _since, _type, _typeFilter, patient); "+
					"send Prefer: handling=lenient to have it ignored")
			}
			ignored = append(ignored, name)
			delete(v, name)
		}
	}
	for _, ref := range v["patient"] {
		id, ok := strings.CutPrefix(ref, "Patient/")
		if !ok || id == "" || strings.Contains(id, "/") {
			return req, nil, badParam("patient", "%q is not a Patient reference (Patient/<id>)", ref)
		}
		req.Patients = append(req.Patients, ids.FromFHIR(id))
	}
	if f := v.Get("_outputFormat"); f != "" && !slices.Contains(outputFormats, f) {
		return req, nil, badParam("_outputFormat", "%q is not served: NDJSON only (%s)", f, strings.Join(outputFormats, ", "))
	}
	if s := v.Get("_since"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return req, nil, badParam("_since", "%q is not a FHIR instant (e.g. 2026-01-02T03:04:05Z)", s)
		}
		req.Since = &t
	}
	for _, list := range v["_type"] {
		for _, t := range strings.Split(list, ",") {
			if t = strings.TrimSpace(t); t != "" {
				req.Types = append(req.Types, t)
			}
		}
	}
	for _, f := range v["_typeFilter"] {
		t, query, _ := strings.Cut(f, "?")
		if !served(t) {
			return req, nil, badParam("_typeFilter", "%q: %s is not a resource type served here", f, t)
		}
		if len(req.Types) > 0 && !slices.Contains(req.Types, t) {
			return req, nil, badParam("_typeFilter", "%q: %s is not among _type", f, t)
		}
		if _, dup := req.Filters[t]; dup {
			return req, nil, badParam("_typeFilter", "one filter per type is supported; %s has more", t)
		}
		values, err := url.ParseQuery(query)
		if err != nil {
			return req, nil, badParam("_typeFilter", "%q: %v", f, err)
		}
		q, err := parseSearch(t, values, false)
		if err != nil {
			return req, nil, badParam("_typeFilter", "%q: %v", f, err)
		}
		if q.include || len(q.revinclude) > 0 || len(q.chains) > 0 || q.summary != "" || len(q.elements) > 0 || len(q.search.Sort) > 0 ||
			len(q.search.Has) > 0 || values.Has("_count") || values.Has("_offset") {
			return req, nil, badParam("_typeFilter", "%q: a filter takes search parameters only (no _include, _revinclude, chains, _has, "+
				"_summary, _elements, _sort, _count or _offset)", f)
		}
		if req.Filters == nil {
			req.Filters = map[string]patients.Search{}
		}
		req.Filters[t] = q.search
	}
	return req, ignored, nil
}

// selfURL is the request's URL as the client sent it, for the manifest's request.
func selfURL(r *http.Request) string {
	u := baseURL(r) + strings.TrimPrefix(r.URL.Path, Base)
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	return u
}

// manifest is a completed export's answer.
type manifest struct {
	TransactionTime     string           `json:"transactionTime"`
	Request             string           `json:"request"`
	RequiresAccessToken bool             `json:"requiresAccessToken"`
	Output              []manifestOutput `json:"output"`
	Deleted             []manifestOutput `json:"deleted"`
	Error               []manifestOutput `json:"error"`
}

type manifestOutput struct {
	Type  string `json:"type"`
	URL   string `json:"url"`
	Count int    `json:"count,omitempty"`
}

// exportStatus answers a status poll: 202 with X-Progress while in progress, the manifest once
// complete, the failure as an OperationOutcome.
func (h handler) exportStatus(w http.ResponseWriter, r *http.Request) {
	id := ids.FromFHIR(mux.Vars(r)["id"])
	e, err := h.Patients.ExportStatus(r.Context(), id)
	if err != nil {
		writeError(w, r, err)
		return
	}
	switch e.Status {
	case patients.ExportInProgress:
		w.Header().Set("X-Progress", fmt.Sprintf("%d of %d resource types written, %d resources", e.Done, len(e.Types), e.Written))
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusAccepted)
		return
	case patients.ExportFailed:
		writeResource(w, http.StatusInternalServerError, Outcome{ResourceType: "OperationOutcome",
			Issue: []Issue{{Severity: "error", Code: "exception", Diagnostics: "export failed: " + e.Error}}})
		return
	}
	files := baseURL(r) + "/$export-file/" + ids.FHIR(id) + "/"
	m := manifest{TransactionTime: e.TransactionTime.UTC().Format(time.RFC3339Nano), Request: e.Request, RequiresAccessToken: true,
		Output: []manifestOutput{}, Deleted: []manifestOutput{}, Error: []manifestOutput{}}
	for _, f := range e.Files {
		out := manifestOutput{Type: f.Type, URL: files + f.Type + "." + strconv.Itoa(f.Part) + ".ndjson", Count: f.Count}
		if f.Type == patients.DeletedFile {
			out.Type = "Bundle"
			m.Deleted = append(m.Deleted, out)
			continue
		}
		m.Output = append(m.Output, out)
	}
	if len(e.Omitted) > 0 {
		m.Error = append(m.Error, manifestOutput{Type: "OperationOutcome", URL: files + "OperationOutcome.1.ndjson"})
	}
	if e.ExpiresAt != nil {
		w.Header().Set("Expires", e.ExpiresAt.UTC().Format(http.TimeFormat))
	}
	writeResource(w, http.StatusOK, m)
}

// cancelExport cancels an export in progress, or deletes a completed one's files: 202.
func (h handler) cancelExport(w http.ResponseWriter, r *http.Request) {
	id := ids.FromFHIR(mux.Vars(r)["id"])
	if err := h.Patients.CancelExport(r.Context(), id); err != nil {
		writeError(w, r, err)
		return
	}
	writeResource(w, http.StatusAccepted, Outcome{ResourceType: "OperationOutcome",
		Issue: []Issue{{Severity: "information", Code: "informational", Diagnostics: "export " + ids.FHIR(id) + " cancelled; its files are deleted"}}})
}

// exportFile serves one file of a completed export to its requester: Type.part.ndjson, each
// resource in the base's id form; the error file names the types the credential could not read.
func (h handler) exportFile(w http.ResponseWriter, r *http.Request) {
	id := ids.FromFHIR(mux.Vars(r)["id"])
	name := mux.Vars(r)["file"]
	t, rest, _ := strings.Cut(name, ".")
	partText, ext, _ := strings.Cut(rest, ".")
	part, err := strconv.Atoi(partText)
	if err != nil || ext != "ndjson" || part < 1 {
		writeError(w, r, &statusError{status: http.StatusNotFound, msg: "no export file " + strconv.Quote(name) + " (files are Type.N.ndjson)"})
		return
	}
	var out []byte
	if t == "OperationOutcome" {
		out, err = h.omittedOutcome(r, id)
	} else {
		out, err = h.Patients.ExportFileData(r.Context(), id, t, part)
	}
	if err != nil {
		writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", mediaNDJSON)
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

// omittedOutcome is the error file of export id: one OperationOutcome naming the types left out.
func (h handler) omittedOutcome(r *http.Request, id string) ([]byte, error) {
	e, err := h.Patients.ExportStatus(r.Context(), id)
	if err != nil {
		return nil, err
	}
	if e.Status != patients.ExportCompleted || len(e.Omitted) == 0 {
		return nil, &statusError{status: http.StatusNotFound, msg: "export " + ids.FHIR(id) + " has no error file"}
	}
	b, err := json.Marshal(Outcome{ResourceType: "OperationOutcome", Issue: []Issue{{Severity: "warning", Code: "forbidden",
		Diagnostics: strings.Join(e.Omitted, ", ") + " not exported: the credential lacks read:observations"}}})
	return append(b, '\n'), err
}
