package fhir

import (
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"carehub/api/envelope"
	"carehub/ingest/intake"
	"carehub/kernel/fault"
)

// Issue is one OperationOutcome.issue.
type Issue struct {
	Severity    string           `json:"severity"`
	Code        string           `json:"code"`
	Details     *CodeableConcept `json:"details,omitempty"`
	Diagnostics string           `json:"diagnostics,omitempty"`
	Expression  []string         `json:"expression,omitempty"`
}

// CodeableConcept carries carehub's error code (the REST envelope's error.code) on an issue, so
// a FHIR client can act on the same codes as a REST client.
type CodeableConcept struct {
	Coding []Coding `json:"coding"`
}

// Coding is one code of a CodeableConcept.
type Coding struct {
	System string `json:"system"`
	Code   string `json:"code"`
}

// ErrorCodeSystem names carehub's error codes (documented at /docs/errors).
const ErrorCodeSystem = "urn:carehub:error-code"

// Outcome is an OperationOutcome.
type Outcome struct {
	ResourceType string  `json:"resourceType"`
	Issue        []Issue `json:"issue"`
}

// issueCodes maps an HTTP status onto FHIR's issue-type value set.
var issueCodes = map[int]string{
	http.StatusBadRequest: "invalid", http.StatusUnauthorized: "login", http.StatusForbidden: "forbidden",
	http.StatusNotFound: "not-found", http.StatusMethodNotAllowed: "not-supported", http.StatusNotAcceptable: "not-supported",
	http.StatusConflict: "conflict", http.StatusPreconditionFailed: "multiple-matches", http.StatusRequestEntityTooLarge: "too-costly",
	http.StatusUnsupportedMediaType: "not-supported", http.StatusUnprocessableEntity: "processing",
	http.StatusTooManyRequests: "throttled", http.StatusServiceUnavailable: "transient",
}

// outcomeOf is the status and OperationOutcome of err; resource prefixes the element paths
// (Patient, Observation, Bundle.entry[2].resource).
func outcomeOf(r *http.Request, err error, resource string) (int, Outcome) {
	if te, ok := err.(*transactionError); ok {
		code := issueCodes[te.status]
		issues := []Issue{{Severity: "error", Code: code, Diagnostics: te.Error()}}
		for _, f := range slices.Sorted(maps.Keys(te.fields)) {
			issues = append(issues, Issue{Severity: "error", Code: code, Diagnostics: te.fields[f], Expression: []string{f}})
		}
		return te.status, Outcome{ResourceType: "OperationOutcome", Issue: issues}
	}
	if e, ok := err.(*statusError); ok {
		is := Issue{Severity: "error", Code: issueCodes[e.status], Diagnostics: e.msg}
		if e.code != "" {
			is.Code = e.code
		}
		if e.param != "" {
			is.Expression = []string{e.param}
		}
		return e.status, Outcome{ResourceType: "OperationOutcome", Issue: []Issue{is}}
	}
	status, obj := envelope.NewErrorObject(r, err)
	code := issueCodes[status]
	if code == "" {
		code = "exception"
	}
	var issues []Issue
	if fields, ok := obj.Details["fields"].(map[string]any); ok {
		for _, f := range slices.Sorted(maps.Keys(fields)) {
			issues = append(issues, Issue{Severity: "error", Code: code, Diagnostics: fmt.Sprint(fields[f]), Expression: []string{path(resource, f)}})
		}
	}
	if rejected, ok := obj.Details["rejected"].([]intake.EntryError); ok {
		for _, e := range rejected {
			at := resource
			if resource == "Bundle" {
				at = fmt.Sprintf("Bundle.entry[%d].resource", e.Index)
			}
			issues = append(issues, Issue{Severity: "error", Code: code, Diagnostics: e.Message,
				Expression: []string{path(at, entryElement(e))}})
		}
	}
	head := Issue{Severity: "error", Code: code, Diagnostics: obj.Message,
		Details: &CodeableConcept{Coding: []Coding{{System: ErrorCodeSystem, Code: obj.Code}}}}
	if status == http.StatusNotFound && resource != "" {
		head.Expression = nil
	}
	if len(issues) == 0 || issues[0].Diagnostics != obj.Message {
		issues = append([]Issue{head}, issues...)
	} else {
		issues[0].Details = head.Details
	}
	if status >= 500 {
		envelope.LoggerFrom(r.Context()).Error("request failed", "status", status, "err", err)
	}
	return status, Outcome{ResourceType: "OperationOutcome", Issue: issues}
}

