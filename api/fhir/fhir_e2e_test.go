package fhir_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/storage/demo"
)

type outcome struct {
	ResourceType string
	Issue        []struct {
		Severity, Code, Diagnostics string
		Expression                  []string
	}
}

// expressions returns every issue's expressions of an OperationOutcome body.
func expressions(t *testing.T, r *servertest.Response) string {
	t.Helper()
	var oo outcome
	r.JSON(t, &oo)
	if oo.ResourceType != "OperationOutcome" || len(oo.Issue) == 0 {
		t.Fatalf("not an OperationOutcome: %d %s", r.Status, r.Body)
	}
	var all []string
	for _, i := range oo.Issue {
		all = append(all, i.Expression...)
	}
	return strings.Join(all, " ")
}

type searchset struct {
	ResourceType, Type string
	Total              int
	Link               []struct{ Relation, URL string }
	Entry              []struct {
		FullURL  string
		Resource map[string]any
		Search   struct{ Mode string }
		Response struct{ Status, Location string }
	}
}

func (b searchset) link(rel string) string {
	for _, l := range b.Link {
		if l.Relation == rel {
			return l.URL
		}
	}
	return ""
}

func patientBody(family, identifier string) map[string]any {
	return map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": family, "given": []string{"Ada"}}},
		"gender": "female", "birthDate": "1970-03-04",
		"identifier": []any{map[string]any{"system": "urn:test:mrn", "value": identifier}}}
}

