package fhir_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"carehub/e2e/servertest"
)

// TestClientCompat drives the base as FHIR client libraries (fhirpy, fhirclient,
// fhir-kit-client) and published examples do (issue 52): a create's body id never decides what
// is stored, Bundles are posted to the base with a trailing slash, every error under the base is
// an OperationOutcome, and POST [type]/_search searches.
func TestClientCompat(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	run := fmt.Sprint(time.Now().UnixNano())
	pa, pb := createPatient(t, s, key, "CompatA"+run), createPatient(t, s, key, "CompatB"+run)

	t.Run("the same body id for two patients is two stored observations", func(t *testing.T) {
		// The same body twice for the first patient too: FHIR's create is a new resource each
		// time (a retry that must not be is what Idempotency-Key is for).
		first := heartRate(pa, 72, "heart-rate")
		var got []string
		for _, o := range []map[string]any{first, heartRate(pb, 95, "heart-rate"), first} {
			r := s.Do(http.MethodPost, "/fhir/R4/Observation", key, o)
			var doc map[string]any
			r.JSON(t, &doc)
			id, _ := doc["id"].(string)
			meta, _ := doc["meta"].(map[string]any)
			if r.Status != http.StatusCreated || !strings.HasPrefix(id, "obs-") || meta["versionId"] != "1" || slices.Contains(got, id) ||
				!strings.HasSuffix(r.Header.Get("Location"), "/fhir/R4/Observation/"+id+"/_history/1") {
				t.Fatalf("create %d (ids so far %v): %d %s %s", len(got), got, r.Status, r.Header, r.Body)
			}
			got = append(got, id)
		}
		wantStored(t, s, key, got[0], pa, 72)
		wantStored(t, s, key, got[1], pb, 95)
		wantStored(t, s, key, got[2], pa, 72)
		if r := s.Do(http.MethodGet, "/fhir/R4/Observation/heart-rate", key, nil); r.Status != http.StatusNotFound {
			t.Fatalf("the body's id named a stored observation: %d %s", r.Status, r.Body)
		}
	})

	t.Run("an Idempotency-Key retry is stored once", func(t *testing.T) {
		pc := createPatient(t, s, key, "CompatC"+run)
		body := string(mustJSON(t, heartRate(pc, 88, "")))
		idem := http.Header{"Content-Type": {"application/fhir+json"}, "Idempotency-Key": {"compat-" + run}}
		first := send(t, s, http.MethodPost, "/fhir/R4/Observation", key, idem, body)
		again := send(t, s, http.MethodPost, "/fhir/R4/Observation", key, idem, body)
		loc := first.Header.Get("Location")
		if first.Status != http.StatusCreated || again.Status != http.StatusCreated || loc == "" || again.Header.Get("Location") != loc {
			t.Fatalf("retry: %d %s then %d %s", first.Status, loc, again.Status, again.Header.Get("Location"))
		}
		wantStored(t, s, key, locationID(loc), pc, 88)
		var b searchset
		s.Do(http.MethodGet, "/fhir/R4/Observation?patient="+pc, key, nil).JSON(t, &b)
		if b.Total != 1 {
			t.Fatalf("a retried create stored %d observations", b.Total)
		}
		other := send(t, s, http.MethodPost, "/fhir/R4/Observation", key, idem, string(mustJSON(t, heartRate(pc, 89, ""))))
		wantOutcome(t, other, http.StatusConflict)
	})

	t.Run("a batch posted to the base with a trailing slash", func(t *testing.T) {
		entry := func(patient string, value float64) map[string]any {
			return map[string]any{"resource": heartRate(patient, value, "heart-rate"), "request": map[string]any{"method": "POST", "url": "Observation"}}
		}
		r := s.Do(http.MethodPost, "/fhir/R4/", key, map[string]any{"resourceType": "Bundle", "type": "batch",
			"entry": []any{entry(pa, 60), entry(pb, 61)}})
		var b searchset
		r.JSON(t, &b)
		if r.Status != http.StatusOK || b.Type != "batch-response" || len(b.Entry) != 2 {
			t.Fatalf("batch: %d %s", r.Status, r.Body)
		}
		var got []string
		for _, e := range b.Entry {
			parts := strings.Split(e.Response.Location, "/")
			if e.Response.Status != "201 Created" || len(parts) != 4 || parts[0] != "Observation" {
				t.Fatalf("batch entry: %+v", e.Response)
			}
			got = append(got, parts[1])
		}
		if got[0] == got[1] {
			t.Fatalf("two entries answered with one id %s", got[0])
		}
		wantStored(t, s, key, got[0], pa, 60)
		wantStored(t, s, key, got[1], pb, 61)
	})

	t.Run("a reused client id on /v1/observations is never acknowledged and dropped", func(t *testing.T) {
		clientID := "compat-reading-" + run
		first := heartRate(pa, 70, clientID)
		post := func(o map[string]any) string {
			r := s.Do(http.MethodPost, "/v1/observations", key, o)
			var a struct{ IDs []string }
			r.JSON(t, &a)
			if r.Status != http.StatusAccepted || len(a.IDs) != 1 {
				t.Fatalf("/v1/observations: %d %s", r.Status, r.Body)
			}
			return a.IDs[0]
		}
		id := post(first)
		if retry := post(first); retry != id {
			t.Fatalf("the same observation sent again got id %s, first %s", retry, id)
		}
		other := post(heartRate(pb, 71, clientID))
		if other == id {
			t.Fatalf("another observation under the client id %s was given the first one's id", clientID)
		}
		wantStored(t, s, key, id, pa, 70)
		wantStored(t, s, key, other, pb, 71)
	})

	t.Run("errors under the base are OperationOutcomes", func(t *testing.T) {
		for _, c := range []struct {
			method, path string
			status       int
			allow        []string
		}{
			// DELETE is served for Patient only (versioning_test.go); pa has observations: 409.
			{http.MethodDelete, "/fhir/R4/Patient/" + pa, http.StatusConflict, nil},
			{http.MethodDelete, "/fhir/R4/RiskAssessment/rpt-x", http.StatusMethodNotAllowed, []string{"GET"}},
			{http.MethodPatch, "/fhir/R4/Patient/" + pa, http.StatusMethodNotAllowed, []string{"GET", "PUT"}},
			{http.MethodDelete, "/fhir/R4/Patient", http.StatusMethodNotAllowed, []string{"GET", "POST"}},
			{http.MethodGet, "/fhir/R4", http.StatusMethodNotAllowed, []string{"POST"}},
			{http.MethodGet, "/fhir/R4/", http.StatusMethodNotAllowed, []string{"POST"}},
			{http.MethodGet, "/fhir/R4/Patient/" + pa + "/$validate", http.StatusNotFound, nil},
			{http.MethodGet, "/fhir/R4/no/such/route", http.StatusNotFound, nil},
			{http.MethodGet, "/fhir/R4/Patient?family=%zz", http.StatusBadRequest, nil},
		} {
			t.Run(c.method+" "+c.path, func(t *testing.T) {
				r := s.Do(c.method, c.path, key, nil)
				wantOutcome(t, r, c.status)
				if !strings.HasPrefix(r.Header.Get("Request-Id"), "req_") {
					t.Errorf("Request-Id %q", r.Header.Get("Request-Id"))
				}
				for _, m := range c.allow {
					if !strings.Contains(r.Header.Get("Allow"), m) {
						t.Errorf("Allow %q lacks %s", r.Header.Get("Allow"), m)
					}
				}
			})
		}
		// Outside the base the router still answers in carehub's envelope.
		if r := s.Do(http.MethodDelete, "/v1/observations", key, nil); r.Status != http.StatusMethodNotAllowed || !strings.Contains(string(r.Body), `"error"`) {
			t.Fatalf("REST 405: %d %s", r.Status, r.Body)
		}
	})

	t.Run("POST _search", func(t *testing.T) {
		form := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
		r := send(t, s, http.MethodPost, "/fhir/R4/Patient/_search", key, form, "family=CompatA"+run)
		var b searchset
		r.JSON(t, &b)
		if r.Status != http.StatusOK || b.Type != "searchset" || b.Total != 1 || len(b.Entry) != 1 || b.Entry[0].Resource["id"] != pa {
			t.Fatalf("POST _search: %d %s", r.Status, r.Body)
		}
		// Parameters in the query string and the body together; the next link is a GET URL.
		r = send(t, s, http.MethodPost, "/fhir/R4/Patient/_search?_count=1", key, form, "family=Compat&_sort=_id&_lastUpdated=ge2000-01-01")
		r.JSON(t, &b)
		next := b.link("next")
		if r.Status != http.StatusOK || b.Total < 2 || len(b.Entry) != 1 || !strings.Contains(next, "family=Compat") {
			t.Fatalf("POST _search, page 1: %d %s", r.Status, r.Body)
		}
		var b2 searchset
		s.Do(http.MethodGet, strings.TrimPrefix(next, s.URL), key, nil).JSON(t, &b2)
		if b2.Total != b.Total || len(b2.Entry) != 1 || b2.Entry[0].Resource["id"] == b.Entry[0].Resource["id"] {
			t.Fatalf("POST _search, page 2 (%s): %+v", next, b2)
		}
		wantOutcome(t, s.Do(http.MethodPost, "/fhir/R4/Patient/_search", key, map[string]any{"family": "Compat"}), http.StatusUnsupportedMediaType)
	})
}

