package webhooks

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"carehub/internal/testenv"
	"carehub/kernel/fault"
	"carehub/kernel/whsig"
)

func TestCreateRefusesNonPublicOrNonHTTPSURLs(t *testing.T) {
	f := newFixture(t)
	strict := NewService(f.pool, ServiceConfig{})
	for _, u := range []string{
		"http://example.com/hook",
		"https://127.0.0.1/hook",
		"https://localhost:8443/hook",
		"https://api.localhost/hook",
		"https://[::1]/hook",
		"https://10.1.2.3/hook",
		"https://169.254.169.254/latest/meta-data",
		"https://100.64.0.1/hook",
		"https://0.0.0.0/hook",
		"https://[::ffff:127.0.0.1]/hook",
		"https://2130706433/hook",
		"https://0x7f.1/hook",
		"https://user:pw@example.com/hook",
		"https://example.com/hook#frag",
		"ftp://example.com/",
		"/relative",
		"",
	} {
		_, err := strict.Create(f.admin, f.projectID, u, []string{"*"}, Options{})
		if fault.KindOf(err) != fault.KindValidation {
			t.Errorf("Create(%q): %v, want a validation error", u, err)
		}
	}
	sub, err := strict.Create(f.admin, f.projectID, "https://hooks.example.com/carehub", []string{"*"}, Options{})
	if err != nil {
		t.Fatalf("a public https URL: %v", err)
	}
	// Updates are checked the same way.
	bad := "https://192.168.0.10/"
	if _, err := strict.Update(f.admin, sub.ID, Update{URL: &bad}); fault.KindOf(err) != fault.KindValidation {
		t.Errorf("Update to %s: %v, want a validation error", bad, err)
	}
	// So is a test send to a URL.
	if _, err := strict.Test(f.admin, TestRequest{URL: "https://127.0.0.1:1/"}); fault.KindOf(err) != fault.KindValidation {
		t.Errorf("Test to loopback: %v, want a validation error", err)
	}
}

// A URL that only --webhooks-allow-private would accept is refused with a message that names the
// flag; one refused for another reason is not told about it.
func TestURLRefusalNamesAllowPrivate(t *testing.T) {
	f := newFixture(t)
	strict := NewService(f.pool, ServiceConfig{})
	for _, tt := range []struct {
		url  string
		hint bool
	}{
		{"http://127.0.0.1:9000/hook", true},
		{"http://example.com/hook", true},
		{"https://10.1.2.3/hook", true},
		{"https://user:pw@example.com/hook", false},
		{"ftp://example.com/", false},
	} {
		_, err := strict.Create(f.admin, f.projectID, tt.url, []string{"*"}, Options{})
		if fault.KindOf(err) != fault.KindValidation {
			t.Fatalf("Create(%q): %v, want a validation error", tt.url, err)
		}
		if got := strings.Contains(err.Error(), "--webhooks-allow-private"); got != tt.hint {
			t.Errorf("Create(%q): %q, names --webhooks-allow-private: %v, want %v", tt.url, err, got, tt.hint)
		}
	}
	if _, err := strict.Test(f.admin, TestRequest{URL: "http://127.0.0.1:1/"}); !strings.Contains(fmt.Sprint(err), "--webhooks-allow-private") {
		t.Errorf("Test to loopback: %v, want the flag named", err)
	}
}

// The dialer judges the address it connects to, after name resolution: "localhost" passes no
// literal check here, resolves to loopback, and is refused before any byte is sent; over plain
// http:// (fasthttp's client, plain.go) as over TLS.
func TestDialerRefusesNonPublicAddressesAtConnect(t *testing.T) {
	hit := false
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hit = true }))
	defer srv.Close()
	port := srv.URL[strings.LastIndexByte(srv.URL, ':')+1:]
	s := newSender(false, 5*time.Second, 1, nil)
	for _, u := range []string{"https://localhost:" + port + "/", srv.URL, "http://localhost:" + port + "/"} {
		out := s.send(context.Background(), u, "evt_1", []byte(`{}`), []string{whsig.NewSecret()})
		if out.StatusCode != 0 || !strings.Contains(out.Err, "webhook destination is not a public address") {
			t.Errorf("%s: status %d, error %q; want refused at connect", u, out.StatusCode, out.Err)
		}
	}
	if hit {
		t.Error("the loopback server was reached")
	}
}

// A dispatcher without AllowPrivate records the refusal as a failed attempt and never reaches
// a subscription that points at loopback (created by a service that allowed it).
func TestDispatcherRefusesLoopbackSubscriptionsAtConnect(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, nil)
	sub := f.create(rc.URL, "*")
	f.start(func(c *DispatcherConfig) { c.AllowPrivate = false; c.Schedule = oneShotSchedule })
	ev := f.publish("agent.run_completed", nil)
	testenv.Eventually(t, 20*time.Second, "the refused attempt", func() bool {
		rows := f.deliveries(sub.ID)
		return len(rows) == 1 && rows[0].AttemptCount == 1
	})
	atts, err := f.svc.Attempts(f.admin, []string{f.deliveries(sub.ID)[0].ID})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range atts {
		if len(a) != 1 || a[0].StatusCode != nil || a[0].Error == nil || !strings.Contains(*a[0].Error, "not a public address") {
			t.Errorf("attempt of %s: %+v, want refused", ev.ID, a)
		}
	}
	if rc.count() != 0 {
		t.Errorf("the loopback receiver got %d requests", rc.count())
	}
}