// statusError is an error answered with a status the fault kinds do not have (406, 410, 412).
type statusError struct {
	status int
	msg    string
	param  string
	code   string // the issue code, when not the status's (412 of a stale version: conflict)
}

func (e *statusError) Error() string { return e.msg }

// writeError answers err as an OperationOutcome.
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	writeErrorAt(w, r, err, "")
}

func writeErrorAt(w http.ResponseWriter, r *http.Request, err error, resource string) {
	status, oo := outcomeOf(r, err, resource)
	setRetryAfter(w, status, err)
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="carehub"`)
	}
	writeResource(w, status, oo)
}

// WriteError is the authentication middleware's error writer for the FHIR routes: 401, 403 and
// 429 as OperationOutcomes.
func WriteError(w http.ResponseWriter, r *http.Request, err error) { writeError(w, r, err) }

// Serves reports whether r is addressed to the FHIR base, where every answer is FHIR: the node's
// router answers its own refusals there (no route, another method, a malformed query string, a
// panic) with WriteError and WriteNoRoute, not in the REST envelope.
func Serves(r *http.Request) bool {
	return r.URL.Path == Base || strings.HasPrefix(r.URL.Path, Base+"/")
}

// WriteNoRoute answers a request under the base that no route serves: 405 with an Allow header
// when its path is served with other methods (allowed), else 404.
func WriteNoRoute(w http.ResponseWriter, r *http.Request, allowed []string) {
	if len(allowed) == 0 {
		writeError(w, r, noRoute(r.URL.Path))
		return
	}
	list := strings.Join(allowed, ", ")
	w.Header().Set("Allow", list)
	msg := r.Method + " is not supported on this path; allowed: " + list + " (" + Base + "/metadata lists the interactions served)"
	if strings.TrimSuffix(r.URL.Path, "/") == Base {
		msg = r.Method + " [base] is not a FHIR interaction: POST a batch or transaction Bundle to the base, or GET " +
			Base + "/metadata for the CapabilityStatement"
	}
	writeError(w, r, &statusError{status: http.StatusMethodNotAllowed, msg: msg})
}

// noRoute is the 404 of a path under the base that nothing serves, worded as the router's
// ("no such route") so that both APIs read alike.
func noRoute(path string) error {
	if strings.Contains(path[strings.LastIndex(path, "/")+1:], "$") {
		return fault.New(fault.KindNotFound, "no such route: FHIR operations other than Patient/{id}/$everything ($validate, $export, …) are not served here (%s/metadata lists what is)", Base)
	}
	return fault.New(fault.KindNotFound, "no such route under %s (%[1]s/metadata lists what is served)", Base)
}

// elementPath is the start of an intake message that names an element
// (component[1].valueQuantity.code, effectivePeriod, subject.reference …).
var elementPath = regexp.MustCompile(`^([a-z][A-Za-z]*(\[\d+\])?)(\.[a-z][A-Za-z]*(\[\d+\])?)*`)

// entryCodeElements names the element of an intake error whose message does not start with one.
var entryCodeElements = map[string]string{
	intake.CodeInvalidSubject: "subject", intake.CodeUnknownPatient: "subject", intake.CodeMissingCode: "code",
	intake.CodeInvalidStatus: "status", intake.CodeInvalidEffective: "effective", intake.CodeInvalidValue: "value",
	intake.CodeInvalidID: "id",
}

// entryElement is the element an intake entry error is about ("" for the whole resource).
func entryElement(e intake.EntryError) string {
	if m := elementPath.FindString(e.Message); m != "" && m != "the" && m != "a" && m != "only" && m != "patient" && m != "malformed" {
		return m
	}
	return entryCodeElements[e.Code]
}

func path(resource, element string) string {
	switch {
	case resource == "":
		return element
	case element == "":
		return resource
	}
	return resource + "." + element
}
