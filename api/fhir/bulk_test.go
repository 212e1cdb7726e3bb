package fhir_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/processors/patients"
	"carehub/storage/demo"
)

// bulkManifest is a Bulk Data completion manifest.
type bulkManifest struct {
	TransactionTime     string `json:"transactionTime"`
	Request             string `json:"request"`
	RequiresAccessToken bool   `json:"requiresAccessToken"`
	Output              []struct {
		Type  string `json:"type"`
		URL   string `json:"url"`
		Count int    `json:"count"`
	} `json:"output"`
	Error []struct {
		Type string `json:"type"`
		URL  string `json:"url"`
	} `json:"error"`
	Deleted []struct {
		Type string `json:"type"`
		URL  string `json:"url"`
	} `json:"deleted"`
}

// bulkGet sends a GET as a Bulk Data client does.
func bulkGet(t testing.TB, url, key string, header ...string) (int, http.Header, []byte) {
	t.Helper()
	var body bytes.Buffer
	status, h := bulkGetTo(t, &body, url, key, header...)
	return status, h, body.Bytes()
}

// bulkGetTo is bulkGet writing the answer's body to w, as it comes.
func bulkGetTo(t testing.TB, w io.Writer, url, key string, header ...string) (int, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Accept", "application/fhir+json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	for {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		// A client downloading many files meets the rate limit, and waits as it is told.
		if wait, _ := strconv.Atoi(resp.Header.Get("Retry-After")); resp.StatusCode == http.StatusTooManyRequests && wait > 0 {
			resp.Body.Close()
			time.Sleep(time.Duration(wait) * time.Second)
			continue
		}
		_, err = io.Copy(w, resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, resp.Header
	}
}

// kickOff starts an export at path and returns its status URL.
func kickOff(t testing.TB, s *servertest.Server, path, key string) string {
	t.Helper()
	status, h, body := bulkGet(t, s.URL+path, key, "Prefer", "respond-async")
	if status != http.StatusAccepted || h.Get("Content-Location") == "" {
		t.Fatalf("kick-off %s: %d %s", path, status, body)
	}
	return h.Get("Content-Location")
}

// bulkPost sends a POST kick-off with a Parameters body, as a Bulk Data client does.
func bulkPost(t testing.TB, url, key string, params any) (int, http.Header, []byte) {
	t.Helper()
	b, _ := json.Marshal(params)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/fhir+json")
	req.Header.Set("Accept", "application/fhir+json")
	req.Header.Set("Prefer", "respond-async")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, body
}

// kickOffPost starts an export with a POST kick-off and returns its status URL.
func kickOffPost(t testing.TB, s *servertest.Server, path, key string, params any) string {
	t.Helper()
	status, h, body := bulkPost(t, s.URL+path, key, params)
	if status != http.StatusAccepted || h.Get("Content-Location") == "" {
		t.Fatalf("POST kick-off %s: %d %s", path, status, body)
	}
	return h.Get("Content-Location")
}

// awaitManifest polls a status URL as the IG's flow does, honouring Retry-After, until the
// manifest.
func awaitManifest(t testing.TB, statusURL, key string) bulkManifest {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		status, h, body := bulkGet(t, statusURL, key)
		switch status {
		case http.StatusAccepted:
			if h.Get("X-Progress") == "" || h.Get("Retry-After") == "" {
				t.Fatalf("in progress without X-Progress and Retry-After: %v", h)
			}
			time.Sleep(200 * time.Millisecond)
			continue
		case http.StatusOK:
			var m bulkManifest
			if err := json.Unmarshal(body, &m); err != nil {
				t.Fatalf("manifest: %v: %s", err, body)
			}
			if !m.RequiresAccessToken || m.TransactionTime == "" || m.Request == "" {
				t.Fatalf("manifest lacks requiresAccessToken, transactionTime or request: %s", body)
			}
			return m
		default:
			t.Fatalf("status %s: %d %s", statusURL, status, body)
		}
	}
	t.Fatalf("export %s not complete after 90 s", statusURL)
	return bulkManifest{}
}

