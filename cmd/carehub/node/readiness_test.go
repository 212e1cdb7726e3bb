package node_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"carehub/api/server"
	"carehub/e2e/servertest"
	"carehub/internal/testenv"
	"carehub/kernel/ids"
	"carehub/storage/clickhouse/chtest"
	"carehub/storage/demo"
)

// readyz is /readyz's answer, verbose or not.
type readyz struct {
	Status string `json:"status"`
	server.Ready
}

func getReadyz(t *testing.T, base string, verbose bool) (int, readyz) {
	t.Helper()
	url := base + "/readyz"
	if verbose {
		url += "?verbose=true"
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("/readyz: %v", err)
	}
	defer resp.Body.Close()
	var rd readyz
	if err := json.NewDecoder(resp.Body).Decode(&rd); err != nil {
		t.Fatalf("/readyz (%d): %v", resp.StatusCode, err)
	}
	return resp.StatusCode, rd
}

// vitals is a FHIR transaction of n heart rates of the demo's stable patient.
func vitals(n int) map[string]any {
	entries := make([]any, n)
	for i := range entries {
		entries[i] = map[string]any{"request": map[string]any{"method": "POST", "url": "Observation"},
			"resource": map[string]any{"resourceType": "Observation", "status": "final",
				"category": []any{map[string]any{"coding": []any{map[string]any{
					"system": "http://terminology.hl7.org/CodeSystem/observation-category", "code": "vital-signs"}}}},
				"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4"}}},
				"subject":           map[string]any{"reference": "Patient/" + ids.FHIR(demo.StablePatientID)},
				"effectiveDateTime": time.Now().UTC().Add(-time.Duration(i) * time.Second).Format(time.RFC3339),
				"valueQuantity":     map[string]any{"value": 60 + i%40, "unit": "beats/minute", "system": "http://unitsofmeasure.org", "code": "/min"}}}
	}
	return map[string]any{"resourceType": "Bundle", "type": "transaction", "entry": entries}
}

// TestReadyzWaitsForConsumers is issue 58's point 8: /readyz turns 200 only once every consumer
// group the node runs holds its partitions, each dependency checked on its own, so transactions
// of 100 vitals sent the moment it does are taken, not refused because the writers store
// nothing yet. On the embedded defaults (no ClickHouse: the event log is Postgres's).
func TestReadyzWaitsForConsumers(t *testing.T) {
	s := servertest.Start(t)
	var first readyz
	start := time.Now()
	servertest.Eventually(t, 60*time.Second, "/readyz 200", func() bool {
		code, rd := getReadyz(t, s.URL, false)
		if first.Checks == nil {
			first = rd
		}
		return code == http.StatusOK
	})
	t.Logf("ready %v after start; first answer %v", time.Since(start).Round(time.Millisecond), first.Checks)
	key := s.DemoKey()
	for i := range 3 {
		if r := s.Do(http.MethodPost, "/fhir/R4/", key, vitals(100)); r.Status != http.StatusOK {
			t.Fatalf("transaction %d of 100 vitals right after /readyz turned 200: HTTP %d %s", i, r.Status, r.Body)
		}
	}

	_, rd := getReadyz(t, s.URL, true)
	want := []string{"server", "postgres", "migrations", "kafka", "consumers"}
	if chtest.Real() {
		want = append(want, "clickhouse")
	}
	for _, name := range want {
		if rd.Checks[name] != "ok" {
			t.Errorf("checks[%s] = %q, want ok (%v)", name, rd.Checks[name], rd.Checks)
		}
	}
	if len(rd.Checks) != len(want) {
		t.Errorf("checks %v, want exactly %v", rd.Checks, want)
	}
	if len(rd.Degrades) != 0 {
		t.Errorf("degrades %v on a ready node", rd.Degrades)
	}
	if fmt.Sprint(rd.Roles) != "[api ingest processors]" {
		t.Errorf("roles %v", rd.Roles)
	}
	groups := map[string]server.ConsumerLag{}
	for _, c := range rd.Consumers {
		groups[c.Name] = c
	}
	for _, name := range []string{"eventlog-writer", "audit-writer", "observation-writer", "workflow-runner", "workflow-triggers",
		"deployment-scorer", "webhook-dispatcher", "fhir-subscription-notifier"} {
		c, ok := groups[name]
		if !ok || c.Err != "" || c.Partitions != s.Cfg().Partitions || c.Assigned != c.Partitions {
			t.Errorf("consumer %s: %+v (present %v), want all %d partitions held", name, c, ok, s.Cfg().Partitions)
		}
	}
	if len(rd.Consumers) != len(groups) || len(groups) != 8 {
		t.Errorf("consumers %+v", rd.Consumers)
	}

	// A plain probe carries none of the verbose part.
	if _, plain := getReadyz(t, s.URL, false); plain.Roles != nil || plain.Consumers != nil || plain.RecentErrors != nil {
		t.Errorf("plain /readyz: %+v", plain)
	}
}

