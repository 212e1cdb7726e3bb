package fhir_test

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// TestWholeRecords loads a Synthea-like patient record as one transaction (issue 52): every type
// a Synthea patient carries, urn:uuid references between entries and conditional references to
// the organization and practitioner a hospital bundle loaded; reads it back resource for
// resource with every reference rewritten, searches it, and gets it whole from $everything;
// under tenancy, test mode, scopes and reference checks; then updates (update as create,
// If-Match), histories and deletes.
func TestWholeRecords(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	run := fmt.Sprint(time.Now().UnixNano())

	// The hospital and practitioner bundles: conditional creates, answered 200 the second time.
	orgIdent := "https://github.com/synthetichealth/synthea|org-" + run
	pracIdent := "http://hl7.org/fhir/sid/us-npi|npi-" + run
	directory := txBundle(
		txEntry("urn:uuid:org-"+run, "Organization", "identifier="+orgIdent, map[string]any{"resourceType": "Organization",
			"identifier": []any{ident(orgIdent)}, "name": "General Hospital " + run, "active": true}),
		txEntry("urn:uuid:prac-"+run, "Practitioner", "identifier="+pracIdent, map[string]any{"resourceType": "Practitioner",
			"identifier": []any{ident(pracIdent)}, "name": []any{map[string]any{"family": "Osler", "prefix": []string{"Dr."}}}}),
		txEntry("", "PractitionerRole", "", map[string]any{"resourceType": "PractitionerRole",
			"practitioner": ref("Practitioner?identifier=" + pracIdent), "organization": ref("Organization?identifier=" + orgIdent)}),
	)
	first := postBundle(t, s, key, directory, 201, 201, 201)
	again := postBundle(t, s, key, txBundle(directory["entry"].([]any)[:2]...), 200, 200)
	orgID, pracID := locID(first.Entry[0].Response.Location), locID(first.Entry[1].Response.Location)
	if locID(again.Entry[0].Response.Location) != orgID || locID(again.Entry[1].Response.Location) != pracID {
		t.Fatalf("conditional creates made new resources: %v then %v", first.Entry, again.Entry)
	}
	role := read(t, s, key, first.Entry[2].Response.Location)
	wantRef(t, role, "practitioner", "Practitioner/"+pracID)
	wantRef(t, role, "organization", "Organization/"+orgID)

	// The patient's record.
	record := patientRecord(run, orgIdent, pracIdent)
	res := postBundle(t, s, key, record, 201, 201, 201, 201, 201, 201, 201, 201, 201, 201)
	loc := map[string]string{}
	for i, e := range res.Entry {
		loc[record["entry"].([]any)[i].(map[string]any)["fullUrl"].(string)] = e.Response.Location
	}
	pid, eid := locID(loc["urn:uuid:p-"+run]), locID(loc["urn:uuid:e-"+run])
	o1, o2 := locID(loc["urn:uuid:o1-"+run]), locID(loc["urn:uuid:o2-"+run])

	t.Run("read back with every reference rewritten", func(t *testing.T) {
		enc := read(t, s, key, loc["urn:uuid:e-"+run])
		wantRef(t, enc, "subject", "Patient/"+pid)
		wantRef(t, enc, "serviceProvider", "Organization/"+orgID)
		if p := enc["participant"].([]any)[0].(map[string]any); p["individual"].(map[string]any)["reference"] != "Practitioner/"+pracID {
			t.Errorf("Encounter.participant: %v", p)
		}
		for _, u := range []string{"c", "proc", "mr", "dr"} {
			doc := read(t, s, key, loc["urn:uuid:"+u+"-"+run])
			wantRef(t, doc, "subject", "Patient/"+pid)
			wantRef(t, doc, "encounter", "Encounter/"+eid)
		}
		imm := read(t, s, key, loc["urn:uuid:imm-"+run])
		wantRef(t, imm, "patient", "Patient/"+pid)
		mr := read(t, s, key, loc["urn:uuid:mr-"+run])
		wantRef(t, mr, "requester", "Practitioner/"+pracID)
		dr := read(t, s, key, loc["urn:uuid:dr-"+run])
		result := dr["result"].([]any)
		if result[0].(map[string]any)["reference"] != "Observation/"+o1 || result[1].(map[string]any)["reference"] != "Observation/"+o2 {
			t.Fatalf("DiagnosticReport.result %v, want Observation/%s and /%s", result, o1, o2)
		}
		for _, o := range []string{o1, o2} { // the ids the report names are the stored observations'
			servertest.Eventually(t, 10*time.Second, "observation "+o, func() bool {
				return s.Do(http.MethodGet, "/fhir/R4/Observation/"+o, key, nil).Status == http.StatusOK
			})
			obs := read(t, s, key, "Observation/"+o)
			wantRef(t, obs, "subject", "Patient/"+pid)
			wantRef(t, obs, "encounter", "Encounter/"+eid)
		}
		if c := read(t, s, key, loc["urn:uuid:c-"+run]); c["meta"].(map[string]any)["versionId"] != "1" || c["code"] == nil {
			t.Fatalf("Condition: %v", c)
		}
	})

	t.Run("search by the common parameters", func(t *testing.T) {
		for q, want := range map[string]int{
			"Condition?patient=" + pid:                                              1,
			"Condition?subject=Patient/" + pid:                                      1,
			"Condition?encounter=" + eid:                                            1,
			"Condition?code=http://snomed.info/sct|44054006&patient=" + pid:         1,
			"Condition?code=44054006&patient=" + pid:                                1,
			"Condition?code=http://loinc.org|44054006&patient=" + pid:               0,
			"Condition?status=active&patient=" + pid:                                1,
			"Condition?category=problem-list-item&patient=" + pid:                   1,
			"Encounter?patient=" + pid + "&date=ge2024-01-01":                       1,
			"Encounter?patient=" + pid + "&date=lt2024-01-01":                       0,
			"Encounter?patient=" + pid + "&date=2024-03":                            1,
			"MedicationRequest?status=active&patient=" + pid:                        1,
			"Immunization?patient=" + pid + "&code=http://hl7.org/fhir/sid/cvx|140": 1,
			"Procedure?patient=" + pid + "&_lastUpdated=ge2020-01-01":               1,
			"DiagnosticReport?patient=" + pid + "&_sort=-date":                      1,
			"Organization?identifier=" + url.QueryEscape(orgIdent):                  1,
			"Encounter?identifier=urn:test|enc-" + run:                              1,
			"Condition?_id=" + locID(loc["urn:uuid:c-"+run]):                        1,
		} {
			var b searchset
			r := s.Do(http.MethodGet, "/fhir/R4/"+q, key, nil)
			r.JSON(t, &b)
			if r.Status != http.StatusOK || b.Total != want || len(b.Entry) != want {
				t.Errorf("%s: %d total %d (%d entries), want %d: %s", q, r.Status, b.Total, len(b.Entry), want, r.Body)
			}
		}
		var b searchset
		s.Do(http.MethodGet, "/fhir/R4/Condition?patient="+pid+"&_include=Condition:patient", key, nil).JSON(t, &b)
		if len(b.Entry) != 2 || b.Entry[1].Search.Mode != "include" || b.Entry[1].Resource["id"] != pid {
			t.Errorf("_include: %+v", b)
		}
		wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/Condition?bogus=1", key, nil), http.StatusBadRequest)
		wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/NoSuchType/x", key, nil), http.StatusNotFound)
	})

	t.Run("$everything", func(t *testing.T) {
		want := []string{"Patient/" + pid, "Observation/" + o1, "Observation/" + o2}
		for _, u := range []string{"e", "c", "proc", "mr", "imm", "dr", "dev"} {
			want = append(want, loc["urn:uuid:"+u+"-"+run])
		}
		for i, w := range want {
			want[i] = strings.Join(strings.Split(w, "/")[:2], "/")
		}
		var got []string
		next := "/fhir/R4/Patient/" + pid + "/$everything?_count=4"
		for pages := 0; next != "" && pages < 10; pages++ {
			var b searchset
			r := s.Do(http.MethodGet, next, key, nil)
			r.JSON(t, &b)
			if r.Status != http.StatusOK || b.Type != "searchset" || b.Total != len(want) {
				t.Fatalf("$everything %s: %d %s", next, r.Status, r.Body)
			}
			for _, e := range b.Entry {
				got = append(got, e.Resource["resourceType"].(string)+"/"+e.Resource["id"].(string))
			}
			next = strings.TrimPrefix(b.link("next"), s.URL)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("$everything: %v, want %v", got, want)
		}
	})

	t.Run("tenancy, test mode and scopes", func(t *testing.T) {
		cond := "Condition/" + locID(loc["urn:uuid:c-"+run])
		other := s.Key("northwind-health", access.Live, access.Scopes...)
		wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/"+cond, other, nil), http.StatusNotFound)
		wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/Patient/"+pid+"/$everything", other, nil), http.StatusNotFound)
		var b searchset
		s.Do(http.MethodGet, "/fhir/R4/Condition?patient="+pid, other, nil).JSON(t, &b)
		if b.Total != 0 {
			t.Errorf("another organization's key found %d conditions", b.Total)
		}
		// Another organization's key cannot attach to this one's patient either.
		wantOutcome(t, s.Do(http.MethodPost, "/fhir/R4/Condition", other, condition("Patient/"+pid)), http.StatusUnprocessableEntity)

		test := s.Key(demo.DemoOrgSlug, access.Test, access.Scopes...)
		wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/"+cond, test, nil), http.StatusNotFound)
		r := s.Do(http.MethodPost, "/fhir/R4/Condition", test, condition("Patient/"+pid))
		wantOutcome(t, r, http.StatusUnprocessableEntity)
		if !strings.Contains(string(r.Body), "Patient/"+pid) {
			t.Errorf("the refusal does not name the reference: %s", r.Body)
		}

		noRead := s.Key(demo.DemoOrgSlug, access.Live, access.WritePatients, access.ReadObservations)
		for _, path := range []string{cond, "Condition?patient=" + pid, "Patient/" + pid + "/$everything", cond + "/_history/1"} {
			wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/"+path, noRead, nil), http.StatusForbidden)
		}
		// Directory resources are not patient data.
		if r := s.Do(http.MethodGet, "/fhir/R4/Organization/"+orgID, noRead, nil); r.Status != http.StatusOK {
			t.Errorf("Organization without read:patients: %d %s", r.Status, r.Body)
		}
		// A write without read:patients is answered without the resource.
		if r := s.Do(http.MethodPost, "/fhir/R4/Condition", noRead, condition("Patient/"+pid)); r.Status != http.StatusCreated || len(r.Body) != 0 {
			t.Errorf("create without read:patients: %d %s", r.Status, r.Body)
		}
	})

	t.Run("references that name nothing are refused", func(t *testing.T) {
		wantOutcome(t, s.Do(http.MethodPost, "/fhir/R4/Condition", key, condition("Patient/pat-01aaaaaaaaaaaaaaaaaaaaaaaa")), http.StatusUnprocessableEntity)
		bad := condition("Patient/" + pid)
		bad["encounter"] = ref("Encounter/enc-01aaaaaaaaaaaaaaaaaaaaaaaa")
		wantOutcome(t, s.Do(http.MethodPost, "/fhir/R4/Condition", key, bad), http.StatusUnprocessableEntity)
		wantOutcome(t, s.Do(http.MethodPost, "/fhir/R4/Condition", key, condition("urn:uuid:nowhere")), http.StatusUnprocessableEntity)
		wantOutcome(t, s.Do(http.MethodPost, "/fhir/R4/Condition", key, condition("Patient?identifier=urn:none|none")), http.StatusUnprocessableEntity)

		// In a batch the entry is refused, the others are stored.
		var b searchset
		s.Do(http.MethodPost, "/fhir/R4/", key, map[string]any{"resourceType": "Bundle", "type": "batch", "entry": []any{
			txEntry("", "Condition", "", condition("urn:uuid:nowhere")), txEntry("", "Condition", "", condition("Patient/"+pid))}}).JSON(t, &b)
		if len(b.Entry) != 2 || !strings.HasPrefix(b.Entry[0].Response.Status, "422") || b.Entry[1].Response.Status != "201 Created" {
			t.Fatalf("batch: %+v", b.Entry)
		}

		// A transaction with a dangling reference stores nothing, its patient included.
		family := "Dangling" + run
		tx := txBundle(txEntry("urn:uuid:dp-"+run, "Patient", "", patientBody(family, "mrn-"+family)),
			txEntry("", "Condition", "", condition("urn:uuid:dp-"+run)),
			txEntry("", "Procedure", "", map[string]any{"resourceType": "Procedure", "status": "completed", "subject": ref("urn:uuid:dp-" + run),
				"encounter": ref("urn:uuid:missing-" + run)}))
		r := s.Do(http.MethodPost, "/fhir/R4", key, tx)
		wantOutcome(t, r, http.StatusUnprocessableEntity)
		if !strings.Contains(expressions(t, r), "Bundle.entry[2]") {
			t.Errorf("the refusal does not name the entry: %s", r.Body)
		}
		s.Do(http.MethodGet, "/fhir/R4/Patient?family="+family, key, nil).JSON(t, &b)
		if b.Total != 0 {
			t.Fatalf("a refused transaction stored its patient")
		}

		// Intake refuses an Observation (another organization's patient) after the Postgres
		// transaction committed: what it wrote is removed.
		nw := s.Key("northwind-health", access.Live, access.Scopes...)
		foreign := createPatient(t, s, nw, "Foreign"+run)
		marker := "undone-" + run
		undone := condition("Patient/" + pid)
		undone["identifier"] = []any{ident("urn:test|" + marker)}
		obs := heartRate(foreign, 70, "")
		delete(obs, "meta")
		r = s.Do(http.MethodPost, "/fhir/R4", key, txBundle(txEntry("", "Condition", "", undone), txEntry("urn:uuid:u-"+run, "Observation", "", obs)))
		wantOutcome(t, r, http.StatusUnprocessableEntity)
		if !strings.Contains(expressions(t, r), "Bundle.entry[1]") {
			t.Errorf("the refusal does not name the Observation's entry: %s", r.Body)
		}
		s.Do(http.MethodGet, "/fhir/R4/Condition?identifier=urn:test|"+marker, key, nil).JSON(t, &b)
		if b.Total != 0 {
			t.Fatalf("a transaction refused by intake kept its Condition")
		}
		var orphans int
		if err := s.Pool().QueryRow(t.Context(), `select count(*) from fhir_resource_versions v where not exists (
			select 1 from fhir_resources r where r.org_id = v.org_id and r.type = v.type and r.id = v.id)`).Scan(&orphans); err != nil {
			t.Fatal(err)
		}
		if orphans != 0 {
			t.Fatalf("%d versions left of resources a refused transaction removed", orphans)
		}
	})

	t.Run("the typed table's encounters beside the store's", func(t *testing.T) {
		var b searchset
		s.Do(http.MethodGet, "/fhir/R4/Encounter?_count=100&_sort=-date", key, nil).JSON(t, &b)
		var typed map[string]any
		for _, e := range b.Entry {
			if e.Resource["type"] == nil { // the demo's: the typed table has no type
				typed = e.Resource
			}
		}
		if typed == nil || b.Total < 2 {
			t.Fatalf("no demo encounter among %d: %+v", b.Total, b.Entry)
		}
		id := typed["id"].(string)
		doc := read(t, s, key, "Encounter/"+id)
		if doc["subject"] == nil || doc["status"] == nil || doc["meta"].(map[string]any)["versionId"] != "1" {
			t.Fatalf("typed encounter: %v", doc)
		}
		read(t, s, key, "Encounter/"+id+"/_history/1")
		wantOutcome(t, s.Do(http.MethodPut, "/fhir/R4/Encounter/"+id, key, doc), http.StatusConflict)
	})

	t.Run("delete", func(t *testing.T) {
		deleteChecks(t, s, key, pid, "Device/"+locID(loc["urn:uuid:dev-"+run]), "Encounter/"+eid)
	})

	t.Run("update, update as create, versions", func(t *testing.T) {
		id := "client-chosen-" + run
		c := condition("Patient/" + pid)
		c["id"] = id
		if r := s.Do(http.MethodPut, "/fhir/R4/Condition/"+id, key, c); r.Status != http.StatusCreated {
			t.Fatalf("update as create: %d %s", r.Status, r.Body)
		}
		c["clinicalStatus"] = concept("http://terminology.hl7.org/CodeSystem/condition-clinical", "resolved")
		r := s.Do(http.MethodPut, "/fhir/R4/Condition/"+id, key, c)
		doc := map[string]any{}
		r.JSON(t, &doc)
		if meta, _ := doc["meta"].(map[string]any); r.Status != http.StatusOK || meta["versionId"] != "2" {
			t.Fatalf("update: %d %s", r.Status, r.Body)
		}
		v1 := read(t, s, key, "Condition/"+id+"/_history/1")
		if v1["clinicalStatus"].(map[string]any)["coding"].([]any)[0].(map[string]any)["code"] != "active" {
			t.Errorf("vread 1: %v", v1)
		}
		var b searchset
		r = s.Do(http.MethodGet, "/fhir/R4/Condition/"+id+"/_history", key, nil)
		r.JSON(t, &b)
		if r.Status != http.StatusOK || b.Type != "history" || len(b.Entry) != 2 || b.Entry[0].Resource["meta"].(map[string]any)["versionId"] != "2" {
			t.Fatalf("instance history: %d %s", r.Status, r.Body)
		}
		r = s.Do(http.MethodGet, "/fhir/R4/Condition/_history?_count=1000", key, nil)
		r.JSON(t, &b)
		if r.Status != http.StatusOK || len(b.Entry) < 3 {
			t.Fatalf("type history: %d %s", r.Status, r.Body)
		}
		s.Do(http.MethodGet, "/fhir/R4/Condition?_id="+id+"&status=resolved", key, nil).JSON(t, &b)
		if b.Total != 1 {
			t.Errorf("the search does not see the new version: %+v", b)
		}
		stale := send(t, s, http.MethodPut, "/fhir/R4/Condition/"+id, key,
			http.Header{"Content-Type": {"application/fhir+json"}, "If-Match": {`W/"1"`}}, string(mustJSON(t, c)))
		wantOutcome(t, stale, http.StatusPreconditionFailed)
		current := send(t, s, http.MethodPut, "/fhir/R4/Condition/"+id, key,
			http.Header{"Content-Type": {"application/fhir+json"}, "If-Match": {`W/"2"`}}, string(mustJSON(t, c)))
		if current.Status != http.StatusOK || current.Header.Get("ETag") != `W/"3"` {
			t.Fatalf("If-Match of the current version: %d %s %s", current.Status, current.Header, current.Body)
		}
		c["id"] = "another"
		wantOutcome(t, s.Do(http.MethodPut, "/fhir/R4/Condition/"+id, key, c), http.StatusUnprocessableEntity)
	})
}