// download reads every output file of m: resources by type, each id once.
func download(t testing.TB, m bulkManifest, key string) map[string][]map[string]any {
	t.Helper()
	out := map[string][]map[string]any{}
	seen := map[string]bool{}
	for _, f := range m.Output {
		status, h, body := bulkGet(t, f.URL, key)
		if status != http.StatusOK || !strings.HasPrefix(h.Get("Content-Type"), "application/fhir+ndjson") {
			t.Fatalf("GET %s: %d %s %s", f.URL, status, h.Get("Content-Type"), body)
		}
		n := 0
		sc := bufio.NewScanner(bytes.NewReader(body))
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			var res map[string]any
			if err := json.Unmarshal(sc.Bytes(), &res); err != nil {
				t.Fatalf("%s line %d: %v", f.URL, n+1, err)
			}
			if res["resourceType"] != f.Type {
				t.Fatalf("%s holds a %v", f.URL, res["resourceType"])
			}
			ref := f.Type + "/" + res["id"].(string)
			if seen[ref] {
				t.Errorf("%s exported twice", ref)
			}
			seen[ref] = true
			out[f.Type] = append(out[f.Type], res)
			n++
		}
		if n != f.Count {
			t.Errorf("%s: manifest count %d, file %d", f.URL, f.Count, n)
		}
	}
	return out
}

// searchTotal is the number of type's resources a search with key finds.
func searchTotal(t testing.TB, s *servertest.Server, key, typ string) int {
	t.Helper()
	status, _, body := bulkGet(t, s.URL+"/fhir/R4/"+typ+"?_summary=count", key)
	var b struct{ Total int }
	if status != http.StatusOK || json.Unmarshal(body, &b) != nil {
		t.Fatalf("count %s: %d %s", typ, status, body)
	}
	return b.Total
}

