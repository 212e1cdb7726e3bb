package webhooks

import (
	"bufio"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"carehub/internal/testenv"
	"carehub/kernel/events"
	"carehub/kernel/whsig"
)

// newTLSReceiver is a receiver serving HTTPS on loopback, offering HTTP/2 as well as HTTP/1.1
// when h2, and the pool that trusts its certificate.
func newTLSReceiver(t testing.TB, h2 bool) (*receiver, *x509.CertPool) {
	rc := &receiver{arrived: make(chan struct{}, 1)}
	rc.Server = httptest.NewUnstartedServer(http.HandlerFunc(rc.serve))
	rc.EnableHTTP2 = h2
	rc.StartTLS()
	t.Cleanup(rc.Close)
	roots := x509.NewCertPool()
	roots.AddCert(rc.Certificate())
	return rc, roots
}

// Receivers are HTTPS in production (http:// only with --webhooks-allow-private). A receiver
// that offers HTTP/2 gets its deliveries over HTTP/2, concurrent ones multiplexed on one
// connection; one that offers only HTTP/1.1 gets them over HTTP/1.1 on connections kept alive,
// about the subscription's maxInFlight of them. Every delivery is signed and arrives once.
func TestDeliveryOverTLSTakesTheReceiversProtocol(t *testing.T) {
	for _, tc := range []struct {
		name     string
		h2       bool
		ordered  bool
		proto    string
		maxConns int
	}{
		{name: "http2", h2: true, proto: "HTTP/2.0", maxConns: 1},
		// net/http returns a connection to its idle pool just after the answer is read, so an
		// attempt begun in that moment may open one more: kept alive is far fewer than requests.
		{name: "http1.1", proto: "HTTP/1.1", maxConns: 2 * DefaultMaxInFlightPerSubscription},
		{name: "http2 ordered batches", h2: true, ordered: true, proto: "HTTP/2.0", maxConns: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			rc, roots := newTLSReceiver(t, tc.h2)
			opts := Options{}
			if tc.ordered {
				opts = Options{Ordered: ptr(true), BatchSize: ptr(20)}
			}
			sub := f.createWith(opts, rc.URL, "*")
			var evs []events.Event
			for i := range 300 {
				evs = append(evs, f.publish("device.observation_received", map[string]int{"n": i}))
			}
			f.start(func(c *DispatcherConfig) { c.RootCAs = roots })
			for _, ev := range evs {
				f.waitDeliveryStatus(sub.ID, ev.ID, DeliverySucceeded)
			}
			conns := map[string]bool{}
			for i, req := range rc.requests() {
				if req.Proto != tc.proto {
					t.Fatalf("request %d came over %s, want %s", i, req.Proto, tc.proto)
				}
				if !whsig.Verify(sub.Secret, req.id(), req.Header.Get(whsig.HeaderTimestamp), req.Body, req.Header.Get(whsig.HeaderSignature)) {
					t.Errorf("request %d: the signature does not verify", i)
				}
				conns[req.Remote] = true
			}
			if len(conns) > tc.maxConns {
				t.Errorf("%d requests over %d connections, want at most %d (kept alive)", len(rc.requests()), len(conns), tc.maxConns)
			}
		})
	}
}

// A receiver whose certificate no trusted authority signed gets no delivery: the attempt fails
// with the reason recorded, and the delivery waits for a retry.
func TestDeliveryRefusesAnUntrustedCertificate(t *testing.T) {
	f := newFixture(t)
	rc, _ := newTLSReceiver(t, true)
	sub := f.create(rc.URL, "*")
	ev := f.publish("device.observation_received", map[string]int{"n": 1})
	f.start(func(c *DispatcherConfig) { c.Schedule = []time.Duration{0, time.Hour} })
	var errText string
	testenv.Eventually(t, 30*time.Second, "the failed attempt", func() bool {
		for _, d := range f.deliveries(sub.ID) {
			if d.EventID != ev.ID {
				continue
			}
			atts, err := f.svc.Attempts(f.admin, []string{d.ID})
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range atts[d.ID] {
				if a.Error != nil {
					errText = *a.Error
					return true
				}
			}
		}
		return false
	})
	if !strings.Contains(errText, "certificate") {
		t.Errorf("attempt error %q, want it to name the certificate", errText)
	}
	if rc.count() != 0 {
		t.Errorf("the receiver got %d requests, want none", rc.count())
	}
}

