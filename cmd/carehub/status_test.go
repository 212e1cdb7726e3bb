package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"carehub/api/server"
	"carehub/internal/testenv"
)

// TestStatusCommand asks a live node (`carehub serve` on the embedded stores) for its one
// screen: roles, each dependency, each consumer group's lag and partitions, recent errors.
func TestStatusCommand(t *testing.T) {
	n := serve(t, dataDir(t), testenv.FreeAddr(t))
	base := "http://" + n.addr

	out, stderr, code := runCLI(t, "status", "--url", base)
	if code != 0 {
		t.Fatalf("status: exit %d\n%s%s", code, out, stderr)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^carehub at ` + regexp.QuoteMeta(base) + `: ready$`),
		regexp.MustCompile(`(?m)^roles: api, ingest, processors$`),
		regexp.MustCompile(`(?m)^DEPENDENCY +STATE +DEGRADES$`),
		regexp.MustCompile(`(?m)^postgres +ok *$`),
		regexp.MustCompile(`(?m)^kafka +ok *$`),
		regexp.MustCompile(`(?m)^consumers +ok *$`),
		regexp.MustCompile(`(?m)^observation-writer +carehub-observations +\d+ +2 of 2$`),
		regexp.MustCompile(`(?m)^eventlog-writer +carehub-eventlog +\d+ +2 of 2$`),
		regexp.MustCompile(`(?m)^recent errors: none$`),
	} {
		if !want.MatchString(out) {
			t.Errorf("status output lacks %s:\n%s", want, out)
		}
	}
	if lines := strings.Count(out, "\n"); lines > 25 {
		t.Errorf("status takes %d lines, more than a screen:\n%s", lines, out)
	}

	out, stderr, code = runCLI(t, "status", "--json", "--url", base)
	var st struct {
		Status string `json:"status"`
		server.Ready
	}
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
		t.Fatalf("status --json: exit %d, %v\n%s%s", code, err, out, stderr)
	}
	if st.Status != "ready" || st.Checks["consumers"] != "ok" || len(st.Consumers) != 8 || len(st.Roles) != 3 {
		t.Errorf("status --json: %+v", st)
	}
}

// A node that is not ready prints the same screen, the failing dependency with what it
// degrades and its recent errors, and exits 1; no node at all is an error.
func TestStatusNotReady(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" || r.URL.Query().Get("verbose") != "true" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"status":"not ready","checks":{"postgres":"ok","clickhouse":"down: connection refused"},
"degrades":{"clickhouse":"event history answers 503"},"roles":["api"],
"recentErrors":[{"time":"2026-12-03T10:00:00Z","message":"request failed","attrs":{"status":"503"}}]}`))
	}))
	defer srv.Close()
	out, stderr, code := runCLI(t, "status", "--url", srv.URL)
	if code != 1 || !regexp.MustCompile(`(?m)^clickhouse +down: connection refused +event history answers 503$`).MatchString(out) ||
		!strings.Contains(out, "request failed status=503") || !strings.Contains(stderr, "not ready (HTTP 503)") {
		t.Fatalf("not ready: exit %d\n%s%s", code, out, stderr)
	}
	srv.Close()
	if _, stderr, code := runCLI(t, "status", "--url", srv.URL); code != 1 || !strings.Contains(stderr, "refused") {
		t.Fatalf("no node: exit %d, %q", code, stderr)
	}
}