// TestBulkExport runs the Bulk Data flow a client does (kick-off, polls, manifest, files) at the
// system, Patient and Group levels: every resource a search finds, once; a test key's export holds
// no real patient; another key reaches neither the status nor the files; cancel removes it.
func TestBulkExport(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()

	m := awaitManifest(t, kickOff(t, s, "/fhir/R4/$export", key), key)
	got := download(t, m, key)
	for _, typ := range []string{"Patient", "Observation", "Encounter", "RiskAssessment"} {
		if want := searchTotal(t, s, key, typ); len(got[typ]) != want {
			t.Errorf("system export: %d %s, a search finds %d", len(got[typ]), typ, want)
		}
	}
	if len(got["Patient"]) == 0 || len(got["Observation"]) == 0 {
		t.Fatalf("system export of the demo organization holds no patients or observations: %v", m.Output)
	}

	t.Run("another key reaches nothing", func(t *testing.T) {
		other := s.Key(demo.DemoOrgSlug, access.Live, access.Scopes...)
		if status, _, body := bulkGet(t, m.Output[0].URL, other); status != http.StatusNotFound {
			t.Errorf("another key of the same organization read a file: %d %s", status, body)
		}
	})

	t.Run("test key holds synthetic patients only", func(t *testing.T) {
		testKey := s.Key(demo.DemoOrgSlug, access.Test, access.ReadPatients, access.ReadObservations)
		got := download(t, awaitManifest(t, kickOff(t, s, "/fhir/R4/Patient/$export", testKey), testKey), testKey)
		real := "pat-" + strings.TrimPrefix(demo.RealPatientID, "pat_")
		for typ, list := range got {
			for _, res := range list {
				b, _ := json.Marshal(res)
				if bytes.Contains(b, []byte(real)) {
					t.Errorf("a test key's export holds the real patient in a %s", typ)
				}
			}
		}
		if len(got["Patient"]) == 0 {
			t.Errorf("a test key's export holds no synthetic patient")
		}
	})

	t.Run("without read:observations the observations are left out and said so", func(t *testing.T) {
		k := s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients)
		m := awaitManifest(t, kickOff(t, s, "/fhir/R4/Patient/$export", k), k)
		got := download(t, m, k)
		if len(got["Observation"]) > 0 || len(m.Error) != 1 {
			t.Fatalf("observations %d, error files %v", len(got["Observation"]), m.Error)
		}
		status, _, body := bulkGet(t, m.Error[0].URL, k)
		if status != http.StatusOK || !bytes.Contains(body, []byte("read:observations")) {
			t.Errorf("error file: %d %s", status, body)
		}
	})

	t.Run("_since lists what was deleted since", func(t *testing.T) {
		since := time.Now().UTC().Add(-time.Second).Format(time.RFC3339)
		pat := createPatient(t, s, key, "Deleted")
		r := s.Do(http.MethodPost, "/fhir/R4/Practitioner", key, map[string]any{"resourceType": "Practitioner", "name": []any{map[string]any{"family": "Gone"}}})
		var pr struct{ ID string }
		r.JSON(t, &pr)
		if r.Status != http.StatusCreated {
			t.Fatalf("create practitioner: %d %s", r.Status, r.Body)
		}
		for _, path := range []string{"/fhir/R4/Patient/" + pat, "/fhir/R4/Practitioner/" + pr.ID} {
			if r := s.Do(http.MethodDelete, path, key, nil); r.Status/100 != 2 {
				t.Fatalf("DELETE %s: %d %s", path, r.Status, r.Body)
			}
		}
		m := awaitManifest(t, kickOff(t, s, "/fhir/R4/$export?_since="+url.QueryEscape(since), key), key)
		if len(m.Deleted) != 1 || m.Deleted[0].Type != "Bundle" {
			t.Fatalf("deleted files %+v, want one of Bundles", m.Deleted)
		}
		status, _, body := bulkGet(t, m.Deleted[0].URL, key)
		var deleted []string
		for line := range strings.SplitSeq(strings.TrimSpace(string(body)), "\n") {
			var b struct {
				ResourceType, Type string
				Entry              []struct{ Request struct{ Method, URL string } }
			}
			if err := json.Unmarshal([]byte(line), &b); err != nil || b.ResourceType != "Bundle" || b.Type != "transaction" ||
				len(b.Entry) != 1 || b.Entry[0].Request.Method != "DELETE" {
				t.Fatalf("deleted line %q", line)
			}
			deleted = append(deleted, b.Entry[0].Request.URL)
		}
		slices.Sort(deleted)
		if want := []string{"Patient/" + pat, "Practitioner/" + pr.ID}; status != http.StatusOK || !slices.Equal(deleted, want) {
			t.Errorf("deleted file %d: %v, want %v", status, deleted, want)
		}
		// Neither is in the output, and a test key's export of the same lists the real deletions of
		// nobody (the patient was created by a live key: real).
		for _, f := range m.Output {
			_, _, b := bulkGet(t, f.URL, key)
			if bytes.Contains(b, []byte(pat)) || bytes.Contains(b, []byte(pr.ID)) {
				t.Errorf("%s holds a deleted resource", f.URL)
			}
		}
		testKey := s.Key(demo.DemoOrgSlug, access.Test, access.ReadPatients, access.ReadObservations)
		if tm := awaitManifest(t, kickOff(t, s, "/fhir/R4/$export?_since="+url.QueryEscape(since), testKey), testKey); len(tm.Deleted) != 0 {
			t.Errorf("a test key's export lists real deletions: %+v", tm.Deleted)
		}
	})

	t.Run("_type and _typeFilter", func(t *testing.T) {
		m := awaitManifest(t, kickOff(t, s, "/fhir/R4/$export?_type=Observation&_typeFilter="+
			"Observation%3Fcode%3Dhttp%3A%2F%2Floinc.org%7C8867-4", key), key)
		got := download(t, m, key)
		if len(got) != 1 || len(got["Observation"]) == 0 {
			t.Fatalf("got types %v", m.Output)
		}
		for _, o := range got["Observation"] {
			b, _ := json.Marshal(o["code"])
			if !bytes.Contains(b, []byte(`"8867-4"`)) {
				t.Fatalf("a filtered export holds %s", b)
			}
		}
	})

	var groupID string // the group's, for the POST kick-off
	t.Run("group", func(t *testing.T) {
		members := []string{demo.DeterioratingPatientID, demo.StablePatientID}
		group := map[string]any{"resourceType": "Group", "type": "person", "actual": true, "member": []any{
			map[string]any{"entity": map[string]any{"reference": "Patient/" + members[0]}},
			map[string]any{"entity": map[string]any{"reference": "Patient/" + members[1]}}}}
		r := s.Do(http.MethodPost, "/fhir/R4/Group", key, group)
		var created struct{ ID string }
		if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &created) != nil {
			t.Fatalf("create group: %d %s", r.Status, r.Body)
		}
		groupID = created.ID
		got := download(t, awaitManifest(t, kickOff(t, s, "/fhir/R4/Group/"+created.ID+"/$export", key), key), key)
		if len(got["Patient"]) != 2 {
			t.Fatalf("group export: %d patients", len(got["Patient"]))
		}
		for _, o := range got["Observation"] {
			ref := o["subject"].(map[string]any)["reference"].(string)
			if ref != "Patient/pat-"+strings.TrimPrefix(members[0], "pat_") && ref != "Patient/pat-"+strings.TrimPrefix(members[1], "pat_") {
				t.Fatalf("group export holds an observation of %s", ref)
			}
		}
	})

	t.Run("POST kick-off with patient", func(t *testing.T) {
		one := "Patient/pat-" + strings.TrimPrefix(demo.StablePatientID, "pat_")
		params := map[string]any{"resourceType": "Parameters", "parameter": []any{
			map[string]any{"name": "_type", "valueString": "Patient,Observation"},
			map[string]any{"name": "patient", "valueReference": map[string]any{"reference": one}}}}
		for _, path := range []string{"/fhir/R4/Patient/$export", "/fhir/R4/Group/" + groupID + "/$export"} {
			got := download(t, awaitManifest(t, kickOffPost(t, s, path, key, params), key), key)
			if len(got["Patient"]) != 1 || got["Patient"][0]["id"] != strings.TrimPrefix(one, "Patient/") {
				t.Fatalf("%s for %s: patients %v", path, one, got["Patient"])
			}
			if len(got["Observation"]) == 0 {
				t.Errorf("%s for %s: no observations", path, one)
			}
			for _, o := range got["Observation"] {
				if ref := o["subject"].(map[string]any)["reference"]; ref != one {
					t.Fatalf("%s for %s holds an observation of %v", path, one, ref)
				}
			}
		}
		for _, c := range []struct {
			path   string
			params map[string]any
			want   int
		}{
			{"/fhir/R4/$export", params, http.StatusUnprocessableEntity},
			{"/fhir/R4/Patient/$export", map[string]any{"resourceType": "Parameters", "parameter": []any{
				map[string]any{"name": "patient", "valueReference": map[string]any{"reference": "Patient/pat-nobody"}}}}, http.StatusUnprocessableEntity},
			{"/fhir/R4/Patient/$export", map[string]any{"resourceType": "Bundle"}, http.StatusBadRequest},
			{"/fhir/R4/Patient/$export", map[string]any{"resourceType": "Parameters", "parameter": []any{
				map[string]any{"name": "patient", "valueString": one}}}, http.StatusBadRequest},
		} {
			if status, _, body := bulkPost(t, s.URL+c.path, key, c.params); status != c.want {
				t.Errorf("POST %s %v: %d %s, want %d", c.path, c.params, status, body, c.want)
			}
		}
		if status, _, body := bulkGet(t, s.URL+"/fhir/R4/Patient/$export?patient="+one, key, "Prefer", "respond-async"); status != http.StatusBadRequest {
			t.Errorf("GET with patient: %d %s, want 400", status, body)
		}
	})

	t.Run("a group defined by characteristics exports the patients that match them", func(t *testing.T) {
		// Two patients with a condition no demo patient has, one female and one male; a third
		// female without it.
		mk := func(family, gender string) string {
			r := s.Do(http.MethodPost, "/fhir/R4/Patient", key, map[string]any{"resourceType": "Patient", "gender": gender,
				"birthDate": "1960-05-01", "name": []any{map[string]any{"family": family}}})
			var p struct{ ID string }
			if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &p) != nil {
				t.Fatalf("create patient: %d %s", r.Status, r.Body)
			}
			return p.ID
		}
		diabetic := map[string]any{"coding": []any{map[string]any{"system": "http://snomed.info/sct", "code": "44054006"}}}
		she, he, other := mk("Cohort-She", "female"), mk("Cohort-He", "male"), mk("Cohort-Other", "female")
		for _, pat := range []string{she, he} {
			if r := s.Do(http.MethodPost, "/fhir/R4/Condition", key, map[string]any{"resourceType": "Condition", "code": diabetic,
				"subject": map[string]any{"reference": "Patient/" + pat}}); r.Status != http.StatusCreated {
				t.Fatalf("create condition: %d %s", r.Status, r.Body)
			}
		}
		characteristic := func(code string, value map[string]any, exclude bool) map[string]any {
			c := map[string]any{"code": map[string]any{"coding": []any{map[string]any{"system": "http://snomed.info/sct", "code": code}}}, "exclude": exclude}
			for k, v := range value {
				c[k] = v
			}
			return c
		}
		hasDiabetes := characteristic("404684003", map[string]any{"valueCodeableConcept": diabetic}, false)
		female := func(exclude bool) map[string]any {
			return characteristic("263495000", map[string]any{"valueCodeableConcept": map[string]any{"coding": []any{
				map[string]any{"system": "http://hl7.org/fhir/administrative-gender", "code": "female"}}}}, exclude)
		}
		aged := characteristic("397669002", map[string]any{"valueRange": map[string]any{"low": map[string]any{"value": 40, "unit": "a"},
			"high": map[string]any{"value": 90, "unit": "a"}}}, false)
		for name, c := range map[string]struct {
			chars []any
			want  []string
		}{
			"female with diabetes, 40 to 90": {[]any{hasDiabetes, female(false), aged}, []string{she}},
			"with diabetes, not female":      {[]any{hasDiabetes, female(true)}, []string{he}},
			"with diabetes":                  {[]any{hasDiabetes}, []string{he, she}},
		} {
			group := map[string]any{"resourceType": "Group", "type": "person", "actual": false, "characteristic": c.chars}
			r := s.Do(http.MethodPost, "/fhir/R4/Group", key, group)
			var created struct{ ID string }
			if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &created) != nil {
				t.Fatalf("create group: %d %s", r.Status, r.Body)
			}
			got := download(t, awaitManifest(t, kickOff(t, s, "/fhir/R4/Group/"+created.ID+"/$export?_type=Patient", key), key), key)
			var ids []string
			for _, p := range got["Patient"] {
				ids = append(ids, p["id"].(string))
			}
			slices.Sort(ids)
			want := slices.Sorted(slices.Values(c.want))
			if !slices.Equal(ids, want) || slices.Contains(ids, other) {
				t.Errorf("%s: exported %v, want %v", name, ids, want)
			}
		}
		group := map[string]any{"resourceType": "Group", "type": "person", "actual": false, "characteristic": []any{
			characteristic("363698007", map[string]any{"valueCodeableConcept": diabetic}, false)}}
		r := s.Do(http.MethodPost, "/fhir/R4/Group", key, group)
		var created struct{ ID string }
		if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &created) != nil {
			t.Fatalf("create group: %d %s", r.Status, r.Body)
		}
		if status, _, body := bulkGet(t, s.URL+"/fhir/R4/Group/"+created.ID+"/$export", key, "Prefer", "respond-async"); status != http.StatusUnprocessableEntity ||
			!bytes.Contains(body, []byte("characteristic[0]")) {
			t.Errorf("a characteristic carehub does not read: %d %s, want 422 naming it", status, body)
		}
	})

	t.Run("a group of inactive members exports nobody", func(t *testing.T) {
		group := map[string]any{"resourceType": "Group", "type": "person", "actual": true, "member": []any{
			map[string]any{"entity": map[string]any{"reference": "Patient/" + demo.StablePatientID}, "inactive": true}}}
		r := s.Do(http.MethodPost, "/fhir/R4/Group", key, group)
		var created struct{ ID string }
		if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &created) != nil {
			t.Fatalf("create group: %d %s", r.Status, r.Body)
		}
		got := download(t, awaitManifest(t, kickOff(t, s, "/fhir/R4/Group/"+created.ID+"/$export", key), key), key)
		for typ, list := range got {
			if len(list) > 0 {
				t.Errorf("a group with no active member exported %d %s", len(list), typ)
			}
		}
	})

	t.Run("refusals", func(t *testing.T) {
		for _, c := range []struct {
			path, prefer string
			want         int
		}{
			{"/fhir/R4/$export", "", http.StatusBadRequest},
			{"/fhir/R4/$export?_outputFormat=text/csv", "respond-async", http.StatusBadRequest},
			{"/fhir/R4/$export?_since=yesterday", "respond-async", http.StatusBadRequest},
			{"/fhir/R4/$export?_type=Nonsense", "respond-async", http.StatusUnprocessableEntity},
			{"/fhir/R4/$export?colour=blue", "respond-async", http.StatusBadRequest},
			{"/fhir/R4/$export?includeAssociatedData=LatestProvenanceResources", "respond-async", http.StatusBadRequest},
			{"/fhir/R4/Patient/$export?_type=Organization", "respond-async", http.StatusUnprocessableEntity},
		} {
			status, _, body := bulkGet(t, s.URL+c.path, key, "Prefer", c.prefer)
			if status != c.want || !bytes.Contains(body, []byte(`"OperationOutcome"`)) {
				t.Errorf("%s (Prefer %q): %d %s, want %d and an OperationOutcome", c.path, c.prefer, status, body, c.want)
			}
		}
		// What the IG lets a client ask: a parameter the server does not serve is ignored, and
		// said so, under Prefer: handling=lenient.
		status, _, body := bulkGet(t, s.URL+"/fhir/R4/$export?_type=Patient&includeAssociatedData=LatestProvenanceResources", key,
			"Prefer", "respond-async, handling=lenient")
		if status != http.StatusAccepted || !bytes.Contains(body, []byte(`ignored (Prefer: handling=lenient): includeAssociatedData`)) {
			t.Errorf("lenient kick-off: %d %s", status, body)
		}
		billing := s.Key(demo.DemoOrgSlug, access.Live, access.AdminBilling)
		if status, _, body := bulkGet(t, s.URL+"/fhir/R4/$export", billing, "Prefer", "respond-async"); status != http.StatusForbidden {
			t.Errorf("a key without read:patients: %d %s", status, body)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		statusURL := kickOff(t, s, "/fhir/R4/$export", key)
		req, _ := http.NewRequest(http.MethodDelete, statusURL, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("cancel: %d", resp.StatusCode)
		}
		if status, _, _ := bulkGet(t, statusURL, key); status != http.StatusNotFound {
			t.Errorf("status after cancel: %d", status)
		}
	})
}

