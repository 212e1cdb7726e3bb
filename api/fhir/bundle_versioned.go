package fhir

// PUT and DELETE Patient entries of a batch, with ifMatch (versioned writes in Bundles). A
// transaction's are refused by entryTarget: applying them would need the transaction's own
// Postgres transaction, and half of a transaction is never applied.

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"carehub/kernel/fault"
	"carehub/kernel/ids"
)

// batch serves a batch: its PUT Patient/{id} and DELETE Patient/{id} entries here, each on its
// own as PUT and DELETE on the base are (If-Match from request.ifMatch), the rest by process.
// Batch entries are independent (FHIR), so the answer keeps each entry's position.
func (h handler) batch(r *http.Request, entries []inEntry) ([]entry, error) {
	out := make([]entry, len(entries))
	var rest []inEntry
	var at []int
	for i, e := range entries {
		id, ok := versionedTarget(e)
		if !ok {
			rest, at = append(rest, e), append(at, i)
			continue
		}
		out[i] = h.versionedEntry(r, e, id)
	}
	rest, at = h.batchConditions(r, rest, at, out)
	if len(rest) == 0 {
		return out, nil
	}
	done, err := h.process(r, rest, false)
	if err != nil {
		return nil, err
	}
	for k, i := range at {
		out[i] = done[k]
	}
	return out, nil
}

// versionedTarget is the carehub patient id of a PUT or DELETE Patient/{id} entry.
func versionedTarget(e inEntry) (string, bool) {
	if e.Request == nil || e.Request.Method != http.MethodPut && e.Request.Method != http.MethodDelete {
		return "", false
	}
	url := strings.TrimPrefix(strings.TrimPrefix(e.Request.URL, Base+"/"), "/")
	id, ok := strings.CutPrefix(url, "Patient/")
	if !ok || id == "" || strings.ContainsAny(id, "/?") {
		return "", false // refused by entryTarget
	}
	return ids.FromFHIR(id), true
}

// versionedEntry applies one PUT or DELETE Patient entry and answers it as the batch-response
// entry FHIR gives: status, location, etag and lastModified, or the OperationOutcome.
func (h handler) versionedEntry(r *http.Request, e inEntry, id string) entry {
	want, err := ifMatch(e.Request.IfMatch)
	if err != nil {
		return errorEntry(r, err, "")
	}
	if e.Request.Method == http.MethodDelete {
		d, err := h.Patients.DeletePatient(r.Context(), id, want)
		if err != nil {
			return errorEntry(r, versionError("Patient", err), "Patient")
		}
		return entry{Response: &entryResponse{Status: "204 No Content", Etag: etag(strconv.Itoa(d.Version)),
			LastModified: d.At.UTC().Format(time.RFC3339Nano)}}
	}
	if len(e.Resource) == 0 {
		return errorEntry(r, fault.Validation("a PUT entry needs a resource", map[string]string{"resource": "is required: the Patient"}), "")
	}
	body, err := withCarehubID(e.Resource, id)
	if err == nil {
		body, err = h.Patients.UpdatePatientIfMatch(r.Context(), id, body, want)
	}
	if err != nil {
		return errorEntry(r, h.goneError(r, "Patient", id, versionError("Patient", err)), "Patient")
	}
	_, version := idVersion(body)
	out := entry{FullURL: baseURL(r) + "/Patient/" + ids.FHIR(id), Resource: body, Response: &entryResponse{Status: "200 OK",
		Location: "Patient/" + ids.FHIR(id) + "/_history/" + version, Etag: etag(version),
		LastModified: lastUpdated(body).UTC().Format(time.RFC3339Nano)}}
	if minimal(r, "Patient") {
		out.Resource = nil
	}
	return out
}
