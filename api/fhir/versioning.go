package fhir

// Versioned writes and conditional reads (FHIR R4 http.html#concurrency, #cread): ETag and
// Last-Modified on every resource answered, If-Match on update and delete (412 on a stale
// version), If-None-Match and If-Modified-Since on read (304), DELETE of a Patient, and 410 Gone
// for a deleted one.

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/processors/patients"
)

// lastUpdated reads meta.lastUpdated of a resource (zero when it has none).
func lastUpdated(doc json.RawMessage) time.Time {
	var head struct {
		Meta struct {
			LastUpdated time.Time `json:"lastUpdated"`
		} `json:"meta"`
	}
	_ = json.Unmarshal(doc, &head)
	return head.Meta.LastUpdated
}

// setValidators sets the ETag (W/"versionId") and Last-Modified (meta.lastUpdated, RFC 1123) of
// a resource answered.
func setValidators(w http.ResponseWriter, doc json.RawMessage) {
	_, v := idVersion(doc)
	w.Header().Set("ETag", etag(v))
	if t := lastUpdated(doc); !t.IsZero() {
		w.Header().Set("Last-Modified", t.UTC().Format(http.TimeFormat))
	}
}

func etag(version string) string { return `W/"` + version + `"` }

// notModified answers 304 when the client's copy is current (FHIR conditional read):
// If-None-Match naming the version, or, without If-None-Match, If-Modified-Since not before
// the last update (to the second, the header's precision). It reports whether it answered.
func notModified(w http.ResponseWriter, r *http.Request, doc json.RawMessage) bool {
	_, v := idVersion(doc)
	current := false
	if inm := r.Header.Get("If-None-Match"); inm != "" {
		for _, tag := range strings.Split(inm, ",") {
			tag = strings.TrimSpace(tag)
			current = current || tag == "*" || strings.TrimPrefix(tag, "W/") == `"`+v+`"`
		}
	} else if ims, err := http.ParseTime(r.Header.Get("If-Modified-Since")); err == nil {
		t := lastUpdated(doc)
		current = !t.IsZero() && !t.Truncate(time.Second).After(ims)
	}
	if !current {
		return false
	}
	setValidators(w, doc)
	w.WriteHeader(http.StatusNotModified)
	return true
}

// ifMatch parses If-Match (W/"3", "3"): the version a write requires, 0 when there is none or
// it is "*".
func ifMatch(value string) (int, error) {
	value = strings.TrimSpace(value)
	if value == "" || value == "*" {
		return 0, nil
	}
	v, err := strconv.Atoi(strings.Trim(strings.TrimPrefix(value, "W/"), `"`))
	if err != nil || v < 1 {
		return 0, &statusError{status: http.StatusBadRequest, param: "If-Match",
			msg: `If-Match must name a version as the ETag does (W/"3"), not ` + strconv.Quote(value)}
	}
	return v, nil
}

// versionError maps a stale If-Match on a resource of type t to 412 (issue code conflict);
// other errors pass.
func versionError(t string, err error) error {
	vc, ok := errors.AsType[*patients.VersionConflict](err)
	if !ok {
		return err
	}
	current := strconv.Itoa(vc.Current)
	if vc.Current == 0 {
		current += " (it does not exist)"
	}
	return &statusError{status: http.StatusPreconditionFailed, code: "conflict", param: "If-Match",
		msg: "version conflict: " + t + "/" + ids.FHIR(vc.ID) + " is at version " + current + ", not " +
			strconv.Itoa(vc.Expected) + ": nothing was written; read it again and apply the change to the current version"}
}

// goneError turns the NotFound of a Patient that was deleted into 410 Gone (FHIR: a read of a
// deleted resource); other errors pass.
func (h handler) goneError(r *http.Request, t, id string, err error) error {
	if t != "Patient" || fault.KindOf(err) != fault.KindNotFound {
		return err
	}
	d, derr := h.Patients.PatientDeleted(r.Context(), id)
	if derr != nil {
		return err
	}
	return &statusError{status: http.StatusGone, code: "deleted",
		msg: "Patient/" + ids.FHIR(id) + " was deleted (version " + strconv.Itoa(d.Version) + ", " +
			d.At.UTC().Format(time.RFC3339) + "); its history is at " + Base + "/Patient/" + ids.FHIR(id) + "/_history"}
}

// remove serves DELETE [type]/{id}: a Patient is deleted (a new version in its history, reads
// then 410), with If-Match honoured; a patient that clinical data refers to is 409. Other types
// are not deleted here (405). Deleting a deleted patient again answers as the first time did.
func (h handler) remove(w http.ResponseWriter, r *http.Request) {
	t, ok := route(w, r)
	if !ok {
		return
	}
	if generic(t) {
		h.removeGeneric(w, r, t) // resources.go
		return
	}
	if t != "Patient" {
		w.Header().Set("Allow", "GET")
		writeError(w, r, &statusError{status: http.StatusMethodNotAllowed,
			msg: t + " is not deleted here: only Patient is (see " + Base + "/metadata)"})
		return
	}
	want, err := ifMatch(r.Header.Get("If-Match"))
	if err != nil {
		writeError(w, r, err)
		return
	}
	id := ids.FromFHIR(mux.Vars(r)["id"])
	d, err := h.Patients.DeletePatient(r.Context(), id, want)
	if err != nil {
		writeErrorAt(w, r, versionError(t, err), t)
		return
	}
	w.Header().Set("ETag", etag(strconv.Itoa(d.Version)))
	w.Header().Set("Last-Modified", d.At.UTC().Format(http.TimeFormat))
	msg := "Patient/" + ids.FHIR(id) + " deleted: version " + strconv.Itoa(d.Version) + " of its history"
	if d.Already {
		msg = "Patient/" + ids.FHIR(id) + " was already deleted (version " + strconv.Itoa(d.Version) + ")"
	}
	writeResource(w, http.StatusOK, Outcome{ResourceType: "OperationOutcome",
		Issue: []Issue{{Severity: "information", Code: "informational", Diagnostics: msg}}})
}
