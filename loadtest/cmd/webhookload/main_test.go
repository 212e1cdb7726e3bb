package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"carehub/kernel/whsig"
	"carehub/loadtest/loadcli"
	"carehub/loadtest/loadcli/loadclitest"
	"carehub/loadtest/wsfleet"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" // 24 bytes of base64

// TestMain lets the test binary be the raw baseline's sender, as webhookload's main does:
// rawInChild re-executes os.Executable(), which under go test is this binary.
func TestMain(m *testing.M) {
	if os.Getenv(rawSenderEnv) != "" {
		os.Exit(rawSender(os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// signed returns the headers of a delivery of body for id, signed at ts with sec.
func signed(t *testing.T, sec, id string, ts time.Time, body string) http.Header {
	t.Helper()
	h := http.Header{}
	if err := whsig.SetHeaders(h, id, ts, []byte(body), sec); err != nil {
		t.Fatal(err)
	}
	return h
}

func deliveryBody(sentAt time.Time) string {
	return `{"event":"webhookload.r1.load","timestamp":"2026-01-01T00:00:00Z","org_id":"org_1","project_id":"prj_1","payload":{"client":0,"seq":1,"sentAt":` +
		strconv.FormatInt(sentAt.UnixNano(), 10) + `}}`
}

func TestTrackerCountsVerifiedDeliveriesOnce(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
	var observed []time.Duration
	tr := newTracker(secret, clock.now, func(d time.Duration) { observed = append(observed, d) })

	sent := clock.t
	tr.publishedN(3)
	if got := tr.lag(); got != 3 {
		t.Fatalf("lag before any delivery = %d, want 3", got)
	}
	body := deliveryBody(sent)
	clock.t = sent.Add(40 * time.Millisecond)
	if got := tr.receive(signed(t, secret, "evt_1", clock.t, body), []byte(body)); got != http.StatusNoContent {
		t.Fatalf("good delivery answered %d", got)
	}
	// A retry of the same event (a later attempt, signed anew) counts as a duplicate only.
	clock.t = sent.Add(2 * time.Second)
	if got := tr.receive(signed(t, secret, "evt_1", clock.t, body), []byte(body)); got != http.StatusNoContent {
		t.Fatalf("duplicate answered %d", got)
	}
	clock.t = sent.Add(250 * time.Millisecond)
	body2 := deliveryBody(sent.Add(50 * time.Millisecond))
	if got := tr.receive(signed(t, secret, "evt_2", clock.t, body2), []byte(body2)); got != http.StatusNoContent {
		t.Fatalf("second delivery answered %d", got)
	}

	if got := tr.lag(); got != 1 {
		t.Fatalf("lag = %d, want 1 (3 published, 2 delivered)", got)
	}
	want := []time.Duration{40 * time.Millisecond, 200 * time.Millisecond}
	if len(observed) != 2 || observed[0] != want[0] || observed[1] != want[1] {
		t.Fatalf("observed latencies %v, want %v", observed, want)
	}
	tl := tr.tally()
	if tl.Delivered != 2 || tl.Duplicates != 1 || tl.Published != 3 || tl.BadSignature+tl.Stale+tl.Malformed != 0 {
		t.Fatalf("tally %+v", tl)
	}
	// The drain's rate runs to the latest first delivery: the retry at 2 s is not one.
	if want := sent.Add(250 * time.Millisecond); !tl.Last.Equal(want) {
		t.Fatalf("last first delivery at %v, want %v", tl.Last, want)
	}
}

func TestTrackerRefusesBadDeliveries(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
	tr := newTracker(secret, clock.now, nil)
	body := deliveryBody(clock.t)
	other := "whsec_" + strings.Repeat("A", 32)
	cases := []struct {
		name string
		h    http.Header
		body string
		want int
	}{
		{"another secret", signed(t, other, "evt_1", clock.t, body), body, http.StatusUnauthorized},
		{"tampered body", signed(t, secret, "evt_1", clock.t, body), strings.Replace(body, `"seq":1`, `"seq":2`, 1), http.StatusUnauthorized},
		{"other id", func() http.Header {
			h := signed(t, secret, "evt_1", clock.t, body)
			h.Set(whsig.HeaderID, "evt_2")
			return h
		}(), body, http.StatusUnauthorized},
		{"unsigned", http.Header{whsig.HeaderID: {"evt_1"}, whsig.HeaderTimestamp: {"1"}}, body, http.StatusUnauthorized},
		{"stale timestamp", signed(t, secret, "evt_1", clock.t.Add(-tolerance-time.Second), body), body, http.StatusUnauthorized},
		{"future timestamp", signed(t, secret, "evt_1", clock.t.Add(tolerance+time.Second), body), body, http.StatusUnauthorized},
		{"no sentAt", signed(t, secret, "evt_1", clock.t, `{"payload":{}}`), `{"payload":{}}`, http.StatusBadRequest},
	}
	for _, tc := range cases {
		if got := tr.receive(tc.h, []byte(tc.body)); got != tc.want {
			t.Errorf("%s: answered %d, want %d", tc.name, got, tc.want)
		}
	}
	tl := tr.tally()
	if tl.Delivered != 0 || tl.BadSignature != 4 || tl.Stale != 2 || tl.Malformed != 1 {
		t.Fatalf("tally %+v: want nothing delivered, 4 bad signatures, 2 stale, 1 malformed", tl)
	}
	// A delivery may beat its publish call's answer: the lag is never negative.
	good := signed(t, secret, "evt_9", clock.t, body)
	tr.receive(good, []byte(body))
	if got := tr.lag(); got != 0 {
		t.Fatalf("lag with a delivery ahead of its publish = %d, want 0", got)
	}
}

func TestValidate(t *testing.T) {
	ok := func() config {
		return config{Listen: "127.0.0.1:0", RawClient: rawNetHTTP, RawProcess: rawOwn, Command: loadcli.Command{URL: "http://127.0.0.1:8080", Keys: []string{"chk_live_x"},
			Load: loadcli.Load{Clients: 4, Duration: 10 * time.Second, Drain: 30 * time.Second, Batch: 1}}}
	}
	loadclitest.Validate(t, ok, (*config).validate, []loadclitest.Case[config]{
		{Name: "defaults", Edit: func(*config) {}},
		{Name: "ipv6 receiver", Edit: func(c *config) { c.Listen = "[::1]:9000" }},
		{Name: "remote url", Edit: func(c *config) { c.URL = "http://10.0.0.5:8080" }, Want: "-url"},
		{Name: "receiver on every interface", Edit: func(c *config) { c.Listen = ":9000" }, Want: "-listen"},
		{Name: "remote receiver", Edit: func(c *config) { c.Listen = "10.0.0.5:9000" }, Want: "-listen"},
		{Name: "load bounds", Edit: func(c *config) { c.Batch = 0 }, Want: "-batch"},
		{Name: "no key", Edit: func(c *config) { c.Keys = nil }, Want: "-key"},
		{Name: "fleet", Edit: func(c *config) { c.Subs, c.Slow, c.Failing = 100, 1, 1 }},
		{Name: "fleet all unhealthy", Edit: func(c *config) { c.Subs, c.Slow, c.Failing = 2, 1, 1 }, Want: "-subs"},
		{Name: "fleet too large", Edit: func(c *config) { c.Subs = maxSubs + 1 }, Want: "-subs"},
		{Name: "https receivers, HTTP/1.1 only", Edit: func(c *config) { c.TLSDir, c.H1 = "/tmp/whl", true }},
		{Name: "-h1 over plain HTTP", Edit: func(c *config) { c.H1 = true }, Want: "-h1"},
		{Name: "fasthttp baseline", Edit: func(c *config) { c.RawClient = rawFastHTTP }},
		{Name: "fasthttp baseline over TLS", Edit: func(c *config) { c.RawClient, c.TLSDir = rawFastHTTP, "/tmp/whl" }, Want: "-raw-client"},
		{Name: "unknown baseline client", Edit: func(c *config) { c.RawClient = "curl" }, Want: "-raw-client"},
		{Name: "baseline in the receiver's process", Edit: func(c *config) { c.RawProcess = rawShared }},
		{Name: "unknown baseline process", Edit: func(c *config) { c.RawProcess = "thread" }, Want: "-raw-process"},
	})
}

// -tls-dir makes its certificate once and keeps it (the node trusts that file), and the
// receivers speak HTTP/2 unless -h1, to a client that, like carehub's, offers it.
func TestReceiverTLS(t *testing.T) {
	dir := t.TempDir()
	for _, h1 := range []bool{false, true} {
		rt, err := loadReceiverTLS(dir, h1)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, r.Proto)
		})}
		go rt.serve(srv, ln)
		hc := &http.Client{Transport: rt.transport(2), Timeout: 10 * time.Second}
		resp, err := hc.Get(rt.scheme() + "://" + ln.Addr().String() + "/")
		if err != nil {
			t.Fatal(err)
		}
		proto, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		want := map[bool]string{false: "HTTP/2.0", true: "HTTP/1.1"}[h1]
		if string(proto) != want {
			t.Errorf("h1 %v: the receiver saw %s, want %s", h1, proto, want)
		}
	}
	first, _ := os.ReadFile(filepath.Join(dir, "receiver.pem"))
	if _, err := loadReceiverTLS(dir, false); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, "receiver.pem")); string(again) != string(first) || len(first) == 0 {
		t.Error("the certificate was made again: a node started with the first would not trust the receivers")
	}
}