// TestFHIRBase drives /fhir/R4 as a FHIR client would: metadata, create and read with FHIR ids,
// conditional create, update and history, search with paging, strict and lenient parameters,
// and OperationOutcomes naming the element.
func TestFHIRBase(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	run := fmt.Sprint(time.Now().UnixNano())

	meta := s.Do(http.MethodGet, "/fhir/R4/metadata", "", nil)
	if meta.Status != http.StatusOK || !strings.HasPrefix(meta.Header.Get("Content-Type"), "application/fhir+json") ||
		!strings.Contains(string(meta.Body), `"fhirVersion":"4.0.1"`) || !strings.Contains(string(meta.Body), `"RiskAssessment"`) {
		t.Fatalf("metadata: %d %s %s", meta.Status, meta.Header, meta.Body)
	}

	c := s.Do(http.MethodPost, "/fhir/R4/Patient", key, patientBody("Lovelace"+run, "mrn-"+run))
	var pt map[string]any
	c.JSON(t, &pt)
	id, _ := pt["id"].(string)
	if c.Status != http.StatusCreated || !strings.HasPrefix(id, "pat-") || !strings.HasSuffix(c.Header.Get("Location"), "/fhir/R4/Patient/"+id+"/_history/1") ||
		pt["meta"].(map[string]any)["versionId"] != "1" {
		t.Fatalf("create: %d %s %s", c.Status, c.Header, c.Body)
	}
	carehubID := "pat_" + strings.TrimPrefix(id, "pat-")
	for _, form := range []string{id, carehubID} {
		if r := s.Do(http.MethodGet, "/fhir/R4/Patient/"+form, key, nil); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"id":"`+id+`"`) {
			t.Fatalf("read %s: %d %s", form, r.Status, r.Body)
		}
	}

	t.Run("conditional create", func(t *testing.T) {
		req := func() *servertest.Response {
			b, _ := json.Marshal(patientBody("Other", "mrn-"+run))
			hr, _ := http.NewRequest(http.MethodPost, s.URL+"/fhir/R4/Patient", strings.NewReader(string(b)))
			hr.Header.Set("Authorization", "Bearer "+key)
			hr.Header.Set("Content-Type", "application/fhir+json")
			hr.Header.Set("If-None-Exist", "identifier=urn:test:mrn|mrn-"+run)
			resp, err := http.DefaultClient.Do(hr)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var doc map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&doc)
			return &servertest.Response{Status: resp.StatusCode, Body: []byte(fmt.Sprint(doc["id"]))}
		}
		if r := req(); r.Status != http.StatusOK || string(r.Body) != id {
			t.Fatalf("If-None-Exist of an existing identifier: %d %s, want 200 %s", r.Status, r.Body, id)
		}
	})

	t.Run("update and history", func(t *testing.T) {
		body := patientBody("Lovelace"+run, "mrn-"+run)
		body["id"] = id
		body["gender"] = "other"
		if r := s.Do(http.MethodPut, "/fhir/R4/Patient/"+id, key, body); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"versionId":"2"`) {
			t.Fatalf("update: %d %s", r.Status, r.Body)
		}
		var h searchset
		s.Do(http.MethodGet, "/fhir/R4/Patient/"+id+"/_history", key, nil).JSON(t, &h)
		if h.Type != "history" || h.Total != 2 {
			t.Fatalf("history: %+v", h)
		}
		v1 := s.Do(http.MethodGet, "/fhir/R4/Patient/"+id+"/_history/1", key, nil)
		if v1.Status != http.StatusOK || !strings.Contains(string(v1.Body), `"gender":"female"`) {
			t.Fatalf("vread 1: %d %s", v1.Status, v1.Body)
		}
		if r := s.Do(http.MethodGet, "/fhir/R4/Patient/"+id+"/_history/3", key, nil); r.Status != http.StatusNotFound {
			t.Fatalf("vread 3: %d %s", r.Status, r.Body)
		}
	})

	t.Run("search pages", func(t *testing.T) {
		family := "Paging" + run
		for i := range 3 {
			if r := s.Do(http.MethodPost, "/fhir/R4/Patient", key, patientBody(family, fmt.Sprintf("p%d-%s", i, run))); r.Status != http.StatusCreated {
				t.Fatalf("create: %d %s", r.Status, r.Body)
			}
		}
		var b searchset
		r := s.Do(http.MethodGet, "/fhir/R4/Patient?family="+strings.ToLower(family)+"&_count=2&_sort=-_lastUpdated", key, nil)
		r.JSON(t, &b)
		if b.Type != "searchset" || b.Total != 3 || len(b.Entry) != 2 || b.link("next") == "" {
			t.Fatalf("page 1: %s", r.Body)
		}
		next := strings.TrimPrefix(b.link("next"), s.URL)
		var b2 searchset
		s.Do(http.MethodGet, next, key, nil).JSON(t, &b2)
		if b2.Total != 3 || len(b2.Entry) != 1 || b2.link("next") != "" {
			t.Fatalf("page 2 (%s): %+v", next, b2)
		}
	})

	t.Run("strict and lenient parameters", func(t *testing.T) {
		r := s.Do(http.MethodGet, "/fhir/R4/Patient?colour=blue", key, nil)
		if r.Status != http.StatusBadRequest || expressions(t, r) != "colour" {
			t.Fatalf("unknown parameter: %d %s", r.Status, r.Body)
		}
		hr, _ := http.NewRequest(http.MethodGet, s.URL+"/fhir/R4/Patient?colour=blue&_count=1", nil)
		hr.Header.Set("Authorization", "Bearer "+key)
		hr.Header.Set("Prefer", "handling=lenient")
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b searchset
		_ = json.NewDecoder(resp.Body).Decode(&b)
		last := b.Entry[len(b.Entry)-1]
		if resp.StatusCode != http.StatusOK || last.Search.Mode != "outcome" || !strings.Contains(fmt.Sprint(last.Resource), "colour") {
			t.Fatalf("lenient: %d %+v", resp.StatusCode, b)
		}
		if r := s.Do(http.MethodGet, "/fhir/R4/Patient?_format=xml", key, nil); r.Status != http.StatusNotAcceptable {
			t.Fatalf("_format=xml: %d %s", r.Status, r.Body)
		}
		if r := s.Do(http.MethodGet, "/fhir/R4/Patient?birthdate=1970-13", key, nil); r.Status != http.StatusBadRequest || expressions(t, r) != "birthdate" {
			t.Fatalf("bad date: %d %s", r.Status, r.Body)
		}
	})

	t.Run("errors are OperationOutcomes naming the element", func(t *testing.T) {
		r := s.Do(http.MethodPost, "/fhir/R4/Patient", key, map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "X"}}, "gender": "robot"})
		if r.Status != http.StatusUnprocessableEntity || expressions(t, r) != "Patient.gender" {
			t.Fatalf("bad gender: %d %s", r.Status, r.Body)
		}
		if r := s.Do(http.MethodGet, "/fhir/R4/Patient/"+id, "", nil); r.Status != http.StatusUnauthorized || !strings.Contains(string(r.Body), "OperationOutcome") {
			t.Fatalf("no key: %d %s", r.Status, r.Body)
		}
		if r := s.Do(http.MethodGet, "/fhir/R4/Patient/pat-01jy0000000000000000000000", key, nil); r.Status != http.StatusNotFound || !strings.Contains(string(r.Body), "not-found") {
			t.Fatalf("unknown patient: %d %s", r.Status, r.Body)
		}
		// A Bundle over the 16 MiB limit (a long Synthea life is 20 MiB) is refused by its
		// declared length, before it is read, in the base's envelope too.
		big := `{"resourceType":"Bundle","type":"transaction","entry":[],"text":"` + strings.Repeat("x", 17<<20) + `"}`
		if r := s.Do(http.MethodPost, "/fhir/R4", key, big); r.Status != http.StatusRequestEntityTooLarge || !strings.Contains(string(r.Body), `"resourceType":"OperationOutcome"`) {
			t.Fatalf("a 17 MiB Bundle: %d %.300s", r.Status, r.Body)
		}
	})
}

