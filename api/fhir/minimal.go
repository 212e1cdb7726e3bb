package fhir

import (
	"net/http"
	"strconv"

	"carehub/api/envelope"
	"carehub/kernel/access"
	"carehub/processors/patients"
)

// readScopes are the scopes that reading a written resource back needs, per type. A Patient
// write answers with the stored patient (a conditional create that matched answers with the
// existing one, an update with what it kept: risk level, programs, versions), not with what
// the client sent, so without read:patients the answer would be a read the key may not make.
// An Observation's answer is the client's own body with the id intake gave it.
var readScopes = map[string][]string{"Patient": {access.ReadPatients}}

// minimal reports whether a write of a t answers without its resource (FHIR's
// Prefer: return=minimal): when the client asks for it, and always when the credential lacks
// the scopes that reading the resource needs. The Location and ETag headers (a Bundle entry's
// response.location and etag) still name the resource and its version.
func minimal(r *http.Request, t string) bool {
	if envelope.Prefers(r, "return", "minimal") {
		return true
	}
	p := access.From(r.Context())
	scopes := readScopes[t]
	if generic(t) && patients.PatientData(t) { // the generic store's patient data, as its reads
		scopes = []string{access.ReadPatients}
	}
	for _, s := range scopes {
		if p == nil || !p.Has(s) {
			return true
		}
	}
	return false
}

// writeMinimal answers a write without a body.
func writeMinimal(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Length", strconv.Itoa(0))
	w.WriteHeader(status)
}
