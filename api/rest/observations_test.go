package rest_test

import (
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"carehub/ingest/intake"
)

func restVital(patient, loinc string, value float64, unit string, at time.Time) map[string]any {
	return map[string]any{
		"resourceType":      "Observation",
		"status":            "final",
		"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": loinc}}},
		"subject":           map[string]any{"reference": "Patient/" + patient},
		"effectiveDateTime": at.UTC().Format(time.RFC3339),
		"valueQuantity":     map[string]any{"value": value, "unit": unit},
	}
}

type ingestAnswer struct {
	Accepted int `json:"accepted"`
	Rejected []struct {
		Index   int    `json:"index"`
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"rejected"`
	IDs []string `json:"ids"`
}

func TestObservationIngestHTTP(t *testing.T) {
	a := newFHIRAPI(t, func(c *intake.Config) { c.MaxBodyBytes = 64 << 10 })
	now := time.Now().Add(-time.Hour)
	batch := fhirJSON(t, map[string]any{"resourceType": "Bundle", "type": "batch", "entry": []any{
		map[string]any{"resource": restVital(a.synthA, "8867-4", 80, "/min", now)},
		map[string]any{"resource": restVital(a.synthB, "8867-4", 80, "/min", now)},
	}})
	r := a.do("POST", "/v1/observations", "live", "application/fhir+json", batch)
	var ans ingestAnswer
	r.decode(t, &ans)
	if r.status != http.StatusAccepted || ans.Accepted != 1 || len(ans.IDs) != 1 || len(ans.Rejected) != 1 ||
		ans.Rejected[0].Index != 1 || ans.Rejected[0].Code != "UNKNOWN_PATIENT" {
		t.Fatalf("batch: %d %s", r.status, r.body)
	}
	if !strings.Contains(string(r.body), `"rejected":[{"index":1,"code":"UNKNOWN_PATIENT","message":`) {
		t.Fatalf("entry error shape: %s", r.body)
	}

	// Nothing valid: 422 with the answer as details.
	r = a.do("POST", "/v1/observations", "live", "application/fhir+json", fhirJSON(t, restVital(a.synthB, "8867-4", 80, "/min", now)))
	var e struct {
		Error struct {
			Code    string       `json:"code"`
			Details ingestAnswer `json:"details"`
		} `json:"error"`
	}
	r.decode(t, &e)
	if r.status != 422 || r.code(t) != "VALIDATION_FAILED" || e.Error.Details.Accepted != 0 || len(e.Error.Details.Rejected) != 1 ||
		!strings.Contains(string(r.body), `"ids":[]`) {
		t.Fatalf("422: %d %s", r.status, r.body)
	}

	for _, tt := range []struct {
		name, token, contentType string
		body                     []byte
		status                   int
		code                     string
	}{
		{"no credential", "", "application/fhir+json", batch, 401, "UNAUTHORIZED"},
		{"no write:observations", "reader", "application/fhir+json", batch, 403, "INSUFFICIENT_SCOPE"},
		{"form", "live", "application/x-www-form-urlencoded", batch, 415, "UNSUPPORTED_MEDIA_TYPE"},
		{"over the body limit", "live", "application/fhir+ndjson", []byte(strings.Repeat("\n", 65<<10)), 413, "PAYLOAD_TOO_LARGE"},
		{"not JSON", "live", "application/json", []byte("<xml/>"), 400, "INVALID_REQUEST"},
	} {
		if r := a.do("POST", "/v1/observations", tt.token, tt.contentType, tt.body); r.status != tt.status || r.code(t) != tt.code {
			t.Errorf("%s: %d %s; want %d %s", tt.name, r.status, r.body, tt.status, tt.code)
		}
	}

	// Idempotency-Key: replayed with a header, 409 for another body.
	first := a.do("POST", "/v1/observations", "live", "application/fhir+json", batch, "Idempotency-Key", "req-77")
	again := a.do("POST", "/v1/observations", "live", "application/fhir+json", batch, "Idempotency-Key", "req-77")
	if first.status != 202 || again.status != 202 || string(first.body) != string(again.body) ||
		again.header.Get("Idempotent-Replayed") != "true" || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("replay: %d %s / %d %s %v", first.status, first.body, again.status, again.body, again.header)
	}
	if r := a.do("POST", "/v1/observations", "live", "application/fhir+json", fhirJSON(t, restVital(a.synthA, "8867-4", 81, "/min", now)),
		"Idempotency-Key", "req-77"); r.status != 409 || r.code(t) != "CONFLICT" {
		t.Fatalf("reused key: %d %s", r.status, r.body)
	}
}

func TestObservationIngestUnavailableHTTP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	a := newFHIRAPI(t, func(c *intake.Config) {
		c.Brokers = []string{dead}
		c.RequestTimeout = 2 * time.Second
		c.RetryAfter = 7 * time.Second
	})
	r := a.do("POST", "/v1/observations", "live", "application/fhir+json", fhirJSON(t, restVital(a.synthA, "8867-4", 80, "/min", time.Now())))
	if r.status != 503 || r.code(t) != "UNAVAILABLE" || r.header.Get("Retry-After") != "7" {
		t.Fatalf("%d %s Retry-After %q", r.status, r.body, r.header.Get("Retry-After"))
	}
}

func TestPatientObservations(t *testing.T) {
	a := newFHIRAPI(t, nil)
	base := time.Now().Add(-10 * time.Hour).Truncate(time.Second)
	var lines []string
	for i := range 12 {
		at := base.Add(time.Duration(i) * 30 * time.Minute)
		lines = append(lines, string(fhirJSON(t, restVital(a.synthA, "8867-4", float64(60+i), "/min", at))))
		lines = append(lines, string(fhirJSON(t, restVital(a.synthA, "59408-5", float64(90+i%8), "%", at))))
	}
	lines = append(lines, string(fhirJSON(t, restVital(a.realA, "8867-4", 70, "/min", base))))
	r := a.do("POST", "/v1/observations", "live", "application/fhir+ndjson", []byte(strings.Join(lines, "\n")))
	var ans ingestAnswer
	r.decode(t, &ans)
	if r.status != 202 || ans.Accepted != 25 {
		t.Fatalf("ingest: %d %s", r.status, r.body)
	}
	deadline := time.Now().Add(60 * time.Second)
	for a.scalar(`select count(*)::text from observations`) != "25" {
		if time.Now().After(deadline) {
			t.Fatal("observations not stored")
		}
		time.Sleep(20 * time.Millisecond)
	}

	type obsDoc struct {
		ID                string `json:"id"`
		ResourceType      string `json:"resourceType"`
		EffectiveDateTime string `json:"effectiveDateTime"`
		Code              struct {
			Coding []struct{ Code string } `json:"coding"`
		} `json:"code"`
		ValueQuantity struct {
			Value float64 `json:"value"`
		} `json:"valueQuantity"`
	}
	get := func(token, patient, query string) (fhirPage, []obsDoc, response) {
		t.Helper()
		r := a.do("GET", "/v1/patients/"+patient+"/observations"+query, token, "", nil)
		var p fhirPage
		var docs []obsDoc
		if r.status == 200 {
			r.decode(t, &p)
			for _, d := range p.Data {
				var o obsDoc
				_ = json.Unmarshal(d, &o)
				docs = append(docs, o)
			}
		}
		return p, docs, r
	}
	p, docs, r := get("live", a.synthA, "?code=8867-4")
	if r.status != 200 || p.Meta.Total != 12 || len(docs) != 12 || docs[0].ValueQuantity.Value != 71 || docs[11].ValueQuantity.Value != 60 {
		t.Fatalf("code filter: %d total %d, %s", r.status, p.Meta.Total, r.body)
	}
	for _, d := range docs {
		if d.ResourceType != "Observation" || !hasString(ans.IDs, d.ID) || d.Code.Coding[0].Code != "8867-4" {
			t.Fatalf("document %+v", d)
		}
	}
	since := base.Add(4 * time.Hour).UTC().Format(time.RFC3339)
	if p, _, _ := get("live", a.synthA, "?since="+url.QueryEscape(since)); p.Meta.Total != 2*4 {
		t.Fatalf("since: %d", p.Meta.Total)
	}
	// Walk newest first in pages of 5.
	var walked []string
	var last string
	cursor := ""
	for pages := 0; ; pages++ {
		q := "?limit=5"
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		p, docs, r := get("live", a.synthA, q)
		if r.status != 200 || p.Meta.Total != 24 || pages > 5 {
			t.Fatalf("page %d: %d %s", pages, r.status, r.body)
		}
		for _, d := range docs {
			if last != "" && d.EffectiveDateTime > last {
				t.Fatalf("not newest first: %s after %s", d.EffectiveDateTime, last)
			}
			last = d.EffectiveDateTime
			walked = append(walked, d.ID)
		}
		if p.Meta.Cursor == nil {
			break
		}
		cursor = *p.Meta.Cursor
	}
	if len(walked) != 24 || len(distinctStrings(walked)) != 24 {
		t.Fatalf("walked %d observations, %d distinct", len(walked), len(distinctStrings(walked)))
	}
	for _, tt := range []struct {
		name, token, patient, query string
		status                      int
	}{
		{"a real patient under a test key", "test", a.realA, "", 404},
		{"another tenant's patient", "other", a.synthA, "", 404},
		{"no such patient", "live", "pat_01kf3fm8c0xbzcfajp6n9d2emj", "", 404},
		{"without read:observations", "reader", a.synthA, "", 403},
		{"limit 1001", "live", a.synthA, "?limit=1001", 400},
		{"limit 0", "live", a.synthA, "?limit=0", 400},
		{"bad since", "live", a.synthA, "?since=yesterday", 400},
		{"bad cursor", "live", a.synthA, "?cursor=" + url.QueryEscape("cDpwYXRfMQ"), 400},
		{"a synthetic patient under a test key", "test", a.synthA, "?limit=1000", 200},
	} {
		if _, _, r := get(tt.token, tt.patient, tt.query); r.status != tt.status {
			t.Errorf("%s: %d %s; want %d", tt.name, r.status, r.body, tt.status)
		}
	}
	if p, _, _ := get("live", a.realA, ""); p.Meta.Total != 1 {
		t.Fatalf("real patient, live key: %d", p.Meta.Total)
	}
}

func hasString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
