package webhooks

import (
	"crypto/x509"
	"net/http"
	"net/http/httptest"
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