// TestFHIRTransaction: a transaction creates a Patient and its Observations (the subject named
// by the Patient entry's fullUrl) all at once; one with a bad Observation is refused naming the
// element, and nothing of it is stored. The HL7 vital-signs examples go through /fhir/R4 as a
// batch, are searchable, visible in GraphQL FHIRPatient.observations, and NEWS2 scores them.
func TestFHIRTransaction(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	run := fmt.Sprint(time.Now().UnixNano())
	hr := func(value float64, code string) map[string]any {
		return map[string]any{"resourceType": "Observation", "status": "final",
			"category":          []any{map[string]any{"coding": []any{map[string]any{"system": "http://terminology.hl7.org/CodeSystem/observation-category", "code": "vital-signs"}}}},
			"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4"}}},
			"subject":           map[string]any{"reference": "urn:uuid:7f6b1b8e-8d1f-4c53-9f4e-000000000001"},
			"effectiveDateTime": time.Now().UTC().Format(time.RFC3339),
			"valueQuantity":     map[string]any{"value": value, "unit": "beats/minute", "system": "http://unitsofmeasure.org", "code": code}}
	}
	tx := func(obsCode string) map[string]any {
		return map[string]any{"resourceType": "Bundle", "type": "transaction", "entry": []any{
			map[string]any{"fullUrl": "urn:uuid:7f6b1b8e-8d1f-4c53-9f4e-000000000001", "resource": patientBody("Tx"+run+obsCode, "tx-"+run+obsCode),
				"request": map[string]any{"method": "POST", "url": "Patient"}},
			map[string]any{"resource": hr(72, "/min"), "request": map[string]any{"method": "POST", "url": "Observation"}},
			map[string]any{"resource": hr(80, obsCode), "request": map[string]any{"method": "POST", "url": "Observation"}},
		}}
	}

	bad := s.Do(http.MethodPost, "/fhir/R4", key, tx("mm[Hg]"))
	if bad.Status != http.StatusUnprocessableEntity || !strings.Contains(expressions(t, bad), "Bundle.entry[2].resource.valueQuantity") {
		t.Fatalf("bad transaction: %d %s", bad.Status, bad.Body)
	}
	var none searchset
	s.Do(http.MethodGet, "/fhir/R4/Patient?family=Tx"+run+"mm", key, nil).JSON(t, &none)
	if none.Total != 0 {
		t.Fatalf("a refused transaction's patient was stored: %+v", none)
	}

	ok := s.Do(http.MethodPost, "/fhir/R4", key, tx("/min"))
	var resp searchset
	ok.JSON(t, &resp)
	if ok.Status != http.StatusOK || resp.Type != "transaction-response" || len(resp.Entry) != 3 || resp.Entry[0].Response.Status != "201 Created" ||
		!strings.HasPrefix(resp.Entry[1].Response.Location, "Observation/obs-") {
		t.Fatalf("transaction: %d %s", ok.Status, ok.Body)
	}
	patient := strings.Split(resp.Entry[0].Response.Location, "/")[1]
	servertest.Eventually(t, 10*time.Second, "the transaction's observations searchable", func() bool {
		var b searchset
		s.Do(http.MethodGet, "/fhir/R4/Observation?patient="+patient+"&code=http://loinc.org|8867-4&date=ge2000-01-01&_include=Observation:patient", key, nil).JSON(t, &b)
		return b.Total == 2 && len(b.Entry) == 3 && b.Entry[2].Search.Mode == "include"
	})

	// The HL7 vital-signs examples, through the FHIR base.
	const hl7 = "pat_01jy0000000000000000000f15"
	if _, err := s.Pool().Exec(t.Context(), `insert into patients (id, org_id, synthetic, name) values ($1, $2, true, '[{"family":"Example"}]')`, hl7, demo.DemoOrgID); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("../rest/testdata/hl7-r4-vitals/*.json")
	if len(files) != 8 {
		t.Fatalf("examples: %v", files)
	}
	var entries []any
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// The FHIR id form of the subject.
		doc := strings.ReplaceAll(string(b), `"Patient/example"`, `"Patient/pat-01jy0000000000000000000f15"`)
		entries = append(entries, map[string]any{"resource": json.RawMessage(doc), "request": map[string]any{"method": "POST", "url": "Observation"}})
	}
	now := time.Now().UTC().Format(time.RFC3339)
	for _, v := range []struct {
		code, ucum string
		value      float64
	}{{"3151-8", "L/min", 0}, {"9269-2", "{score}", 15}} { // NEWS2's oxygen and consciousness: HL7 has no example
		entries = append(entries, map[string]any{"request": map[string]any{"method": "POST", "url": "Observation"}, "resource": map[string]any{
			"resourceType": "Observation", "status": "final", "effectiveDateTime": now,
			"code": map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": v.code}}}, "subject": map[string]any{"reference": "Patient/" + hl7},
			"valueQuantity": map[string]any{"value": v.value, "system": "http://unitsofmeasure.org", "code": v.ucum}}})
	}
	r := s.Do(http.MethodPost, "/fhir/R4", key, map[string]any{"resourceType": "Bundle", "type": "batch", "entry": entries})
	if r.Status != http.StatusOK || strings.Count(string(r.Body), `"201 Created"`) != 10 {
		t.Fatalf("HL7 examples batch: %d %s", r.Status, r.Body)
	}
	servertest.Eventually(t, 10*time.Second, "the examples in FHIRPatient.observations", func() bool {
		g := s.GraphQL(key, `query($id: ID!) { patient(id: $id) { observations(limit: 50) { id } } }`, map[string]any{"id": hl7})
		var d struct {
			Patient struct{ Observations []struct{ ID string } }
		}
		return json.Unmarshal(g.Data, &d) == nil && len(d.Patient.Observations) == 8+2+2 // + the BP panel's two parts
	})
	var agent string
	if err := s.Pool().QueryRow(t.Context(), `select id from agents where name = $1`, demo.Ward7AgentName).Scan(&agent); err != nil {
		t.Fatal(err)
	}
	g := s.GraphQL(key, `mutation($a: ID!, $p: String!) { runAgent(agentId: $a, patientId: $p) { status output } }`, map[string]any{"a": agent, "p": hl7})
	var d struct {
		RunAgent struct {
			Status string
			Output struct{ Score int }
		}
	}
	if err := json.Unmarshal(g.Data, &d); err != nil || d.RunAgent.Status != "COMPLETED" || d.RunAgent.Output.Score != 6 {
		t.Fatalf("NEWS2 of the examples: %s %v", g.Data, g.Errors)
	}
	var ra searchset
	s.Do(http.MethodGet, "/fhir/R4/RiskAssessment?patient=pat-01jy0000000000000000000f15", key, nil).JSON(t, &ra)
	if ra.Total != 1 || !strings.HasPrefix(fmt.Sprint(ra.Entry[0].Resource["id"]), "rpt-") {
		t.Fatalf("the NEWS2 report as a RiskAssessment: %+v", ra)
	}
}