func deleteChecks(t *testing.T, s *servertest.Server, key, pid, device, encounter string) {
	t.Helper()
	var before searchset
	s.Do(http.MethodGet, "/fhir/R4/Patient/"+pid+"/$everything?_count=0", key, nil).JSON(t, &before)
	wantOutcome(t, s.Do(http.MethodDelete, "/fhir/R4/"+encounter, key, nil), http.StatusConflict) // the Condition … name it
	stale := send(t, s, http.MethodDelete, "/fhir/R4/"+device, key, http.Header{"If-Match": {`W/"7"`}}, "")
	wantOutcome(t, stale, http.StatusPreconditionFailed)
	for range 2 { // the second answers the first's deletion
		if r := s.Do(http.MethodDelete, "/fhir/R4/"+device, key, nil); r.Status != http.StatusOK || r.Header.Get("ETag") != `W/"2"` {
			t.Fatalf("delete: %d %s %s", r.Status, r.Header, r.Body)
		}
	}
	wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/"+device, key, nil), http.StatusNotFound)
	var h searchset
	s.Do(http.MethodGet, "/fhir/R4/"+device+"/_history", key, nil).JSON(t, &h)
	if len(h.Entry) != 2 || h.Entry[0].Resource != nil || h.Entry[1].Resource == nil {
		t.Fatalf("history of a deleted resource: %+v", h)
	}
	var after searchset
	s.Do(http.MethodGet, "/fhir/R4/Patient/"+pid+"/$everything?_count=0", key, nil).JSON(t, &after)
	if after.Total != before.Total-1 {
		t.Fatalf("$everything: %d after the deletion, %d before", after.Total, before.Total)
	}
}