// A receiver nobody here wrote: Node.js's HTTP/2 server (node:http2, on nghttp2), which speaks
// nothing but HTTP/2. Every delivery arrives over HTTP/2 and the Standard Webhooks reference
// verifier (npm standardwebhooks) accepts each one's signature.
func TestDeliveryToNodeHTTP2Receiver(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Missing(t, "node is not installed: the Node.js HTTP/2 receiver cannot run")
	}
	// httptest's certificate for 127.0.0.1, handed to Node.
	tlsSrv := httptest.NewUnstartedServer(http.NotFoundHandler())
	tlsSrv.StartTLS()
	certFile, keyFile := testenv.TLSFiles(t, tlsSrv)
	roots := x509.NewCertPool()
	roots.AddCert(tlsSrv.Certificate())
	tlsSrv.Close()

	port, lines := startNodeReceiver(t, node, "CERT="+certFile, "KEY="+keyFile)
	f := newFixture(t)
	sub := f.create("https://127.0.0.1:"+strconv.Itoa(port)+"/hooks", "*")
	const n = 50
	for i := range n {
		f.publish("device.observation_received", map[string]int{"n": i})
	}
	f.start(func(c *DispatcherConfig) { c.RootCAs = roots })
	ds := nodeDeliveries(t, lines, n, "2.0", sub.Secret, nil)
	if code, rejected := verifyWithNode(t, ds); code != 0 || len(rejected) > 0 {
		t.Errorf("the reference verifier rejected %v (exit %d)", rejected, code)
	}
}

// startNodeReceiver runs nodeverify/receiver.mjs under node with env added and returns the port
// it listens on and its lines (one a request). The receiver ends with the test.
func startNodeReceiver(t *testing.T, node string, env ...string) (int, <-chan []byte) {
	t.Helper()
	cmd := exec.Command(node, filepath.Join("nodeverify", "receiver.mjs"))
	cmd.Env = append(os.Environ(), env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = t.Output()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	lines := make(chan []byte, 1024)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			lines <- append([]byte(nil), sc.Bytes()...)
		}
		close(lines)
	}()
	var listening struct{ Port int }
	select {
	case l, ok := <-lines:
		if !ok || json.Unmarshal(l, &listening) != nil || listening.Port == 0 {
			t.Fatalf("the Node receiver did not start: %s", l)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the Node receiver did not start within 30 s")
	}
	return listening.Port, lines
}

// nodeDeliveries reads a Node receiver's lines onto ds until they hold n deliveries (distinct
// webhook-ids), each of which must have come over HTTP/version, and returns every request read
// as a delivery signed with secret.
func nodeDeliveries(t *testing.T, lines <-chan []byte, n int, version, secret string, ds []signedDelivery) []signedDelivery {
	t.Helper()
	ids := map[string]bool{}
	for _, d := range ds {
		ids[d.Name] = true
	}
	deadline := time.After(60 * time.Second)
	for len(ids) < n {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the Node receiver ended")
			}
			var got struct {
				HTTPVersion string            `json:"httpVersion"`
				Headers     map[string]string `json:"headers"`
				BodyBase64  string            `json:"bodyBase64"`
			}
			if err := json.Unmarshal(l, &got); err != nil {
				t.Fatalf("receiver line %s: %v", l, err)
			}
			if got.HTTPVersion != version {
				t.Errorf("a delivery over HTTP/%s, want %s", got.HTTPVersion, version)
			}
			ids[got.Headers["webhook-id"]] = true
			ds = append(ds, signedDelivery{Name: got.Headers["webhook-id"], Secret: secret, Headers: got.Headers, BodyBase64: got.BodyBase64})
		case <-deadline:
			t.Fatalf("%d of %d deliveries at the Node receiver after 60 s", len(ids), n)
		}
	}
	return ds
}