// The baseline's sender, in a process of its own or in the receiver's, makes every POST to the
// baseline's receiver, which counts each event once under the subscription's secret: one event
// a POST, or an ordered subscription's batches, over plain HTTP through either client or over
// TLS.
func TestRawBaseline(t *testing.T) {
	tlsDir := t.TempDir()
	cases := []struct {
		name, process, client string
		n, conc, size         int
		tls, h1               bool
	}{
		{name: "own process, net/http", process: rawOwn, client: rawNetHTTP, n: 40, conc: 4, size: 1},
		{name: "own process, fasthttp", process: rawOwn, client: rawFastHTTP, n: 40, conc: 4, size: 1},
		{name: "own process, net/http, batches", process: rawOwn, client: rawNetHTTP, n: 23, conc: 1, size: 5},
		{name: "own process, fasthttp, batches", process: rawOwn, client: rawFastHTTP, n: 23, conc: 1, size: 5},
		{name: "own process, HTTP/2 over TLS", process: rawOwn, client: rawNetHTTP, n: 20, conc: 2, size: 1, tls: true},
		{name: "own process, HTTP/1.1 over TLS", process: rawOwn, client: rawNetHTTP, n: 20, conc: 2, size: 1, tls: true, h1: true},
		{name: "shared process, fasthttp, batches", process: rawShared, client: rawFastHTTP, n: 23, conc: 1, size: 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var rtls *receiverTLS
			if tc.tls {
				var err error
				if rtls, err = loadReceiverTLS(tlsDir, tc.h1); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			var logw bytes.Buffer
			job := rawJob{Client: tc.client, Secret: secret, Type: "webhookload.rtest.load", N: tc.n, Conc: tc.conc, Size: tc.size, Filler: "xx"}
			raw, err := rawBaseline(ctx, rtls, tc.process, job, &logw)
			if err != nil {
				t.Fatalf("baseline: %v; sender's stderr: %s", err, logw.String())
			}
			posts := (tc.n + tc.size - 1) / tc.size
			if raw.Events != tc.n || raw.Posts != posts || raw.Failed != 0 || raw.Latency.N != posts {
				t.Fatalf("%d events in %d POSTs (%d failed, %d timed), want %d in %d", raw.Events, raw.Posts, raw.Failed, raw.Latency.N, tc.n, posts)
			}
			if raw.Process != tc.process || raw.Client != tc.client || raw.Concurrency != tc.conc || raw.Seconds <= 0 || raw.PerSec <= 0 || raw.CPUUs <= 0 {
				t.Fatalf("report %+v", raw)
			}
		})
	}
}

