package fhir_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/kernel/ids"
	"carehub/storage/demo"
)

// historyBundle is a history Bundle as R4 shapes it.
type historyBundle struct {
	ResourceType, Type string
	Total              *int
	Link               []struct{ Relation, URL string }
	Entry              []struct {
		FullURL  string
		Resource json.RawMessage
		Request  *struct{ Method, URL string }
		Response *struct{ Status, Etag, LastModified, Location string }
	}
}

func (b historyBundle) next() string {
	for _, l := range b.Link {
		if l.Relation == "next" {
			return l.URL
		}
	}
	return ""
}

// getHistory reads a history Bundle and checks R4's rules for one (bdl-3, bdl-4, bdl-5): type
// history, every entry with fullUrl, request and response, a resource unless a DELETE, entries
// newest first.
func getHistory(t *testing.T, s *servertest.Server, key, path string) historyBundle {
	t.Helper()
	r := s.Do(http.MethodGet, path, key, nil)
	var b historyBundle
	r.JSON(t, &b)
	if r.Status != http.StatusOK || b.ResourceType != "Bundle" || b.Type != "history" {
		t.Fatalf("GET %s: %d %s, want a history Bundle", path, r.Status, r.Body)
	}
	var prev time.Time
	for i, e := range b.Entry {
		if e.FullURL == "" || e.Request == nil || e.Response == nil || e.Request.Method == "" || e.Request.URL == "" ||
			e.Response.Status == "" || e.Response.Etag == "" || e.Response.LastModified == "" {
			t.Fatalf("GET %s: entry %d lacks fullUrl, request or response: %s", path, i, r.Body)
		}
		if (e.Request.Method == http.MethodDelete) != (len(e.Resource) == 0) {
			t.Fatalf("GET %s: entry %d: %s with resource %s", path, i, e.Request.Method, e.Resource)
		}
		at, err := time.Parse(time.RFC3339Nano, e.Response.LastModified)
		if err != nil || i > 0 && at.After(prev) {
			t.Fatalf("GET %s: entry %d at %s after entry %d at %s: not newest first", path, i, e.Response.LastModified, i-1, prev)
		}
		prev = at
	}
	return b
}

// relative is a Bundle link as a path on the test server.
func relative(s *servertest.Server, u string) string {
	_, rest, _ := strings.Cut(u, "/fhir/R4")
	return "/fhir/R4" + rest
}

func putPatient(s *servertest.Server, key, id, family, ifMatch string) *servertest.Response {
	body := patientBody(family, "mrn-"+id)
	body["id"] = id
	h := http.Header{"Content-Type": {"application/fhir+json"}}
	if ifMatch != "" {
		h.Set("If-Match", ifMatch)
	}
	b, _ := json.Marshal(body)
	return sendQuiet(s, http.MethodPut, "/fhir/R4/Patient/"+id, key, h, string(b))
}