// locationID is the id in a Location header: …/Observation/{id}/_history/{version}.
func locationID(loc string) string {
	parts := strings.Split(loc, "/")
	if len(parts) < 4 {
		return ""
	}
	return parts[len(parts)-3]
}

// heartRate is an Observation for patient as HL7's examples carry one: with a client id (none
// when id is "") and a version the client made up.
func heartRate(patient string, value float64, id string) map[string]any {
	o := map[string]any{"resourceType": "Observation", "status": "final",
		"meta":              map[string]any{"versionId": "7", "lastUpdated": "2001-01-01T00:00:00Z"},
		"category":          []any{map[string]any{"coding": []any{map[string]any{"system": "http://terminology.hl7.org/CodeSystem/observation-category", "code": "vital-signs"}}}},
		"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4"}}},
		"subject":           map[string]any{"reference": "Patient/" + patient},
		"effectiveDateTime": time.Now().UTC().Format(time.RFC3339),
		"valueQuantity":     map[string]any{"value": value, "unit": "beats/minute", "system": "http://unitsofmeasure.org", "code": "/min"}}
	if id != "" {
		o["id"] = id
	}
	return o
}

func createPatient(t *testing.T, s *servertest.Server, key, family string) string {
	t.Helper()
	r := s.Do(http.MethodPost, "/fhir/R4/Patient", key, patientBody(family, "mrn-"+family))
	var pt struct{ ID string }
	r.JSON(t, &pt)
	if r.Status != http.StatusCreated || pt.ID == "" {
		t.Fatalf("create patient: %d %s", r.Status, r.Body)
	}
	return pt.ID
}