// A sender process that cannot reach the receiver fails the baseline and says why.
func TestRawSenderUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String() + "/hook"
	ln.Close() // nothing listens there now
	for _, client := range []string{rawNetHTTP, rawFastHTTP} {
		t.Run(client, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			job := rawJob{Client: client, URL: url, Secret: secret, Type: "webhookload.rtest.load", N: 3, Conc: 1, Size: 1}
			_, err := rawInChild(ctx, job, io.Discard)
			if err == nil || !strings.Contains(err.Error(), "sender process") || !strings.Contains(err.Error(), "none of 3 POSTs") {
				t.Fatalf("err = %v, want the sender process's none of 3 POSTs", err)
			}
		})
	}
}

// The report names where the baseline's sender ran and gives the drain beside the whole run.
func TestReportPrintsBaselineProcessAndDrain(t *testing.T) {
	for _, tc := range []struct{ process, want string }{
		{rawOwn, "through fasthttp, sender in its own process: 40000.0 events/s"},
		{rawShared, "through fasthttp, sender in the receiver's process: 40000.0 events/s"},
	} {
		r := &report{Delivered: 30000, DeliveredPerSec: 10000, DeliveredAfter: 20000, DeliveredDrain: 25000, RawRatio: 0.25, DrainRatio: 0.625,
			Raw: &rawReport{Client: rawFastHTTP, Process: tc.process, Events: 30000, Posts: 30000, Concurrency: 16, PerSec: 40000}}
		var out strings.Builder
		r.Print(&out)
		for _, want := range []string{tc.want, "carehub ÷ raw 0.250, drain ÷ raw 0.625", "after publishing 25000.0 delivered/s (the drain: 20000 events)"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("report lacks %q:\n%s", want, out.String())
			}
		}
	}
}

