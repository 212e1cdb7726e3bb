package main

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"carehub/kernel/whsig"
	"carehub/loadtest/loadcli"
	"carehub/loadtest/loadcli/loadclitest"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" // 24 bytes of base64

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
		return config{Listen: "127.0.0.1:0", RawClient: rawNetHTTP, Command: loadcli.Command{URL: "http://127.0.0.1:8080", Keys: []string{"chk_live_x"},
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