// TestBulkExportResumes kills a runner mid-export (its context ends between parts, as a node's
// does when it is killed: what it had not committed is gone) and lets another take the job up
// once the lease runs out: the files hold every resource once.
func TestBulkExportResumes(t *testing.T) {
	s := servertest.Start(t, servertest.WithRoles("api")) // no runner of its own
	key := s.DemoKey()
	// Two types, written by the runner's two lanes at once: each resumes where its own last
	// part ended.
	statusURL := kickOff(t, s, "/fhir/R4/$export?_type=Observation,Patient", key)
	svc, keys := interruptExport(t, s)
	if ran, err := svc.ExportRunner(patients.ExportRunnerConfig{Credential: keys, PartResources: 50}).RunOne(t.Context()); !ran || err != nil {
		t.Fatalf("resume: ran %v, %v", ran, err)
	}
	got := download(t, awaitManifest(t, statusURL, key), key)
	for _, typ := range []string{"Observation", "Patient"} {
		if want := searchTotal(t, s, key, typ); len(got[typ]) != want {
			t.Errorf("after the kill: %d %s exported, a search finds %d", len(got[typ]), typ, want)
		}
	}

	// A revoked key's export fails instead of running.
	kickOff(t, s, "/fhir/R4/$export?_type=Patient", key)
	revoked := func(context.Context, string) (*access.Principal, error) { return nil, fault.Unauthenticated("revoked") }
	if ran, _ := svc.ExportRunner(patients.ExportRunnerConfig{Credential: revoked}).RunOne(t.Context()); !ran {
		t.Fatal("no export to run")
	}
	var failed int
	_ = s.Pool().QueryRow(t.Context(), `select count(*) from bulk_exports where status = 'failed'`).Scan(&failed)
	if failed != 1 {
		t.Errorf("%d failed exports, want the revoked key's", failed)
	}
}