// The run's CPU is told apart by process: the node's from its /metrics, this process's, and the
// rest of the machine's busy time; an event's share of each, and the cores left idle.
func TestCPUByProcess(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"+
			"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n")
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	node := wsfleet.NewNode(srv.URL, 1)
	a, ok := sampleCPU(t.Context(), node, srv.URL+"/metrics")
	if !ok || a.node != 12500*time.Millisecond || a.busy <= 0 {
		t.Fatalf("sample %+v, ok %v", a, ok)
	}
	if _, ok := sampleCPU(t.Context(), node, srv.URL+"/nothing-here"); ok {
		t.Fatal("a page without the process metric gave a sample")
	}

	b := cpuSample{node: a.node + 4*time.Second, self: a.self + 3*time.Second, busy: a.busy + 10*time.Second,
		idle: a.idle + 2*time.Second, at: a.at.Add(10 * time.Second)}
	c := cpuBetween(a, b, 100_000)
	if c.NodeUs != 40 || c.Webhookload != 30 || c.RestUs != 30 || c.IdleCores != 0.2 {
		t.Fatalf("cpu %+v, want node 40, webhookload 30, rest 30 µs an event, 0.2 cores idle", *c)
	}
	if cpuBetween(a, b, 0) != nil {
		t.Fatal("no event delivered, yet a cost an event")
	}
	r := &report{CPU: c}
	var out strings.Builder
	r.Print(&out)
	if want := "cpu an event   node 40.0 µs, webhookload 30.0 µs (publishing and receiving), the rest of the machine 30.0 µs"; !strings.Contains(out.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, out.String())
	}
}