// wantStored waits for observation id to be readable and checks that it is patient's, of value.
func wantStored(t *testing.T, s *servertest.Server, key, id, patient string, value float64) {
	t.Helper()
	var r *servertest.Response
	servertest.Eventually(t, 10*time.Second, "observation "+id+" stored", func() bool {
		r = s.Do(http.MethodGet, "/fhir/R4/Observation/"+id, key, nil)
		return r.Status == http.StatusOK
	})
	var o struct {
		Subject       struct{ Reference string }
		ValueQuantity struct{ Value float64 }
		Meta          struct{ VersionID string }
	}
	r.JSON(t, &o)
	if o.Subject.Reference != "Patient/"+patient || o.ValueQuantity.Value != value || o.Meta.VersionID != "1" {
		t.Fatalf("observation %s: %s, want patient %s, value %v, version 1", id, r.Body, patient, value)
	}
}

// wantOutcome checks that r is an OperationOutcome answered with status, as FHIR JSON.
func wantOutcome(t *testing.T, r *servertest.Response, status int) {
	t.Helper()
	var oo outcome
	if r.Status != status || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/fhir+json") ||
		json.Unmarshal(r.Body, &oo) != nil || oo.ResourceType != "OperationOutcome" || len(oo.Issue) == 0 {
		t.Fatalf("%d %s %s, want %d and an OperationOutcome", r.Status, r.Header.Get("Content-Type"), r.Body, status)
	}
}

// send is servertest.Do with the body as given and headers of the caller's choosing.
func send(t *testing.T, s *servertest.Server, method, path, key string, header http.Header, body string) *servertest.Response {
	t.Helper()
	req, err := http.NewRequest(method, s.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return &servertest.Response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