// patientRecord is a Synthea-like patient transaction: its Organization and Practitioner named by
// conditional references, every other reference a urn:uuid fullUrl.
func patientRecord(run, orgIdent, pracIdent string) map[string]any {
	u := func(s string) string { return "urn:uuid:" + s + "-" + run }
	p, e := ref(u("p")), ref(u("e"))
	vital := concept("http://terminology.hl7.org/CodeSystem/observation-category", "vital-signs")
	lab := concept("http://terminology.hl7.org/CodeSystem/observation-category", "laboratory")
	return txBundle(
		txEntry(u("p"), "Patient", "", map[string]any{"resourceType": "Patient", "identifier": []any{ident("urn:test|synthea-" + run)},
			"name": []any{map[string]any{"family": "Record" + run, "given": []string{"Whole"}}}, "gender": "male", "birthDate": "1961-02-03"}),
		txEntry(u("e"), "Encounter", "", map[string]any{"resourceType": "Encounter", "status": "finished",
			"identifier": []any{ident("urn:test|enc-" + run)},
			"class":      map[string]any{"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "AMB"},
			"type":       []any{concept("http://snomed.info/sct", "185349003")}, "subject": p,
			"participant":     []any{map[string]any{"individual": ref("Practitioner?identifier=" + pracIdent)}},
			"period":          map[string]any{"start": "2024-03-01T09:00:00Z", "end": "2024-03-01T09:30:00Z"},
			"serviceProvider": ref("Organization?identifier=" + orgIdent)}),
		txEntry(u("c"), "Condition", "", map[string]any{"resourceType": "Condition",
			"clinicalStatus": concept("http://terminology.hl7.org/CodeSystem/condition-clinical", "active"),
			"category":       []any{concept("http://terminology.hl7.org/CodeSystem/condition-category", "problem-list-item")},
			"code":           concept("http://snomed.info/sct", "44054006"), "subject": p, "encounter": e,
			"onsetDateTime": "2024-03-01T09:00:00Z", "recordedDate": "2024-03-01T09:00:00Z"}),
		txEntry(u("o1"), "Observation", "", map[string]any{"resourceType": "Observation", "status": "final", "category": []any{vital},
			"code": concept("http://loinc.org", "8867-4"), "subject": p, "encounter": e, "effectiveDateTime": "2024-03-01T09:05:00Z",
			"valueQuantity": map[string]any{"value": 71, "unit": "/min", "system": "http://unitsofmeasure.org", "code": "/min"}}),
		txEntry(u("o2"), "Observation", "", map[string]any{"resourceType": "Observation", "status": "final", "category": []any{lab},
			"code": concept("http://loinc.org", "2339-0"), "subject": p, "encounter": e, "effectiveDateTime": "2024-03-01T09:10:00Z",
			"valueQuantity": map[string]any{"value": 5.4, "unit": "mmol/L", "system": "http://unitsofmeasure.org", "code": "mmol/L"}}),
		txEntry(u("proc"), "Procedure", "", map[string]any{"resourceType": "Procedure", "status": "completed",
			"code": concept("http://snomed.info/sct", "430193006"), "subject": p, "encounter": e,
			"performedPeriod": map[string]any{"start": "2024-03-01T09:10:00Z", "end": "2024-03-01T09:20:00Z"}}),
		txEntry(u("mr"), "MedicationRequest", "", map[string]any{"resourceType": "MedicationRequest", "status": "active", "intent": "order",
			"medicationCodeableConcept": concept("http://www.nlm.nih.gov/research/umls/rxnorm", "860975"), "subject": p, "encounter": e,
			"authoredOn": "2024-03-01T09:25:00Z", "requester": ref("Practitioner?identifier=" + pracIdent)}),
		txEntry(u("imm"), "Immunization", "", map[string]any{"resourceType": "Immunization", "status": "completed",
			"vaccineCode": concept("http://hl7.org/fhir/sid/cvx", "140"), "patient": p, "encounter": e,
			"occurrenceDateTime": "2024-03-01T09:15:00Z", "primarySource": true}),
		txEntry(u("dr"), "DiagnosticReport", "", map[string]any{"resourceType": "DiagnosticReport", "status": "final",
			"category": []any{concept("http://terminology.hl7.org/CodeSystem/v2-0074", "LAB")},
			"code":     concept("http://loinc.org", "51990-0"), "subject": p, "encounter": e, "effectiveDateTime": "2024-03-01T09:10:00Z",
			"issued": "2024-03-01T09:10:00.000Z", "result": []any{ref(u("o1")), ref(u("o2"))}}),
		txEntry(u("dev"), "Device", "", map[string]any{"resourceType": "Device", "status": "active",
			"type": concept("http://snomed.info/sct", "72506001"), "patient": p}),
	)
}

func condition(subject string) map[string]any {
	return map[string]any{"resourceType": "Condition",
		"clinicalStatus": concept("http://terminology.hl7.org/CodeSystem/condition-clinical", "active"),
		"code":           concept("http://snomed.info/sct", "38341003"), "subject": ref(subject)}
}

func txBundle(entries ...any) map[string]any {
	return map[string]any{"resourceType": "Bundle", "type": "transaction", "entry": entries}
}

func txEntry(fullURL, t, ifNoneExist string, resource map[string]any) any {
	req := map[string]any{"method": "POST", "url": t}
	if ifNoneExist != "" {
		req["ifNoneExist"] = ifNoneExist
	}
	e := map[string]any{"resource": resource, "request": req}
	if fullURL != "" {
		e["fullUrl"] = fullURL
	}
	return e
}

func ref(r string) map[string]any { return map[string]any{"reference": r} }

func ident(token string) map[string]any {
	sys, val, _ := strings.Cut(token, "|")
	return map[string]any{"system": sys, "value": val}
}

func concept(system, code string) map[string]any {
	return map[string]any{"coding": []any{map[string]any{"system": system, "code": code}}}
}

// postBundle posts a transaction and checks each entry's status code.
func postBundle(t *testing.T, s *servertest.Server, key string, b map[string]any, statuses ...int) searchset {
	t.Helper()
	r := s.Do(http.MethodPost, "/fhir/R4/", key, b)
	var out searchset
	r.JSON(t, &out)
	if r.Status != http.StatusOK || out.Type != "transaction-response" || len(out.Entry) != len(statuses) {
		t.Fatalf("transaction: %d %s", r.Status, r.Body)
	}
	for i, e := range out.Entry {
		if !strings.HasPrefix(e.Response.Status, fmt.Sprint(statuses[i])) || e.Response.Location == "" {
			t.Fatalf("entry %d: %+v, want %d", i, e.Response, statuses[i])
		}
	}
	return out
}

// locID is the id of a response.location Type/id/_history/v.
func locID(loc string) string {
	parts := strings.Split(loc, "/")
	if len(parts) < 2 {
		return ""
	}
	return parts[1]
}

// read GETs Type/id[/_history/v] (a response.location) and decodes it.
func read(t *testing.T, s *servertest.Server, key, loc string) map[string]any {
	t.Helper()
	r := s.Do(http.MethodGet, "/fhir/R4/"+loc, key, nil)
	doc := map[string]any{}
	r.JSON(t, &doc)
	if r.Status != http.StatusOK {
		t.Fatalf("read %s: %d %s", loc, r.Status, r.Body)
	}
	return doc
}

func wantRef(t *testing.T, doc map[string]any, element, want string) {
	t.Helper()
	if r, _ := doc[element].(map[string]any); r == nil || r["reference"] != want {
		t.Errorf("%s.%s = %v, want %s", doc["resourceType"], element, doc[element], want)
	}
}
