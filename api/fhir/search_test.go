package fhir_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// TestSearchAsClientsUseIt drives the search features FHIR clients use (issue 52, docs/FHIR.md
// "Search parameters"): _total and fhirpy's _totalMethod, _summary, _elements, :missing, :exact,
// quantity search, several _sort keys, _revinclude, _has, chained parameters, conditional create
// by any search (header, query string, Bundle entries), strict and lenient handling; each under
// tenancy, test mode and scopes.
func TestSearchAsClientsUseIt(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	run := fmt.Sprint(time.Now().UnixNano())
	alpha, beta, gamma := "Alpha"+run, "Beta"+run, "Gamma"+run
	mrn1 := "urn:test:mrn|s1-" + run

	p1 := createPatientBody(t, s, key, patientBody(alpha, "s1-"+run))
	b2 := patientBody(beta, "s2-"+run)
	b2["gender"] = "male"
	p2 := createPatientBody(t, s, key, b2)
	p3 := createPatientBody(t, s, key, map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": gamma}}})
	o72 := createObservation(t, s, key, heartRate(p1, 72, ""))
	o95 := createObservation(t, s, key, heartRate(p1, 95.5, ""))
	o120 := createObservation(t, s, key, heartRate(p2, 120, ""))
	diabetes := condition("Patient/" + p1)
	diabetes["code"] = concept("http://snomed.info/sct", "44054006")
	diabetes["onsetDateTime"] = "2020-05-01"
	diabetes["note"] = []any{map[string]any{"text": "not a summary element"}}
	cond1 := createResource(t, s, key, "Condition", diabetes)
	enc2 := createResource(t, s, key, "Encounter", map[string]any{"resourceType": "Encounter", "status": "finished",
		"class": map[string]any{"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "AMB"}, "subject": ref("Patient/" + p2)})
	servertest.Eventually(t, 15*time.Second, "the observations stored", func() bool {
		var b searchset
		s.Do(http.MethodGet, "/fhir/R4/Observation?patient="+p1+","+p2, key, nil).JSON(t, &b)
		return b.Total == 3
	})

	t.Run("_total and fhirpy's _totalMethod", func(t *testing.T) {
		b := searchOK(t, s, key, "Patient?family="+alpha+","+beta+"&_count=0&_totalMethod=count")
		if b.Total != 2 || len(b.Entry) != 0 {
			t.Errorf("_count=0&_totalMethod=count: total %d, %d entries", b.Total, len(b.Entry))
		}
		for _, v := range []string{"accurate", "estimate"} {
			if b := searchOK(t, s, key, "Patient?family="+alpha+"&_total="+v); b.Total != 1 || len(b.Entry) != 1 {
				t.Errorf("_total=%s: total %d, %d entries", v, b.Total, len(b.Entry))
			}
		}
		r := s.Do(http.MethodGet, "/fhir/R4/Patient?family="+alpha+"&_total=none", key, nil)
		if r.Status != http.StatusOK || bytes.Contains(r.Body, []byte(`"total"`)) || !bytes.Contains(r.Body, []byte(p1)) {
			t.Errorf("_total=none: %d %s", r.Status, r.Body)
		}
		wantParamError(t, s.Do(http.MethodGet, "/fhir/R4/Patient?_total=sometimes", key, nil), "_total")
	})

	t.Run("_summary and _elements", func(t *testing.T) {
		b := searchOK(t, s, key, "Patient?family="+alpha+"&_summary=count")
		if b.Total != 1 || len(b.Entry) != 0 {
			t.Errorf("_summary=count: total %d, %d entries", b.Total, len(b.Entry))
		}
		b = searchOK(t, s, key, "Patient?family="+alpha+"&_summary=true")
		doc := b.Entry[0].Resource
		if doc["name"] == nil || doc["gender"] == nil || doc["id"] != p1 || doc["extension"] != nil || !subsetted(doc) {
			t.Errorf("_summary=true: %v", doc)
		}
		b = searchOK(t, s, key, "Observation?patient="+p1+"&_elements=valueQuantity,status")
		for _, e := range b.Entry {
			doc := e.Resource
			if doc["valueQuantity"] == nil || doc["status"] == nil || doc["code"] != nil || doc["subject"] != nil || doc["resourceType"] != "Observation" || !subsetted(doc) {
				t.Errorf("_elements: %v", doc)
			}
		}
		b = searchOK(t, s, key, "Observation?patient="+p1+"&_summary=true")
		for _, e := range b.Entry {
			if doc := e.Resource; doc["valueQuantity"] == nil || doc["subject"] == nil || doc["code"] == nil || !subsetted(doc) {
				t.Errorf("Observation _summary=true: %v", doc)
			}
		}
		if b := searchOK(t, s, key, "Condition?patient="+p1+"&_summary=true&_total=none"); len(b.Entry) != 1 || b.Entry[0].Resource["code"] == nil ||
			b.Entry[0].Resource["subject"] == nil || b.Entry[0].Resource["onsetDateTime"] == nil || b.Entry[0].Resource["note"] != nil || !subsetted(b.Entry[0].Resource) {
			t.Errorf("Condition _summary=true: %v", b.Entry)
		}
		b = searchOK(t, s, key, "Condition?patient="+p1+"&_elements=code")
		if len(b.Entry) != 1 || b.Entry[0].Resource["code"] == nil || b.Entry[0].Resource["subject"] != nil || !subsetted(b.Entry[0].Resource) {
			t.Errorf("_elements on the generic store: %v", b.Entry)
		}
		wantParamError(t, s.Do(http.MethodGet, "/fhir/R4/Patient?_summary=text", key, nil), "_summary")
	})

	t.Run(":missing and :exact", func(t *testing.T) {
		for q, want := range map[string][]string{
			"Patient?family=" + gamma + "&birthdate:missing=true":                 {p3},
			"Patient?family=" + alpha + "&birthdate:missing=true":                 nil,
			"Patient?family=" + alpha + "," + gamma + "&identifier:missing=false": {p1},
			"Patient?family=" + alpha + "," + gamma + "&gender:missing=true":      {p3},
			"Patient?family:exact=" + alpha:                                       {p1},
			"Patient?family:exact=" + strings.ToLower(alpha):                      nil,
			"Patient?family=" + strings.ToLower(alpha):                            {p1},
			"Patient?family:exact=Alpha":                                          nil,
			"Patient?name:exact=Ada&family=" + alpha:                              {p1},
			"Observation?patient=" + p1 + "&date:missing=false":                   {o72, o95},
			"Observation?patient=" + p1 + "&category:missing=true":                nil,
			"Condition?patient=" + p1 + "&encounter:missing=true":                 {cond1},
			"Condition?patient=" + p1 + "&code:missing=true":                      nil,
			"Encounter?patient=" + p2 + "&date:missing=true":                      {enc2},
		} {
			if got := matchIDs(searchOK(t, s, key, q)); !sameIDs(got, want) {
				t.Errorf("%s: %v, want %v", q, got, want)
			}
		}
		wantParamError(t, s.Do(http.MethodGet, "/fhir/R4/Patient?birthdate:missing=maybe", key, nil), "birthdate:missing")
		wantParamError(t, s.Do(http.MethodGet, "/fhir/R4/Patient?gender:exact=male", key, nil), "gender:exact")
	})

	t.Run("quantity search with prefixes", func(t *testing.T) {
		for v, want := range map[string][]string{
			"72":                                  {o72},
			"72.0":                                {o72},
			"95.5":                                {o95},
			"95":                                  nil, // 95 spans [94.5, 95.5): 95.5 is outside
			"gt80":                                {o95},
			"ge95.5":                              {o95},
			"lt95.5":                              {o72},
			"le95.5":                              {o72, o95},
			"ne72":                                {o95},
			"ap100":                               {o95}, // within 10%
			"ap70":                                {o72},
			"95.5|http://unitsofmeasure.org|/min": {o95},
			"95.5||/min":                          {o95},
			"95.5|http://unitsofmeasure.org|kg":   nil,
			"gt0||/min":                           {o72, o95},
		} {
			q := "Observation?patient=" + p1 + "&value-quantity=" + url.QueryEscape(v)
			if got := matchIDs(searchOK(t, s, key, q)); !sameIDs(got, want) {
				t.Errorf("value-quantity=%s: %v, want %v", v, got, want)
			}
		}
		if got := matchIDs(searchOK(t, s, key, "Observation?patient="+p1+"&value-quantity=gt50&value-quantity=lt80")); !sameIDs(got, []string{o72}) {
			t.Errorf("a range of two conditions: %v", got)
		}
		wantParamError(t, s.Do(http.MethodGet, "/fhir/R4/Observation?value-quantity=xx5", key, nil), "value-quantity")
		wantParamError(t, s.Do(http.MethodGet, "/fhir/R4/Observation?value-quantity=5|kg", key, nil), "value-quantity")
	})

	t.Run("several _sort keys", func(t *testing.T) {
		sortFamily := "Sort" + run
		var made []string
		for _, p := range []struct{ gender, birth string }{{"female", "1980-01-01"}, {"male", "1970-01-01"}, {"female", "1990-01-01"}, {"male", "1985-01-01"}} {
			body := patientBody(sortFamily, p.gender+p.birth+run)
			body["gender"], body["birthDate"] = p.gender, p.birth
			made = append(made, createPatientBody(t, s, key, body))
		}
		want := []string{made[2], made[0], made[3], made[1]} // female newest first, then male newest first
		if got := matchIDs(searchOK(t, s, key, "Patient?family="+sortFamily+"&_sort=gender,-birthdate")); !slices.Equal(got, want) {
			t.Errorf("_sort=gender,-birthdate: %v, want %v", got, want)
		}
		slices.Reverse(want)
		if got := matchIDs(searchOK(t, s, key, "Patient?family="+sortFamily+"&_sort=-gender,birthdate")); !slices.Equal(got, want) {
			t.Errorf("_sort=-gender,birthdate: %v, want %v", got, want)
		}
		if got := matchIDs(searchOK(t, s, key, "Observation?patient="+p1+"&_sort=-value-quantity,_id")); !slices.Equal(got, []string{o95, o72}) {
			t.Errorf("_sort=-value-quantity: %v", got)
		}
		searchOK(t, s, key, "Condition?patient="+p1+"&_sort=-date,status,_lastUpdated")
		wantParamError(t, s.Do(http.MethodGet, "/fhir/R4/Patient?_sort=colour", key, nil), "_sort")
	})

	t.Run("_revinclude and _has on Patient", func(t *testing.T) {
		b := searchOK(t, s, key, "Patient?_id="+p1+"&_revinclude=Observation:patient&_revinclude=Condition:subject")
		if got := modeIDs(b, "include"); !sameIDs(got, []string{o72, o95, cond1}) || !sameIDs(modeIDs(b, "match"), []string{p1}) {
			t.Errorf("_revinclude: includes %v, matches %v", got, modeIDs(b, "match"))
		}
		b = searchOK(t, s, key, "Patient?_id="+p1+","+p2+"&_revinclude=Encounter:patient,Observation:subject")
		if got := modeIDs(b, "include"); !sameIDs(got, []string{o72, o95, o120, enc2}) {
			t.Errorf("_revinclude of two types: %v", got)
		}
		for q, want := range map[string][]string{
			"Patient?family=" + alpha + "," + beta + "," + gamma + "&_has:Observation:patient:code=http://loinc.org|8867-4": {p1, p2},
			"Patient?family=" + alpha + "," + beta + "&_has:Observation:patient:code=http://loinc.org|0000-0":               nil,
			"Patient?family=" + alpha + "," + beta + "&_has:Condition:patient:code=http://snomed.info/sct|44054006":         {p1},
			"Patient?family=" + alpha + "," + beta + "&_has:Condition:subject:code=44054006":                                {p1},
			"Patient?family=" + alpha + "," + beta + "&_has:Encounter:patient:status=finished":                              {p2},
		} {
			if got := matchIDs(searchOK(t, s, key, q)); !sameIDs(got, want) {
				t.Errorf("%s: %v, want %v", q, got, want)
			}
		}
		wantParamError(t, s.Do(http.MethodGet, "/fhir/R4/Observation?_revinclude=Observation:patient", key, nil), "_revinclude")
		wantParamError(t, s.Do(http.MethodGet, "/fhir/R4/Patient?_has:Observation:performer:code=x", key, nil), "_has:Observation:performer:code")
	})

	t.Run("chained parameters", func(t *testing.T) {
		for q, want := range map[string][]string{
			"Observation?patient.identifier=" + url.QueryEscape(mrn1):         {o72, o95},
			"Observation?subject:Patient.identifier=" + url.QueryEscape(mrn1): {o72, o95},
			"Observation?patient.family=" + beta:                              {o120},
			"Observation?patient.family=" + gamma:                             nil,
			"Observation?subject.family=" + alpha + "&value-quantity=gt90":    {o95},
			"Condition?patient.identifier=" + url.QueryEscape(mrn1):           {cond1},
			"Encounter?subject:Patient.family=" + beta:                        {enc2},
			"Condition?patient=" + p2 + "&patient.family=" + alpha:            nil, // both must hold
		} {
			if got := matchIDs(searchOK(t, s, key, q)); !sameIDs(got, want) {
				t.Errorf("%s: %v, want %v", q, got, want)
			}
		}
		wantParamError(t, s.Do(http.MethodGet, "/fhir/R4/Observation?patient.colour=x", key, nil), "patient.colour")
		wantParamError(t, s.Do(http.MethodGet, "/fhir/R4/Observation?subject:Device.identifier=x", key, nil), "subject:Device.identifier")
	})

	t.Run("conditional create by any search", func(t *testing.T) {
		// fhirpy's get_or_create: the condition in the query string.
		r := s.Do(http.MethodPost, "/fhir/R4/Patient?identifier="+url.QueryEscape(mrn1), key, patientBody("Other"+run, "s1-"+run))
		if r.Status != http.StatusOK || resourceID(t, r) != p1 {
			t.Fatalf("POST Patient?identifier= of an existing patient: %d %s", r.Status, r.Body)
		}
		r = s.Do(http.MethodPost, "/fhir/R4/Patient?family="+beta+"&gender=male", key, patientBody("Other"+run, "x-"+run))
		if r.Status != http.StatusOK || resourceID(t, r) != p2 {
			t.Fatalf("POST Patient?family=&gender=: %d %s", r.Status, r.Body)
		}
		delta := "Delta" + run
		r = s.Do(http.MethodPost, "/fhir/R4/Patient?family:exact="+delta, key, patientBody(delta, "d-"+run))
		if r.Status != http.StatusCreated {
			t.Fatalf("no match: %d %s", r.Status, r.Body)
		}
		first := resourceID(t, r)
		r = send(t, s, http.MethodPost, "/fhir/R4/Patient", key, http.Header{"If-None-Exist": {"family:exact=" + delta},
			"Content-Type": {"application/fhir+json"}}, string(mustJSON(t, patientBody(delta, "d2-"+run))))
		if r.Status != http.StatusOK || resourceID(t, r) != first {
			t.Fatalf("If-None-Exist family:exact= of the one created: %d %s", r.Status, r.Body)
		}
		wantOutcome(t, s.Do(http.MethodPost, "/fhir/R4/Patient?family="+alpha+","+beta, key, patientBody("X"+run, "x2-"+run)), http.StatusPreconditionFailed)
		wantParamError(t, s.Do(http.MethodPost, "/fhir/R4/Patient?colour=red", key, patientBody("X"+run, "x3-"+run)), "If-None-Exist")
		wantParamError(t, s.Do(http.MethodPost, "/fhir/R4/Patient?family="+alpha+"&_count=1", key, patientBody("X"+run, "x4-"+run)), "If-None-Exist")
		r = send(t, s, http.MethodPost, "/fhir/R4/Patient?family="+alpha, key, http.Header{"If-None-Exist": {"family=" + beta},
			"Content-Type": {"application/fhir+json"}}, string(mustJSON(t, patientBody("X"+run, "x5-"+run))))
		wantParamError(t, r, "If-None-Exist")
		if b := searchOK(t, s, key, "Patient?family=X"+run+",Other"+run); b.Total != 0 {
			t.Errorf("refused or matched conditional creates wrote %d patients", b.Total)
		}

		// The generic store: any of its parameters.
		r = s.Do(http.MethodPost, "/fhir/R4/Condition?patient="+p1+"&code="+url.QueryEscape("http://snomed.info/sct|44054006"), key, diabetes)
		if r.Status != http.StatusOK || resourceID(t, r) != cond1 {
			t.Fatalf("POST Condition?patient=&code= of the existing one: %d %s", r.Status, r.Body)
		}
		r = s.Do(http.MethodPost, "/fhir/R4/Condition?patient="+p2+"&code="+url.QueryEscape("http://snomed.info/sct|44054006"), key, condition("Patient/"+p2))
		if r.Status != http.StatusCreated {
			t.Fatalf("POST Condition? without a match: %d %s", r.Status, r.Body)
		}

		// Bundle entries' request.ifNoneExist: a batch and a transaction.
		batch := map[string]any{"resourceType": "Bundle", "type": "batch", "entry": []any{
			txEntry("", "Patient", "family="+beta+"&gender=male", patientBody("Other"+run, "y-"+run)),
			txEntry("", "Condition", "patient="+p1+"&code=44054006", diabetes),
			txEntry("", "Patient", "family="+alpha+","+beta, patientBody("Other"+run, "y2-"+run)),
		}}
		var out searchset
		r = s.Do(http.MethodPost, "/fhir/R4", key, batch)
		r.JSON(t, &out)
		if r.Status != http.StatusOK || len(out.Entry) != 3 || !strings.HasPrefix(out.Entry[0].Response.Status, "200") ||
			locID(out.Entry[0].Response.Location) != p2 || !strings.HasPrefix(out.Entry[1].Response.Status, "200") ||
			locID(out.Entry[1].Response.Location) != cond1 || !strings.HasPrefix(out.Entry[2].Response.Status, "412") {
			t.Fatalf("batch with conditional creates: %d %s", r.Status, r.Body)
		}
		tx := postBundle(t, s, key, txBundle(
			txEntry("urn:uuid:p-"+run, "Patient", "family="+beta+"&gender=male", patientBody("Other"+run, "z-"+run)),
			txEntry("", "Condition", "", condition("urn:uuid:p-"+run)),
		), 200, 201)
		if locID(tx.Entry[0].Response.Location) != p2 {
			t.Fatalf("transaction conditional create: %v, want Patient/%s", tx.Entry[0].Response, p2)
		}
		if c := read(t, s, key, tx.Entry[1].Response.Location); c["subject"].(map[string]any)["reference"] != "Patient/"+p2 {
			t.Errorf("the transaction's Condition names %v, want the matched Patient/%s", c["subject"], p2)
		}
	})

	t.Run("strict and lenient", func(t *testing.T) {
		wantParamError(t, s.Do(http.MethodGet, "/fhir/R4/Patient?family:contains=x", key, nil), "family:contains")
		wantParamError(t, s.Do(http.MethodGet, "/fhir/R4/Patient?colour:missing=true", key, nil), "colour:missing")
		r := send(t, s, http.MethodGet, "/fhir/R4/Patient?family="+alpha+"&family:contains=x&patient.colour=y", key, http.Header{"Prefer": {"handling=lenient"}}, "")
		var b searchset
		r.JSON(t, &b)
		if r.Status != http.StatusOK || len(modeIDs(b, "match")) != 1 || !strings.Contains(string(r.Body), "family:contains") {
			t.Errorf("lenient: %d %s", r.Status, r.Body)
		}
		// The next link leaves the ignored parameters out: page 2 works without the Prefer header.
		r = send(t, s, http.MethodGet, "/fhir/R4/Patient?family="+alpha+","+beta+"&_count=1&colour=red", key, http.Header{"Prefer": {"handling=lenient"}}, "")
		b = searchset{}
		r.JSON(t, &b)
		next := strings.TrimPrefix(b.link("next"), s.URL+"/fhir/R4/")
		if r.Status != http.StatusOK || next == "" || strings.Contains(next, "colour") {
			t.Fatalf("lenient first page: %d, next %q", r.Status, next)
		}
		if b2 := searchOK(t, s, key, next); len(matchIDs(b2)) != 1 || matchIDs(b2)[0] == matchIDs(b)[0] {
			t.Errorf("lenient page 2: %v after %v", matchIDs(b2), matchIDs(b))
		}
	})

	t.Run("tenancy, test mode and scopes", func(t *testing.T) {
		other := s.Key("northwind-health", access.Live, access.Scopes...)
		test := s.Key(demo.DemoOrgSlug, access.Test, access.Scopes...)
		for _, k := range []struct{ name, key string }{{"another organization", other}, {"a test key", test}} {
			for _, q := range []string{
				"Patient?_has:Observation:patient:code=http://loinc.org|8867-4&family=" + alpha,
				"Patient?_has:Condition:patient:code=44054006&family=" + alpha,
				"Patient?_id=" + p1 + "&_revinclude=Observation:patient&_revinclude=Condition:patient",
				"Observation?patient.identifier=" + url.QueryEscape(mrn1),
				"Observation?subject:Patient.family=" + alpha,
				"Condition?patient.identifier=" + url.QueryEscape(mrn1),
				"Observation?value-quantity=95.5&patient=" + p1,
			} {
				if b := searchOK(t, s, k.key, q); b.Total != 0 || len(b.Entry) != 0 {
					t.Errorf("%s sees %d (%d entries) through %s", k.name, b.Total, len(b.Entry), q)
				}
			}
			// Its conditional create matches nothing of this organization's real patients: a new one.
			r := s.Do(http.MethodPost, "/fhir/R4/Patient?identifier="+url.QueryEscape(mrn1), k.key, patientBody("Mine"+run, "s1-"+run))
			if r.Status != http.StatusCreated || resourceID(t, r) == p1 {
				t.Errorf("%s's conditional create: %d %s", k.name, r.Status, r.Body)
			}
			r = s.Do(http.MethodPost, "/fhir/R4/Patient?family:exact="+alpha, k.key, patientBody("Mine2"+run, "m2-"+run))
			if r.Status != http.StatusCreated || resourceID(t, r) == p1 {
				t.Errorf("%s's conditional create by family: %d %s", k.name, r.Status, r.Body)
			}
		}
		patientsOnly := s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients)
		wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/Patient?_id="+p1+"&_revinclude=Observation:patient", patientsOnly, nil), http.StatusForbidden)
		wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/Patient?_has:Observation:patient:code=8867-4", patientsOnly, nil), http.StatusForbidden)
		obsOnly := s.Key(demo.DemoOrgSlug, access.Live, access.ReadObservations)
		wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/Observation?patient.identifier="+url.QueryEscape(mrn1), obsOnly, nil), http.StatusForbidden)
		writeOnly := s.Key(demo.DemoOrgSlug, access.Live, access.WritePatients)
		wantOutcome(t, s.Do(http.MethodPost, "/fhir/R4/Patient?family="+alpha, writeOnly, patientBody("W"+run, "w-"+run)), http.StatusForbidden)
	})

	t.Run("CapabilityStatement", func(t *testing.T) {
		r := s.Do(http.MethodGet, "/fhir/R4/metadata", "", nil)
		for _, want := range []string{`"searchRevInclude"`, `"Observation:patient"`, `"value-quantity"`, "_summary", "_total", "_has", "_page"} {
			if !bytes.Contains(r.Body, []byte(want)) {
				t.Errorf("the CapabilityStatement does not mention %s", want)
			}
		}
	})
}

// TestSearchPagingWhileWriting pages through searches while another goroutine writes records
// that sort before, after and between those of the pages: no record that existed when paging
// started is repeated or skipped (keyset paging on the sort keys and the id).
func TestSearchPagingWhileWriting(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	run := fmt.Sprint(time.Now().UnixNano())
	family := "Page" + run
	given := func(n int) map[string]any {
		body := patientBody(family, fmt.Sprintf("pg-%d-%s", n, run))
		body["name"] = []any{map[string]any{"family": family, "given": []string{fmt.Sprintf("g%05d", n)}}}
		return body
	}
	var existing []string
	for n := 100; n <= 1500; n += 100 { // g00100 … g01500
		existing = append(existing, createPatientBody(t, s, key, given(n)))
	}
	cond := func(patient string, day int) map[string]any {
		c := condition("Patient/" + patient)
		c["onsetDateTime"] = fmt.Sprintf("2020-01-%02dT00:00:00Z", day)
		return c
	}
	var conds []string
	for day := 2; day <= 28; day += 2 {
		conds = append(conds, createResource(t, s, key, "Condition", cond(existing[0], day)))
	}

	walk := func(t *testing.T, first string, write func(i int) error) []string {
		t.Helper()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var writeErr error
		var written atomic.Int64
		landed := make(chan struct{}) // closed once the first write has landed or the writer has ended
		var landedOnce sync.Once
		wg.Go(func() {
			defer landedOnce.Do(func() { close(landed) })
			for i := 0; i < 60; i++ { // bounded: the walk must reach its end
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				if err := write(i); err != nil {
					writeErr = err
					return
				}
				written.Add(1)
				landedOnce.Do(func() { close(landed) })
			}
		})
		var once sync.Once
		halt := func() { once.Do(func() { close(stop) }); wg.Wait() }
		defer halt()
		var got []string
		var during int64 // writes landed before the second page was read
		next := first
		for pages := 0; next != ""; pages++ {
			if pages > 100 {
				t.Fatal("more than 100 pages")
			}
			if pages == 1 {
				<-landed // a slow machine must not turn the walk into one without writes
				during = written.Load()
			}
			b := searchOK(t, s, key, strings.TrimPrefix(next, s.URL+"/fhir/R4/"))
			got = append(got, matchIDs(b)...)
			next = b.link("next")
			if next != "" && !strings.Contains(next, "_page=") {
				t.Fatalf("the next link is not a keyset position: %s", next)
			}
			time.Sleep(20 * time.Millisecond) // let writes land between pages
		}
		halt()
		if writeErr != nil {
			t.Fatalf("writer: %v", writeErr)
		}
		if during == 0 {
			t.Fatal("no write landed between the first pages: the walk proved nothing")
		}
		t.Logf("%d records in %d writes while paging", len(got), written.Load())
		return got
	}
	check := func(t *testing.T, got, existed []string) {
		t.Helper()
		seen := map[string]int{}
		for _, id := range got {
			if seen[id]++; seen[id] == 2 {
				t.Errorf("%s repeated", id)
			}
		}
		for _, id := range existed {
			if seen[id] == 0 {
				t.Errorf("%s skipped", id)
			}
		}
	}

	t.Run("Patient by given name", func(t *testing.T) {
		// Writes before the first (g00001…), after the last (g09000…) and between every pair.
		got := walk(t, "Patient?family="+family+"&_sort=given&_count=4", func(i int) error {
			n := []int{1 + i%50, 9000 + i, 150 + 100*(i%14) + i%50}[i%3]
			return post(s, key, "/fhir/R4/Patient", given(n))
		})
		check(t, got, existing)
	})
	t.Run("Patient newest first", func(t *testing.T) {
		got := walk(t, "Patient?family="+family+"&_sort=-_lastUpdated,-given&_count=3", func(i int) error {
			return post(s, key, "/fhir/R4/Patient", given(20000+i))
		})
		check(t, got, existing)
	})
	t.Run("Condition by date", func(t *testing.T) {
		got := walk(t, "Condition?patient="+existing[0]+"&_sort=-date&_count=3", func(i int) error {
			return post(s, key, "/fhir/R4/Condition", cond(existing[0], 1+i%28))
		})
		check(t, got, conds)
	})
	t.Run("an old offset link is still served", func(t *testing.T) {
		b := searchOK(t, s, key, "Patient?family="+family+"&_sort=given&_count=3&_offset=3")
		if len(b.Entry) != 3 || !strings.Contains(b.link("next"), "_page=") || b.link("previous") == "" {
			t.Errorf("offset page: %d entries, links %v", len(b.Entry), b.Link)
		}
		wantParamError(t, s.Do(http.MethodGet, "/fhir/R4/Patient?_page=bm90IGEgY3Vyc29y", key, nil), "_page")
		wantParamError(t, s.Do(http.MethodGet, "/fhir/R4/Patient?_sort=given&_page="+cursorOf(t, b.link("next"))+"x", key, nil), "_page")
	})
}

func cursorOf(t *testing.T, link string) string {
	t.Helper()
	u, err := url.Parse(link)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query().Get("_page")
}

// post creates a resource from a goroutine (no t: a failure is returned).
func post(s *servertest.Server, key, path string, body any) error {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, s.URL+path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/fhir+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("POST %s: %d", path, resp.StatusCode)
	}
	return nil
}

func createPatientBody(t *testing.T, s *servertest.Server, key string, body map[string]any) string {
	t.Helper()
	return createResource(t, s, key, "Patient", body)
}

func createResource(t *testing.T, s *servertest.Server, key, typ string, body map[string]any) string {
	t.Helper()
	r := s.Do(http.MethodPost, "/fhir/R4/"+typ, key, body)
	if r.Status != http.StatusCreated {
		t.Fatalf("create %s: %d %s", typ, r.Status, r.Body)
	}
	return resourceID(t, r)
}

func createObservation(t *testing.T, s *servertest.Server, key string, body map[string]any) string {
	t.Helper()
	return createResource(t, s, key, "Observation", body)
}

func resourceID(t *testing.T, r *servertest.Response) string {
	t.Helper()
	var doc struct{ ID string }
	r.JSON(t, &doc)
	return doc.ID
}

// searchOK GETs a search (relative to the base) and decodes its Bundle.
func searchOK(t *testing.T, s *servertest.Server, key, q string) searchset {
	t.Helper()
	r := s.Do(http.MethodGet, "/fhir/R4/"+q, key, nil)
	var b searchset
	r.JSON(t, &b)
	if r.Status != http.StatusOK || b.Type != "searchset" {
		t.Fatalf("GET %s: %d %s", q, r.Status, r.Body)
	}
	return b
}

// wantParamError checks a 400 OperationOutcome naming param.
func wantParamError(t *testing.T, r *servertest.Response, param string) {
	t.Helper()
	wantOutcome(t, r, http.StatusBadRequest)
	if exp := expressions(t, r); !slices.Contains(strings.Fields(exp), param) {
		t.Errorf("the OperationOutcome names %q, want %s: %s", exp, param, r.Body)
	}
}

// ids are the ids of a searchset's match entries, in order.
func matchIDs(b searchset) []string { return modeIDs(b, "match") }

func modeIDs(b searchset, mode string) []string {
	var out []string
	for _, e := range b.Entry {
		if e.Search.Mode == mode {
			id, _ := e.Resource["id"].(string)
			out = append(out, id)
		}
	}
	return out
}

func sameIDs(got, want []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want)))
}

func subsetted(doc map[string]any) bool {
	meta, _ := doc["meta"].(map[string]any)
	tags, _ := meta["tag"].([]any)
	for _, tag := range tags {
		if m, _ := tag.(map[string]any); m["code"] == "SUBSETTED" {
			return true
		}
	}
	return false
}