// sendQuiet is send without a *testing.T, for goroutines; a transport error is status 0.
func sendQuiet(s *servertest.Server, method, path, key string, header http.Header, body string) *servertest.Response {
	req, err := http.NewRequest(method, s.URL+path, strings.NewReader(body))
	if err != nil {
		return &servertest.Response{}
	}
	req.Header = header.Clone()
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return &servertest.Response{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return &servertest.Response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

func family(t *testing.T, r *servertest.Response) (string, string) {
	t.Helper()
	var pt struct {
		Name []struct{ Family string }
		Meta struct{ VersionID string }
	}
	r.JSON(t, &pt)
	if len(pt.Name) == 0 {
		t.Fatalf("no name: %s", r.Body)
	}
	return pt.Name[0].Family, pt.Meta.VersionID
}

func issueCode(t *testing.T, r *servertest.Response) string {
	t.Helper()
	var oo outcome
	r.JSON(t, &oo)
	if oo.ResourceType != "OperationOutcome" || len(oo.Issue) == 0 {
		t.Fatalf("not an OperationOutcome: %d %s", r.Status, r.Body)
	}
	return oo.Issue[0].Code
}

// TestVersionedUpdate: If-Match on PUT Patient is checked in the update's transaction: a stale
// version is 412 and writes nothing, and of concurrent writers holding the same version exactly
// one wins.
func TestVersionedUpdate(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	run := fmt.Sprint(time.Now().UnixNano())
	id := createPatient(t, s, key, "Versioned"+run)

	r := putPatient(s, key, id, "Second"+run, `W/"1"`)
	if r.Status != http.StatusOK || r.Header.Get("ETag") != `W/"2"` || r.Header.Get("Last-Modified") == "" {
		t.Fatalf("update at the current version: %d %s %s", r.Status, r.Header, r.Body)
	}
	if _, err := http.ParseTime(r.Header.Get("Last-Modified")); err != nil {
		t.Fatalf("Last-Modified %q is not an HTTP date: %v", r.Header.Get("Last-Modified"), err)
	}

	t.Run("the CapabilityStatement says so", func(t *testing.T) {
		var cs struct {
			Rest []struct {
				Resource []struct {
					Type, Versioning, ConditionalRead string
					Interaction                       []struct{ Code string }
				}
				Interaction []struct{ Code string }
			}
		}
		s.Do(http.MethodGet, "/fhir/R4/metadata", "", nil).JSON(t, &cs)
		got := map[string]string{}
		for _, res := range cs.Rest[0].Resource {
			codes := ""
			for _, i := range res.Interaction {
				codes += " " + i.Code
			}
			got[res.Type] = res.Versioning + " " + res.ConditionalRead + codes
		}
		if !strings.HasPrefix(got["Patient"], "versioned-update full-support") || !strings.Contains(got["Patient"], " delete") ||
			!strings.Contains(got["Observation"], "full-support") || !strings.Contains(got["Observation"], "history-type") {
			t.Fatalf("CapabilityStatement: %v", got)
		}
	})

	t.Run("a stale If-Match is 412 and overwrites nothing", func(t *testing.T) {
		r := putPatient(s, key, id, "Stale"+run, `W/"1"`)
		wantOutcome(t, r, http.StatusPreconditionFailed)
		if code := issueCode(t, r); code != "conflict" {
			t.Fatalf("issue code %q, want conflict", code)
		}
		got, v := family(t, s.Do(http.MethodGet, "/fhir/R4/Patient/"+id, key, nil))
		if got != "Second"+run || v != "2" {
			t.Fatalf("after a stale update: %s version %s, want Second%s version 2", got, v, run)
		}
	})

	t.Run("a malformed If-Match is 400", func(t *testing.T) {
		wantOutcome(t, putPatient(s, key, id, "Bad"+run, `W/"two"`), http.StatusBadRequest)
	})

	t.Run("concurrent writers with the same If-Match: exactly one wins", func(t *testing.T) {
		const writers = 8
		res := make([]*servertest.Response, writers)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range writers {
			wg.Go(func() {
				<-start
				res[i] = putPatient(s, key, id, fmt.Sprintf("Writer%d-%s", i, run), `W/"2"`)
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, r := range res {
			switch r.Status {
			case http.StatusOK:
				if winner >= 0 {
					t.Fatalf("writers %d and %d both won with If-Match W/\"2\"", winner, i)
				}
				winner = i
			case http.StatusPreconditionFailed:
			default:
				t.Fatalf("writer %d: %d %s", i, r.Status, r.Body)
			}
		}
		if winner < 0 {
			t.Fatal("no writer won")
		}
		got, v := family(t, s.Do(http.MethodGet, "/fhir/R4/Patient/"+id, key, nil))
		if got != fmt.Sprintf("Writer%d-%s", winner, run) || v != "3" {
			t.Fatalf("stored %s version %s, want writer %d's at version 3", got, v, winner)
		}
		b := getHistory(t, s, key, "/fhir/R4/Patient/"+id+"/_history")
		if len(b.Entry) != 3 {
			t.Fatalf("history has %d versions, want 3 (create, update, the one winner)", len(b.Entry))
		}
	})
}

// TestConditionalRead: ETag and Last-Modified on reads; If-None-Match and If-Modified-Since
// answer 304 when the client's copy is current.
func TestConditionalRead(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	created := s.Do(http.MethodPost, "/fhir/R4/Patient", key, patientBody(fmt.Sprint("Conditional", time.Now().UnixNano()), "mrn-c"))
	var pt struct{ ID string }
	created.JSON(t, &pt)
	if created.Status != http.StatusCreated || created.Header.Get("ETag") != `W/"1"` || created.Header.Get("Last-Modified") == "" {
		t.Fatalf("create: %d %s", created.Status, created.Header)
	}
	id := pt.ID
	path := "/fhir/R4/Patient/" + id
	first := s.Do(http.MethodGet, path, key, nil)
	tag, modified := first.Header.Get("ETag"), first.Header.Get("Last-Modified")
	if first.Status != http.StatusOK || tag != `W/"1"` || modified == "" {
		t.Fatalf("read: %d ETag %q Last-Modified %q", first.Status, tag, modified)
	}
	lm, err := http.ParseTime(modified)
	if err != nil {
		t.Fatalf("Last-Modified %q: %v", modified, err)
	}
	get := func(path string, h http.Header) *servertest.Response {
		return send(t, s, http.MethodGet, path, key, h, "")
	}
	for _, c := range []struct {
		name   string
		path   string
		header http.Header
		want   int
	}{
		{"If-None-Match current", path, http.Header{"If-None-Match": {tag}}, http.StatusNotModified},
		{"If-None-Match strong form", path, http.Header{"If-None-Match": {`"1"`}}, http.StatusNotModified},
		{"If-None-Match stale", path, http.Header{"If-None-Match": {`W/"7"`}}, http.StatusOK},
		{"If-Modified-Since the Last-Modified", path, http.Header{"If-Modified-Since": {modified}}, http.StatusNotModified},
		{"If-Modified-Since an hour before", path, http.Header{"If-Modified-Since": {lm.Add(-time.Hour).Format(http.TimeFormat)}}, http.StatusOK},
		{"vread If-None-Match", path + "/_history/1", http.Header{"If-None-Match": {tag}}, http.StatusNotModified},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := get(c.path, c.header)
			if r.Status != c.want || r.Header.Get("ETag") != tag || r.Header.Get("Last-Modified") != modified {
				t.Fatalf("%d ETag %q Last-Modified %q, want %d with %s, %s", r.Status, r.Header.Get("ETag"), r.Header.Get("Last-Modified"), c.want, tag, modified)
			}
			if c.want == http.StatusNotModified && len(r.Body) != 0 {
				t.Fatalf("304 with a body: %s", r.Body)
			}
		})
	}

	t.Run("Observation read", func(t *testing.T) {
		var b searchset
		s.Do(http.MethodGet, "/fhir/R4/Observation?patient="+demo.DeterioratingPatientID+"&_count=1", key, nil).JSON(t, &b)
		if len(b.Entry) == 0 {
			t.Fatal("the demo patient has no observations")
		}
		obs := "/fhir/R4/Observation/" + b.Entry[0].Resource["id"].(string)
		r := get(obs, nil)
		if r.Status != http.StatusOK || r.Header.Get("ETag") != `W/"1"` || r.Header.Get("Last-Modified") == "" {
			t.Fatalf("observation read: %d %s", r.Status, r.Header)
		}
		if again := get(obs, http.Header{"If-Modified-Since": {r.Header.Get("Last-Modified")}}); again.Status != http.StatusNotModified {
			t.Fatalf("observation If-Modified-Since: %d", again.Status)
		}
	})
}

// TestHistory: history Bundles at instance, type and system level are valid R4 history Bundles,
// page through next links without repeating or skipping a version, and keep tenancy and scopes.
func TestHistory(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	run := fmt.Sprint(time.Now().UnixNano())
	id := createPatient(t, s, key, "History"+run)
	for i, v := range []string{`W/"1"`, `W/"2"`} {
		if r := putPatient(s, key, id, fmt.Sprintf("History%d-%s", i, run), v); r.Status != http.StatusOK {
			t.Fatalf("update: %d %s", r.Status, r.Body)
		}
	}

	t.Run("instance", func(t *testing.T) {
		b := getHistory(t, s, key, "/fhir/R4/Patient/"+id+"/_history")
		want := []struct{ method, url, etag string }{{"PUT", "Patient/" + id, `W/"3"`}, {"PUT", "Patient/" + id, `W/"2"`}, {"POST", "Patient", `W/"1"`}}
		if len(b.Entry) != len(want) || b.Total == nil || *b.Total != 3 {
			t.Fatalf("%d entries, want 3", len(b.Entry))
		}
		for i, w := range want {
			e := b.Entry[i]
			if e.Request.Method != w.method || e.Request.URL != w.url || e.Response.Etag != w.etag || !strings.HasSuffix(e.FullURL, "/fhir/R4/Patient/"+id) {
				t.Fatalf("entry %d: %+v %+v %s, want %v", i, *e.Request, *e.Response, e.FullURL, w)
			}
		}
	})

	t.Run("type, paged", func(t *testing.T) {
		seen := map[string]bool{}
		path := "/fhir/R4/Patient/_history?_count=2"
		var last time.Time
		for pages := 0; path != "" && pages < 4; pages++ {
			b := getHistory(t, s, key, path)
			if len(b.Entry) > 2 {
				t.Fatalf("page of %d entries with _count=2", len(b.Entry))
			}
			for _, e := range b.Entry {
				k := e.FullURL + " " + e.Response.Etag
				at, _ := time.Parse(time.RFC3339Nano, e.Response.LastModified)
				if seen[k] || !last.IsZero() && at.After(last) {
					t.Fatalf("page %d repeats %s or is out of order", pages, k)
				}
				seen[k], last = true, at
			}
			path = ""
			if n := b.next(); n != "" {
				path = relative(s, n)
			}
		}
		if len(seen) < 3 {
			t.Fatalf("4 pages of 2 held %d versions", len(seen))
		}
	})

	t.Run("_since", func(t *testing.T) {
		b := getHistory(t, s, key, "/fhir/R4/Patient/"+id+"/_history")
		since := b.Entry[1].Response.LastModified // version 2
		b = getHistory(t, s, key, "/fhir/R4/Patient/_history?_since="+since)
		for _, e := range b.Entry {
			if e.Response.LastModified < since {
				t.Fatalf("entry of %s before _since %s", e.Response.LastModified, since)
			}
		}
		if len(b.Entry) < 2 {
			t.Fatalf("_since %s: %d entries, want versions 3 and 2 at least", since, len(b.Entry))
		}
	})

	t.Run("Observation type and system", func(t *testing.T) {
		b := getHistory(t, s, key, "/fhir/R4/Observation/_history?_count=5")
		if len(b.Entry) == 0 || b.Entry[0].Request.Method != "POST" || b.Entry[0].Request.URL != "Observation" || b.Entry[0].Response.Status != "201 Created" {
			t.Fatalf("observation history: %+v", b.Entry)
		}
		if b = getHistory(t, s, key, "/fhir/R4/_history?_count=5"); len(b.Entry) == 0 || b.next() == "" {
			t.Fatalf("system history: %d entries, next %q", len(b.Entry), b.next())
		}
	})

	t.Run("tenancy, test mode and scopes", func(t *testing.T) {
		other := s.Key("northwind-health", access.Live, access.ReadPatients)
		wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/Patient/"+id+"/_history", other, nil), http.StatusNotFound)
		for _, e := range getHistory(t, s, other, "/fhir/R4/Patient/_history?_count=100").Entry {
			if strings.HasSuffix(e.FullURL, "/"+id) {
				t.Fatal("another organization's type history shows the patient")
			}
		}
		testKey := s.Key(demo.DemoOrgSlug, access.Test, access.ReadPatients)
		wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/Patient/"+id+"/_history", testKey, nil), http.StatusNotFound)
		for _, e := range getHistory(t, s, testKey, "/fhir/R4/Patient/_history?_count=100").Entry {
			if !strings.Contains(string(e.Resource), "HTEST") && e.Request.Method != "DELETE" {
				t.Fatalf("a test key's history shows a real patient: %s", e.FullURL)
			}
		}
		noObs := s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients)
		wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/Observation/_history", noObs, nil), http.StatusForbidden)
		wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/_history", noObs, nil), http.StatusForbidden)
		wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/Patient/_history?_at=2024", key, nil), http.StatusBadRequest)
	})
}

// TestDelete: DELETE Patient keeps the history, answers reads with 410 and is refused where
// tenancy, test mode, scopes or referential integrity say so.
func TestDelete(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	run := fmt.Sprint(time.Now().UnixNano())
	id := createPatient(t, s, key, "Delete"+run)
	path := "/fhir/R4/Patient/" + id

	t.Run("refused", func(t *testing.T) {
		wantOutcome(t, s.Do(http.MethodDelete, path, s.Key("northwind-health", access.Live, access.Scopes...), nil), http.StatusNotFound)
		r := s.Do(http.MethodDelete, path, s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients, access.ReadObservations), nil)
		wantOutcome(t, r, http.StatusForbidden)
		wantOutcome(t, s.Do(http.MethodDelete, path, s.Key(demo.DemoOrgSlug, access.Test, access.Scopes...), nil), http.StatusNotFound)
		wantOutcome(t, send(t, s, http.MethodDelete, path, key, http.Header{"If-Match": {`W/"5"`}}, ""), http.StatusPreconditionFailed)
		r = s.Do(http.MethodDelete, "/fhir/R4/Patient/"+demo.DeterioratingPatientID, key, nil)
		wantOutcome(t, r, http.StatusConflict)
		for _, p := range []string{path, "/fhir/R4/Patient/" + demo.DeterioratingPatientID} {
			if r := s.Do(http.MethodGet, p, key, nil); r.Status != http.StatusOK {
				t.Fatalf("after refused deletes, %s: %d", p, r.Status)
			}
		}
	})

	t.Run("deleted", func(t *testing.T) {
		r := send(t, s, http.MethodDelete, path, key, http.Header{"If-Match": {`W/"1"`}}, "")
		if r.Status != http.StatusOK || r.Header.Get("ETag") != `W/"2"` {
			t.Fatalf("delete: %d %s %s", r.Status, r.Header, r.Body)
		}
		read := s.Do(http.MethodGet, path, key, nil)
		wantOutcome(t, read, http.StatusGone)
		if code := issueCode(t, read); code != "deleted" {
			t.Fatalf("read of a deleted patient: issue code %q", code)
		}
		wantOutcome(t, s.Do(http.MethodGet, path+"/_history/2", key, nil), http.StatusGone)
		if r := s.Do(http.MethodGet, path+"/_history/1", key, nil); r.Status != http.StatusOK {
			t.Fatalf("vread of the version before the delete: %d %s", r.Status, r.Body)
		}
		wantOutcome(t, putPatient(s, key, id, "Again"+run, ""), http.StatusGone)
		var b searchset
		s.Do(http.MethodGet, "/fhir/R4/Patient?_id="+id, key, nil).JSON(t, &b)
		if b.Total != 0 || len(b.Entry) != 0 {
			t.Fatalf("a search finds the deleted patient: %+v", b)
		}
		h := getHistory(t, s, key, path+"/_history")
		if len(h.Entry) != 2 || h.Entry[0].Request.Method != "DELETE" || h.Entry[0].Request.URL != "Patient/"+id || h.Entry[0].Response.Etag != `W/"2"` {
			t.Fatalf("history after delete: %+v", h.Entry)
		}
		if again := s.Do(http.MethodDelete, path, key, nil); again.Status != http.StatusOK {
			t.Fatalf("delete again: %d %s", again.Status, again.Body)
		}
		wantOutcome(t, s.Do(http.MethodGet, path, s.Key("northwind-health", access.Live, access.ReadPatients), nil), http.StatusNotFound)
	})

	t.Run("a patient another resource refers to is kept", func(t *testing.T) {
		pid := createPatient(t, s, key, "Referred"+run)
		c := s.Do(http.MethodPost, "/fhir/R4/Condition", key, map[string]any{"resourceType": "Condition",
			"subject": map[string]any{"reference": "Patient/" + pid},
			"code":    map[string]any{"coding": []any{map[string]any{"system": "http://snomed.info/sct", "code": "44054006"}}}})
		if c.Status != http.StatusCreated {
			t.Fatalf("create Condition: %d %s", c.Status, c.Body)
		}
		wantOutcome(t, s.Do(http.MethodDelete, "/fhir/R4/Patient/"+pid, key, nil), http.StatusConflict)
		if r := s.Do(http.MethodGet, "/fhir/R4/Patient/"+pid, key, nil); r.Status != http.StatusOK {
			t.Fatalf("after a refused delete: %d", r.Status)
		}
	})

	t.Run("audited", func(t *testing.T) {
		// Through GET /v1/audit, as an auditor reads it: the audit log is in Postgres or ClickHouse.
		servertest.Eventually(t, 30*time.Second, "the delete audited", func() bool {
			var page struct {
				Data []struct {
					Operation string `json:"operation"`
					Status    int    `json:"status"`
				} `json:"data"`
			}
			r := s.Do(http.MethodGet, "/v1/audit?limit=1000&patientId="+ids.FromFHIR(id), key, nil)
			if r.Status != http.StatusOK || json.Unmarshal(r.Body, &page) != nil {
				return false
			}
			for _, rec := range page.Data {
				if strings.HasPrefix(rec.Operation, "DELETE ") && rec.Status == http.StatusOK {
					return true
				}
			}
			return false
		})
	})
}

// TestVersionedBundle: a batch's PUT and DELETE Patient entries honour request.ifMatch, each on
// its own; a transaction holding them is refused whole.
func TestVersionedBundle(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	run := fmt.Sprint(time.Now().UnixNano())
	a, b, c := createPatient(t, s, key, "BundleA"+run), createPatient(t, s, key, "BundleB"+run), createPatient(t, s, key, "BundleC"+run)
	put := func(id, family, ifMatch string) map[string]any {
		body := patientBody(family, "mrn-"+id)
		body["id"] = id
		return map[string]any{"resource": body, "request": map[string]any{"method": "PUT", "url": "Patient/" + id, "ifMatch": ifMatch}}
	}
	del := func(id, ifMatch string) map[string]any {
		return map[string]any{"request": map[string]any{"method": "DELETE", "url": "Patient/" + id, "ifMatch": ifMatch}}
	}

	t.Run("transaction refused whole", func(t *testing.T) {
		r := s.Do(http.MethodPost, "/fhir/R4", key, map[string]any{"resourceType": "Bundle", "type": "transaction",
			"entry": []any{put(a, "TxA"+run, `W/"1"`), del(c, "")}})
		wantOutcome(t, r, http.StatusMethodNotAllowed)
		if !strings.Contains(expressions(t, r), "Bundle.entry[0]") {
			t.Fatalf("the refusal does not name the entry: %s", r.Body)
		}
		if got, v := family(t, s.Do(http.MethodGet, "/fhir/R4/Patient/"+a, key, nil)); got != "BundleA"+run || v != "1" {
			t.Fatalf("after a refused transaction: %s version %s", got, v)
		}
	})

	t.Run("batch", func(t *testing.T) {
		r := s.Do(http.MethodPost, "/fhir/R4/", key, map[string]any{"resourceType": "Bundle", "type": "batch", "entry": []any{
			put(a, "NewA"+run, `W/"1"`),
			put(b, "NewB"+run, `W/"4"`),
			del(c, `W/"1"`),
			map[string]any{"resource": patientBody("BundleD"+run, "mrn-d"+run), "request": map[string]any{"method": "POST", "url": "Patient"}},
		}})
		var out historyBundle
		r.JSON(t, &out)
		want := []string{"200 OK", "412 Precondition Failed", "204 No Content", "201 Created"}
		if r.Status != http.StatusOK || out.Type != "batch-response" || len(out.Entry) != len(want) {
			t.Fatalf("batch: %d %s", r.Status, r.Body)
		}
		for i, w := range want {
			if out.Entry[i].Response == nil || out.Entry[i].Response.Status != w {
				t.Fatalf("entry %d: %s, want %s", i, r.Body, w)
			}
		}
		if out.Entry[0].Response.Etag != `W/"2"` || out.Entry[2].Response.Etag != `W/"2"` {
			t.Fatalf("etags: %s", r.Body)
		}
		if got, v := family(t, s.Do(http.MethodGet, "/fhir/R4/Patient/"+a, key, nil)); got != "NewA"+run || v != "2" {
			t.Fatalf("PUT entry: %s version %s", got, v)
		}
		if got, v := family(t, s.Do(http.MethodGet, "/fhir/R4/Patient/"+b, key, nil)); got != "BundleB"+run || v != "1" {
			t.Fatalf("stale PUT entry overwrote: %s version %s", got, v)
		}
		wantOutcome(t, s.Do(http.MethodGet, "/fhir/R4/Patient/"+c, key, nil), http.StatusGone)
	})
}
