package rest_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/kernel/events"
	"carehub/storage/demo"
)

var day = servertest.AnalystDay

type eventsPage struct {
	Data []struct {
		ID       string          `json:"id"`
		Redacted bool            `json:"redacted"`
		Payload  json.RawMessage `json:"payload"`
	} `json:"data"`
	Meta map[string]any `json:"meta"`
}

// raw sends a GET with exactly the given headers, without the transport's own gzip handling.
func raw(t *testing.T, s *servertest.Server, path, key string, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, s.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Accept-Encoding", "identity")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r io.Reader = resp.Body
	if resp.Header.Get("Content-Encoding") == "gzip" {
		if r, err = gzip.NewReader(resp.Body); err != nil {
			t.Fatal(err)
		}
	}
	body, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

func ndjsonLines(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// analyst starts a node whose sepsis project holds the analyst history (AppendAnalystHistory),
// and returns it, the demo key, the project and the history's events.
func analyst(t *testing.T) (s *servertest.Server, key, project string, evs []events.Event) {
	s = servertest.Start(t)
	project = s.ProjectID(demo.SepsisProjectName)
	return s, s.DemoKey(), project, s.AppendAnalystHistory(s.OrgID(demo.DemoOrgSlug), project)
}

func TestEventHistory(t *testing.T) {
	s, key, project, evs := analyst(t)
	rng := "&since=" + day.Format(time.RFC3339) + "&to=" + day.Add(24*time.Hour).Format(time.RFC3339)
	base := "/v1/events?projectId=" + project + rng

	t.Run("prefix, resource, ascending, keyset pages", func(t *testing.T) {
		var want []string
		for _, ev := range evs {
			if ev.Type == "agent.run.failed" {
				want = append(want, ev.ID)
			}
		}
		var got []string
		path := base + "&types=agent.*&agentId=agt_b&order=asc&limit=3"
		for cursor := ""; ; {
			r := s.Do(http.MethodGet, path+cursor, key, nil)
			var p eventsPage
			r.JSON(t, &p)
			if r.Status != http.StatusOK || p.Meta["total"] != float64(len(want)) {
				t.Fatalf("HTTP %d %s", r.Status, r.Body)
			}
			for _, e := range p.Data {
				got = append(got, e.ID)
			}
			c, _ := p.Meta["cursor"].(string)
			if c == "" {
				break
			}
			cursor = "&cursor=" + url.QueryEscape(c)
		}
		if !slices.Equal(got, want) {
			t.Errorf("got %v, want %v (oldest first)", got, want)
		}
	})
	t.Run("total modes", func(t *testing.T) {
		var p eventsPage
		s.Do(http.MethodGet, base+"&total=none&limit=1", key, nil).JSON(t, &p)
		if _, ok := p.Meta["total"]; ok || len(p.Data) != 1 || p.Meta["cursor"] == nil {
			t.Errorf("total=none: meta %v", p.Meta)
		}
		s.Do(http.MethodGet, base+"&total=estimate&limit=1", key, nil).JSON(t, &p)
		if p.Meta["totalEstimated"] != true || p.Meta["total"] == nil {
			t.Errorf("total=estimate: meta %v", p.Meta)
		}
	})
	t.Run("bad pattern and range", func(t *testing.T) {
		for _, q := range []string{"&types=agent.", "&types=Agent.*", "&order=up", "&total=some"} {
			wantError(t, s.Do(http.MethodGet, base+q, key, nil), http.StatusBadRequest, "INVALID_REQUEST")
		}
		wantError(t, s.Do(http.MethodGet, "/v1/events?projectId="+project+"&since=2020-02-02T00:00:00Z&to=2020-02-01T00:00:00Z", key, nil),
			http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	})
	t.Run("a patient filter needs read:patients", func(t *testing.T) {
		noPHI := s.Key(demo.DemoOrgSlug, access.Live)
		wantError(t, s.Do(http.MethodGet, base+"&patientId="+demo.RealPatientID, noPHI, nil), http.StatusForbidden, "INSUFFICIENT_SCOPE")
		var p eventsPage
		s.Do(http.MethodGet, base+"&patientId="+demo.RealPatientID, key, nil).JSON(t, &p)
		if len(p.Data) != 10 {
			t.Errorf("%d events of the patient, want 10", len(p.Data))
		}
	})
}

func TestEventExport(t *testing.T) {
	s, key, project, evs := analyst(t)
	rng := "&since=" + day.Format(time.RFC3339) + "&to=" + day.Add(24*time.Hour).Format(time.RFC3339)
	path := "/v1/events/export?projectId=" + project + rng

	t.Run("ndjson gzip on Accept-Encoding, every event with a resume cursor", func(t *testing.T) {
		resp, body := raw(t, s, path, key, map[string]string{"Accept-Encoding": "gzip"})
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "gzip" ||
			!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/x-ndjson") {
			t.Fatalf("HTTP %d %v", resp.StatusCode, resp.Header)
		}
		lines := ndjsonLines(t, body)
		if len(lines) != len(evs) || lines[0]["id"] != evs[len(evs)-1].ID || lines[0]["cursor"] == "" {
			t.Fatalf("%d lines, first %v; want %d newest first with cursors", len(lines), lines[0], len(evs))
		}
		// Resume after the 10th line: the remaining 20, in order.
		_, body = raw(t, s, path+"&cursor="+url.QueryEscape(lines[9]["cursor"].(string)), key, nil)
		rest := ndjsonLines(t, body)
		if len(rest) != 20 || rest[0]["id"] != lines[10]["id"] {
			t.Errorf("resumed export: %d lines from %v, want 20 from %v", len(rest), rest[0]["id"], lines[10]["id"])
		}
	})
	t.Run("csv, gzip by parameter", func(t *testing.T) {
		resp, body := raw(t, s, path+"&format=csv&gzip=true&order=asc", key, nil)
		if resp.Header.Get("Content-Encoding") != "gzip" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/csv") {
			t.Fatalf("headers %v", resp.Header)
		}
		rows, err := csv.NewReader(bytes.NewReader(body)).ReadAll()
		if err != nil || len(rows) != len(evs)+1 || rows[0][0] != "id" || rows[1][0] != evs[0].ID {
			t.Fatalf("csv: %d rows, err %v", len(rows), err)
		}
	})
	t.Run("a key without patient scopes exports redacted records, as the list serves them", func(t *testing.T) {
		for _, k := range []struct {
			name     string
			key      string
			redacted bool
		}{{"no scopes", s.Key(demo.DemoOrgSlug, access.Live), true}, {"read:patients", key, false}} {
			_, body := raw(t, s, path+"&types=device.*", k.key, nil)
			lines := ndjsonLines(t, body)
			var list eventsPage
			s.Do(http.MethodGet, "/v1/events?projectId="+project+rng+"&types=device.*&limit=1000", k.key, nil).JSON(t, &list)
			if len(lines) != 10 || len(list.Data) != 10 {
				t.Fatalf("%s: %d exported, %d listed, want 10", k.name, len(lines), len(list.Data))
			}
			for i, line := range lines {
				payload, _ := json.Marshal(line["payload"])
				if line["redacted"] == true != k.redacted || strings.Contains(string(payload), demo.RealPatientID) == k.redacted {
					t.Errorf("%s: line %v, want redacted %v", k.name, line, k.redacted)
				}
				var a, b any
				_ = json.Unmarshal(payload, &a)
				_ = json.Unmarshal(list.Data[i].Payload, &b)
				if fmt.Sprint(a) != fmt.Sprint(b) || list.Data[i].Redacted != k.redacted {
					t.Errorf("%s: export payload %s, list payload %s", k.name, payload, list.Data[i].Payload)
				}
			}
		}
	})
	t.Run("another tenant's project is not found", func(t *testing.T) {
		other := s.Key("northwind-health", access.Live, access.Scopes...)
		wantError(t, s.Do(http.MethodGet, path, other, nil), http.StatusNotFound, "NOT_FOUND")
	})
}

func TestEventStats(t *testing.T) {
	s, key, project, _ := analyst(t)
	orgID := s.OrgID(demo.DemoOrgSlug)
	rng := "from=" + day.Format(time.RFC3339) + "&to=" + day.Add(24*time.Hour).Format(time.RFC3339)
	type row struct {
		Bucket *time.Time `json:"bucket"`
		Key    string     `json:"key"`
		Count  int64      `json:"count"`
		Rate   float64    `json:"rate"`
		P50    *float64   `json:"p50"`
	}
	get := func(t *testing.T, q string) []row {
		t.Helper()
		r := s.Do(http.MethodGet, "/v1/events/stats?"+rng+q, key, nil)
		var out struct{ Data []row }
		r.JSON(t, &out)
		if r.Status != http.StatusOK {
			t.Fatalf("HTTP %d %s", r.Status, r.Body)
		}
		return out.Data
	}
	t.Run("agent outcome rates", func(t *testing.T) {
		rows := get(t, "&projectId="+project+"&types=agent.*&groupBy=status")
		if len(rows) != 2 || rows[0].Key != "COMPLETED" || rows[0].Count != 10 || rows[0].Rate != 0.5 || rows[0].Bucket != nil {
			t.Errorf("got %+v", rows)
		}
	})
	t.Run("top type of the organization", func(t *testing.T) {
		rows := get(t, "&groupBy=type&top=1&types=agent.run.failed,device.*")
		if len(rows) != 1 || rows[0].Count != 10 {
			t.Errorf("got %+v", rows)
		}
	})
	t.Run("hours in a time zone, with latency", func(t *testing.T) {
		rows := get(t, "&projectId="+project+"&bucket=hour&timeZone=Asia/Kolkata&types=agent.run_completed&latency=true")
		var n int64
		for _, r := range rows {
			n += r.Count
			if r.Bucket == nil || r.Bucket.Minute() != 30 || r.P50 == nil {
				t.Errorf("row %+v: want an hour starting at :30 UTC with p50", r)
			}
		}
		if n != 10 {
			t.Errorf("%d events in buckets, want 10", n)
		}
	})
	t.Run("refusals", func(t *testing.T) {
		wantError(t, s.Do(http.MethodGet, "/v1/events/stats?groupBy=type", key, nil), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
		wantError(t, s.Do(http.MethodGet, "/v1/events/stats?"+rng+"&timeZone=Mars/Olympus", key, nil), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
		wantError(t, s.Do(http.MethodGet, "/v1/events/stats?from=2000-01-01T00:00:00Z&bucket=minute", key, nil), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
		other := s.Key("northwind-health", access.Live)
		wantError(t, s.Do(http.MethodGet, "/v1/events/stats?"+rng+"&organizationId="+orgID, other, nil), http.StatusNotFound, "NOT_FOUND")
		wantError(t, s.Do(http.MethodGet, "/v1/events/stats?"+rng+"&projectId="+project, other, nil), http.StatusNotFound, "NOT_FOUND")
	})
}

func TestAuditExportAndImmutability(t *testing.T) {
	s := servertest.Start(t)
	admin := s.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg)
	reader := s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients)
	if r := s.Do(http.MethodGet, "/v1/patients/"+demo.RealPatientID, reader, nil); r.Status != http.StatusOK {
		t.Fatalf("patient read: HTTP %d %s", r.Status, r.Body)
	}
	// Who accessed the patient: the read above reaches the audit log through the pipeline.
	path := "/v1/audit/export?patientId=" + demo.RealPatientID
	var lines []map[string]any
	servertest.Eventually(t, time.Minute, "the patient read in the audit export", func() bool {
		resp, body := raw(t, s, path, admin, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("HTTP %d %s", resp.StatusCode, body)
		}
		lines = ndjsonLines(t, body)
		ops := map[any]bool{}
		for _, l := range lines {
			ops[l["operation"]] = l["cursor"] != ""
		}
		// The read, and an earlier export: reading who accessed a patient is an access too.
		return ops["GET /v1/patients/{id}"] && ops["GET /v1/audit/export"]
	})
	wantError(t, s.Do(http.MethodGet, path, reader, nil), http.StatusForbidden, "INSUFFICIENT_SCOPE")
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		for _, p := range []string{"/v1/audit", "/v1/audit/export"} {
			if r := s.Do(m, p, admin, map[string]any{}); r.Status != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: HTTP %d, want 405: audit records are never written or removed through the API", m, p, r.Status)
			}
		}
	}
}
