package webhooks

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"carehub/internal/testenv"
	"carehub/internal/testenv/rawhttp"
	"carehub/kernel/whsig"
)

// TestPlainAttemptIsWhatIsRecorded: a plain http:// attempt (fasthttp's client, plain.go) reaches
// net/http's server as the attempt records it: POST to the URL as given, every header recorded
// and no other of carehub's, the body byte for byte under a signature that verifies; and the
// answer's status, excerpt and Retry-After are read as over TLS.
func TestPlainAttemptIsWhatIsRecorded(t *testing.T) {
	secret := whsig.NewSecret()
	body := []byte(`{"event":"plain.test","payload":{"text":"<a&b>"}}`)
	type seen struct {
		method, uri string
		header      http.Header
		body        []byte
	}
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.RequestURI, r.Header.Clone(), b}
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "busy now")
	}))
	defer srv.Close()
	s := newSender(true, 5*time.Second, 1, nil)
	defer s.close()

	const path = "/hooks//a/../b?x=1&y=%20"
	out := s.send(context.Background(), srv.URL+path, "evt_1", body, []string{secret})
	if out.StatusCode != http.StatusServiceUnavailable || out.Err != "HTTP 503" || out.ResponseBody != "busy now" || out.RetryAfter != 7*time.Second {
		t.Fatalf("outcome status %d, error %q, excerpt %q, retry after %v; want 503, HTTP 503, busy now, 7s",
			out.StatusCode, out.Err, out.ResponseBody, out.RetryAfter)
	}
	r := <-got
	if r.method != http.MethodPost || r.uri != path {
		t.Errorf("request %s %s, want POST %s", r.method, r.uri, path)
	}
	if string(r.body) != string(body) {
		t.Errorf("body %q, want %q", r.body, body)
	}
	for k, vs := range out.Header {
		if got := r.header.Values(k); len(got) != len(vs) || got[0] != vs[0] {
			t.Errorf("header %s: received %q, recorded %q", k, got, vs)
		}
	}
	for _, k := range []string{"Content-Type", "User-Agent", "Webhook-Id", "Webhook-Timestamp", "Webhook-Signature"} {
		if out.Header.Get(k) == "" {
			t.Errorf("header %s not recorded", k)
		}
	}
	if !whsig.Verify(secret, r.header.Get("Webhook-Id"), r.header.Get("Webhook-Timestamp"), r.body, r.header.Get("Webhook-Signature")) {
		t.Error("the signature received does not verify")
	}
}

// TestPlainAttemptSurvivesAKeptConnectionClosedWhileIdle: a receiver that closes each connection
// once it has answered, without saying so (as a short keep-alive does). The next attempt, written
// on the kept connection, finds it closed before any answer, and is made once more on a new one.
func TestPlainAttemptSurvivesAKeptConnectionClosedWhileIdle(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns, answered atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err == nil {
					answered.Add(1)
				}
			}()
		}
	}()
	s := newSender(true, 5*time.Second, 1, nil)
	defer s.close()
	for i := range 3 {
		out := s.send(context.Background(), "http://"+ln.Addr().String()+"/", "evt_1", []byte(`{}`), []string{whsig.NewSecret()})
		if !out.Succeeded() || out.ResponseBody != "ok" {
			t.Fatalf("attempt %d: status %d, error %q, excerpt %q; want 200 ok", i, out.StatusCode, out.Err, out.ResponseBody)
		}
		time.Sleep(50 * time.Millisecond) // the receiver's close reaches the client
	}
	if answered.Load() != 3 || conns.Load() < 3 {
		t.Errorf("%d answers on %d connections, want 3 on 3 or more", answered.Load(), conns.Load())
	}
}

// TestAbortEndsPlainAttemptsInFlight: fasthttp takes no context, so a dispatcher that stops
// closes its plain connections (sender.abort): an attempt waiting for a silent receiver ends at
// once, as cancelled, not at the attempt timeout, and no attempt starts after.
func TestAbortEndsPlainAttemptsInFlight(t *testing.T) {
	url, accepted := rawhttp.Serve(t, nil, true) // reads the request, answers nothing, holds on
	s := newSender(true, 30*time.Second, 1, nil)
	defer s.close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan outcome, 1)
	go func() { done <- s.send(ctx, url, "evt_1", []byte(`{}`), []string{whsig.NewSecret()}) }()
	for deadline := time.Now().Add(5 * time.Second); accepted.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the receiver never read the attempt")
		}
	}
	cancel()
	s.abort()
	select {
	case out := <-done:
		if out.StatusCode != 0 || out.Err != "cancelled" {
			t.Errorf("status %d, error %q; want no status, cancelled", out.StatusCode, out.Err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the attempt in flight did not end when the sender was aborted")
	}
	if out := s.send(context.Background(), url, "evt_2", []byte(`{}`), []string{whsig.NewSecret()}); out.StatusCode != 0 || out.Err != "stopping" {
		t.Errorf("attempt after abort: status %d, error %q; want none, stopping", out.StatusCode, out.Err)
	}
}

// A receiver nobody here wrote, over plain HTTP/1.1: Node.js's own server (node:http) with a
// keep-alive of 150 ms (Node 20 closes an idle connection about a second after it), so that
// between rounds of deliveries 1.5 s apart it closes every connection the dispatcher keeps
// (Node's default is 5 s; many receivers are shorter than the client's 90 s).
// Each round's first attempts find their connections closed and are made again on new ones:
// every delivery arrives once, is recorded succeeded at its first attempt, and the Standard
// Webhooks reference verifier accepts each signature.
func TestDeliveryToNodeHTTP1ReceiverWithShortKeepAlive(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Missing(t, "node is not installed: the Node.js HTTP/1.1 receiver cannot run")
	}
	port, lines := startNodeReceiver(t, node, "KEEPALIVE_MS=150")
	f := newFixture(t)
	sub := f.create("http://127.0.0.1:"+strconv.Itoa(port)+"/hooks", "*")
	f.start()
	const rounds, perRound = 3, 20
	var ds []signedDelivery
	for round := range rounds {
		for i := range perRound {
			f.publish("device.observation_received", map[string]int{"round": round, "n": i})
		}
		ds = nodeDeliveries(t, lines, (round+1)*perRound, "1.1", sub.Secret, ds)
		time.Sleep(1500 * time.Millisecond) // past the receiver's keep-alive: it closes the connections
	}
	if len(ds) != rounds*perRound {
		t.Errorf("%d requests for %d deliveries: some were sent twice", len(ds), rounds*perRound)
	}
	testenv.Eventually(t, 20*time.Second, "every delivery recorded", func() bool {
		rows := f.deliveries(sub.ID)
		for _, d := range rows {
			if d.Status != DeliverySucceeded {
				return false
			}
		}
		return len(rows) == rounds*perRound
	})
	for _, d := range f.deliveries(sub.ID) {
		if d.AttemptCount != 1 {
			atts, err := f.svc.Attempts(f.admin, []string{d.ID})
			if err != nil {
				t.Fatal(err)
			}
			var errs []string
			for _, a := range atts[d.ID] {
				if a.Error != nil {
					errs = append(errs, *a.Error)
				}
			}
			t.Errorf("delivery %s succeeded at attempt %d; the failed ones: %q", d.ID, d.AttemptCount, errs)
		}
	}
	if code, rejected := verifyWithNode(t, ds); code != 0 || len(rejected) > 0 {
		t.Errorf("the reference verifier rejected %v (exit %d)", rejected, code)
	}
}