// A node that runs no consumer group (the api role alone) has no consumers check.
func TestReadyzWithoutConsumers(t *testing.T) {
	s := servertest.Start(t, servertest.WithRoles("api"))
	code, rd := getReadyz(t, s.URL, true)
	if code != http.StatusOK {
		t.Fatalf("/readyz: %d %v", code, rd.Checks)
	}
	if fmt.Sprint(rd.Roles) != "[api]" {
		t.Errorf("roles %v", rd.Roles)
	}
	if _, ok := rd.Checks["consumers"]; ok || len(rd.Consumers) != 0 {
		t.Errorf("an api node: checks %v, consumers %v", rd.Checks, rd.Consumers)
	}
}

// proxy forwards a loopback port to a server; stopping it is the server going away for whoever
// connects through it (the test's own engine, shared with other tests, keeps running).
type proxy struct {
	t      *testing.T
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	p := &proxy{t: t, addr: testenv.FreeAddr(t), target: target}
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *proxy) start() {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
}

// stop closes the listener and every connection through it.
func (p *proxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestClickHouseDown is issue 58's point 2 on a real ClickHouse (skipped without one, as
// chtest's suites are): within 5 s of the server going away /readyz is 503 naming it and
// what that degrades, and the analysts' reads answer 503 UNAVAILABLE naming it, REST and
// GraphQL, not 500. When it is back the node is ready again.
func TestClickHouseDown(t *testing.T) {
	target, err := url.Parse(chtest.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, target.Host)
	target.Host = p.addr
	cfg := servertest.Config(t)
	cfg.ClickHouseURL = target.String()
	s := servertest.StartConfig(t, cfg)
	servertest.Eventually(t, 60*time.Second, "/readyz 200", func() bool {
		code, _ := getReadyz(t, s.URL, false)
		return code == http.StatusOK
	})
	key := s.DemoKey()
	project := s.ProjectID(demo.SepsisProjectName)
	reads := map[string]string{
		"events": "/v1/events?projectId=" + project,
		"stats":  "/v1/events/stats?from=2020-01-01T00:00:00Z&groupBy=type&projectId=" + project,
		"export": "/v1/events/export?projectId=" + project,
	}
	for name, path := range reads {
		if r := s.Do(http.MethodGet, path, key, nil); r.Status != http.StatusOK {
			t.Fatalf("%s before the outage: HTTP %d %s", name, r.Status, r.Body)
		}
	}

	p.stop()
	down := time.Now()
	var rd readyz
	servertest.Eventually(t, 30*time.Second, "/readyz to name clickhouse", func() bool {
		var code int
		code, rd = getReadyz(t, s.URL, false)
		return code == http.StatusServiceUnavailable && strings.HasPrefix(rd.Checks["clickhouse"], "down: ")
	})
	if took := time.Since(down); took > 5*time.Second {
		t.Errorf("/readyz named clickhouse %v after it stopped, want within 5 s", took)
	}
	if rd.Degrades["clickhouse"] == "" || rd.Checks["postgres"] != "ok" || rd.Checks["kafka"] != "ok" {
		t.Errorf("/readyz with clickhouse down: %+v", rd)
	}
	for name, path := range reads {
		r := s.Do(http.MethodGet, path, key, nil)
		var body struct {
			Error struct {
				Code    string
				Message string
				Details map[string]any
			}
		}
		r.JSON(t, &body)
		if r.Status != http.StatusServiceUnavailable || body.Error.Code != "UNAVAILABLE" || body.Error.Details["dependency"] != "clickhouse" ||
			!strings.Contains(body.Error.Message, "ClickHouse") {
			t.Errorf("%s with clickhouse down: HTTP %d %s", name, r.Status, r.Body)
		}
	}
	g := s.GraphQL(key, `query($p: ID!) { eventHistory(projectId: $p, limit: 5) { events { id } } }`, map[string]any{"p": project})
	if len(g.Errors) != 1 || g.Errors[0].Code() != "UNAVAILABLE" || g.Errors[0].Extensions["dependency"] != "clickhouse" {
		t.Errorf("eventHistory with clickhouse down: %+v", g.Errors)
	}
	if _, v := getReadyz(t, s.URL, true); len(v.RecentErrors) == 0 {
		t.Errorf("no recent errors with clickhouse down: %+v", v)
	}

	p.start()
	servertest.Eventually(t, 30*time.Second, "/readyz 200 once clickhouse is back", func() bool {
		code, _ := getReadyz(t, s.URL, false)
		return code == http.StatusOK
	})
	if r := s.Do(http.MethodGet, reads["events"], key, nil); r.Status != http.StatusOK {
		t.Errorf("events once clickhouse is back: HTTP %d %s", r.Status, r.Body)
	}
}
