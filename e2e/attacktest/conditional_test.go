package attacktest

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/kernel/ids"
	"carehub/storage/demo"
)

// Finding 6 of issue 51: a FHIR conditional create that matches answers with the existing
// patient, and an update with the patient as stored, so a write:patients key without
// read:patients read real patients by guessing their MRNs. Such a key must get the outcome
// (status, Location, ETag) and no Patient: on create, in a batch entry, and on update.
func TestConditionalCreateAnswersOnlyWhatTheKeyReads(t *testing.T) {
	s := servertest.Start(t)
	var system, mrn, family string
	if err := s.Pool().QueryRow(context.Background(), `select resource->'identifier'->0->>'system', resource->'identifier'->0->>'value',
	resource->'name'->0->>'family' from patients where id = $1`, demo.RealPatientID).Scan(&system, &mrn, &family); err != nil {
		t.Fatal(err)
	}
	writer := s.Key(demo.DemoOrgSlug, access.Live, access.WritePatients)
	reader := s.Key(demo.DemoOrgSlug, access.Live, access.WritePatients, access.ReadPatients)
	probe := map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Probe", "given": []string{"Ann"}}},
		"identifier": []any{map[string]any{"system": system, "value": mrn}}}
	fhirJSON := http.Header{"Content-Type": {"application/fhir+json"}}
	cond := fhirJSON.Clone()
	cond.Set("If-None-Exist", "identifier="+system+"|"+mrn)
	body, _ := json.Marshal(probe)

	// noPatient fails when an answer to writer carries the real patient's data.
	noPatient := func(t *testing.T, what string, r *servertest.Response) {
		t.Helper()
		if strings.Contains(string(r.Body), family) || strings.Contains(string(r.Body), `"resourceType":"Patient"`) {
			t.Fatalf("%s answered a write:patients key with a Patient: %d %s", what, r.Status, r.Body)
		}
	}

	t.Run("If-None-Exist on POST Patient", func(t *testing.T) {
		r := attackSend(t, s, http.MethodPost, "/fhir/R4/Patient", writer, cond, body)
		if r.Status != http.StatusOK || !strings.Contains(r.Header.Get("Location"), "/Patient/") || r.Header.Get("ETag") == "" {
			t.Fatalf("conditional create of an existing MRN: %d %v %s, want 200 with Location and ETag", r.Status, r.Header, r.Body)
		}
		noPatient(t, "conditional create", r)
		// A key that reads patients still gets the match.
		if r := attackSend(t, s, http.MethodPost, "/fhir/R4/Patient", reader, cond, body); r.Status != http.StatusOK || !strings.Contains(string(r.Body), family) {
			t.Fatalf("conditional create with read:patients: %d %s, want the match", r.Status, r.Body)
		}
	})

	t.Run("ifNoneExist in a batch entry", func(t *testing.T) {
		bundle, _ := json.Marshal(map[string]any{"resourceType": "Bundle", "type": "batch", "entry": []any{map[string]any{
			"resource": probe,
			"request":  map[string]any{"method": "POST", "url": "Patient", "ifNoneExist": "identifier=" + system + "|" + mrn},
		}}})
		r := attackSend(t, s, http.MethodPost, "/fhir/R4", writer, fhirJSON, bundle)
		if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"status":"200 OK"`) {
			t.Fatalf("batch with ifNoneExist: %d %s, want a 200 OK entry", r.Status, r.Body)
		}
		noPatient(t, "batch entry", r)
	})

	t.Run("PUT Patient", func(t *testing.T) {
		fhirID := ids.FHIR(demo.RealPatientID)
		r := s.Do(http.MethodGet, "/fhir/R4/Patient/"+fhirID, reader, nil)
		var doc map[string]any
		r.JSON(t, &doc)
		if r.Status != http.StatusOK {
			t.Fatalf("read: %d %s", r.Status, r.Body)
		}
		put, _ := json.Marshal(map[string]any{"resourceType": "Patient", "id": fhirID, "name": []any{map[string]any{"family": family}},
			"identifier": doc["identifier"]})
		r = attackSend(t, s, http.MethodPut, "/fhir/R4/Patient/"+fhirID, writer, fhirJSON, put)
		if r.Status != http.StatusOK || r.Header.Get("ETag") == "" {
			t.Fatalf("update: %d %s, want 200 with an ETag", r.Status, r.Body)
		}
		// The body sent names the family, so only the resource itself tells.
		if strings.Contains(string(r.Body), `"resourceType":"Patient"`) {
			t.Fatalf("update answered a write:patients key with the stored Patient: %s", r.Body)
		}
	})
}