// interruptExport runs the pending export with a runner of parts of 50 resources, kills the
// runner once it has written some, and lets its lease run out. It returns the service and
// credential lookup the next runner uses.
func interruptExport(t *testing.T, s *servertest.Server) (*patients.Service, func(context.Context, string) (*access.Principal, error)) {
	t.Helper()
	svc := patients.New(s.Pool())
	keys := func(ctx context.Context, keyID string) (*access.Principal, error) {
		return &access.Principal{OrgID: s.OrgID(demo.DemoOrgSlug), KeyID: keyID, Mode: access.Live, Scopes: access.Scopes}, nil
	}
	ctx, kill := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := svc.ExportRunner(patients.ExportRunnerConfig{Credential: keys, PartResources: 50}).RunOne(ctx)
		done <- err
	}()
	var written int64
	servertest.Eventually(t, 30*time.Second, "the first parts written", func() bool {
		_ = s.Pool().QueryRow(t.Context(), `select written from bulk_exports where status = 'in-progress'`).Scan(&written)
		return written > 0
	})
	kill()
	<-done
	var status string
	if err := s.Pool().QueryRow(t.Context(), `select status, written from bulk_exports order by created_at desc limit 1`).Scan(&status, &written); err != nil {
		t.Fatal(err)
	}
	if status != patients.ExportInProgress {
		t.Fatalf("the export finished before the kill (%s, %d written): the test proves nothing", status, written)
	}
	t.Logf("killed after %d resources", written)
	if _, err := s.Pool().Exec(t.Context(), `update bulk_exports set lease_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	return svc, keys
}

// TestBulkExportFilesLost: the files are in an unlogged table, which PostgreSQL empties when it
// recovers from a crash (and a promoted standby never had). A job in progress whose files are
// gone starts again; a completed one answers in progress again and is made anew; either way
// every resource is in its files once.
func TestBulkExportFilesLost(t *testing.T) {
	s := servertest.Start(t, servertest.WithRoles("api")) // no runner of its own
	key := s.DemoKey()
	var persistence string
	if err := s.Pool().QueryRow(t.Context(), `select relpersistence from pg_class where relname = 'bulk_export_files'`).Scan(&persistence); err != nil {
		t.Fatal(err)
	}
	if persistence != "u" {
		t.Fatalf("bulk_export_files relpersistence %q, want unlogged (u): the test would not be what a crash does", persistence)
	}
	lose := func() { // what crash recovery does to an unlogged table
		if _, err := s.Pool().Exec(t.Context(), `truncate bulk_export_files`); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string, got map[string][]map[string]any) {
		t.Helper()
		for _, typ := range []string{"Observation", "Patient"} {
			if want := searchTotal(t, s, key, typ); len(got[typ]) != want {
				t.Errorf("%s: %d %s exported, a search finds %d", when, len(got[typ]), typ, want)
			}
		}
	}
	statusURL := kickOff(t, s, "/fhir/R4/$export?_type=Observation,Patient", key)
	svc, keys := interruptExport(t, s)
	lose()
	runner := svc.ExportRunner(patients.ExportRunnerConfig{Credential: keys, PartResources: 50})
	if ran, err := runner.RunOne(t.Context()); !ran || err != nil {
		t.Fatalf("resume: ran %v, %v", ran, err)
	}
	check("files lost mid-export", download(t, awaitManifest(t, statusURL, key), key))

	lose()
	if status, _, body := bulkGet(t, statusURL, key); status != http.StatusAccepted {
		t.Fatalf("status of a completed export whose files are lost: %d %s, want 202 (made again)", status, body)
	}
	if ran, err := runner.RunOne(t.Context()); !ran || err != nil {
		t.Fatalf("made again: ran %v, %v", ran, err)
	}
	check("files lost after completion", download(t, awaitManifest(t, statusURL, key), key))
}

// TestBulkExportFilesCompressed: a part is stored as S2 (schemas/postgres 0044) and served as
// the NDJSON it holds; a part stored before, as NDJSON ('identity'), is served the same.
func TestBulkExportFilesCompressed(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	m := awaitManifest(t, kickOff(t, s, "/fhir/R4/$export?_type=Observation,Patient", key), key)
	served := map[string][]byte{}
	for _, f := range m.Output {
		status, _, body := bulkGet(t, f.URL, key)
		if status != http.StatusOK || len(body) == 0 {
			t.Fatalf("GET %s: %d %.300s", f.URL, status, body)
		}
		served[f.URL] = body
	}
	rows, err := s.Pool().Query(t.Context(), `select export_id, type, part, ndjson, coding from bulk_export_files`)
	if err != nil {
		t.Fatal(err)
	}
	type file struct {
		export, typ string
		part        int
		ndjson      []byte
	}
	var files []file
	var stored, plain int
	for rows.Next() {
		var f file
		var coding string
		if err := rows.Scan(&f.export, &f.typ, &f.part, &f.ndjson, &coding); err != nil {
			t.Fatal(err)
		}
		if coding != "s2" {
			t.Fatalf("%s part %d stored as %q, want s2", f.typ, f.part, coding)
		}
		stored += len(f.ndjson)
		if f.ndjson, err = s2.Decode(nil, f.ndjson); err != nil {
			t.Fatalf("%s part %d: %v", f.typ, f.part, err)
		}
		plain += len(f.ndjson)
		files = append(files, f)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(files) != len(m.Output) {
		t.Fatalf("%d parts stored, the manifest lists %d", len(files), len(m.Output))
	}
	t.Logf("%d parts: %d bytes of NDJSON stored in %d", len(files), plain, stored)
	if stored >= plain {
		t.Errorf("stored %d bytes for %d of NDJSON: not compressed", stored, plain)
	}
	for _, f := range files { // as a node before 0044 stored them
		if _, err := s.Pool().Exec(t.Context(), `update bulk_export_files set ndjson = $4, coding = 'identity'
			where export_id = $1 and type = $2 and part = $3`, f.export, f.typ, f.part, f.ndjson); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range m.Output {
		if status, _, body := bulkGet(t, f.URL, key); status != http.StatusOK || !bytes.Equal(body, served[f.URL]) {
			t.Errorf("GET %s of a part stored as NDJSON: %d, %d bytes, want the %d served from S2", f.URL, status, len(body), len(served[f.URL]))
		}
	}
}
