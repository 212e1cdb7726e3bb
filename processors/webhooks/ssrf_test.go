package webhooks

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"carehub/internal/testenv"
	"carehub/kernel/fault"
)

func TestPublicAddr(t *testing.T) {
	for _, tc := range []struct {
		ip     string
		public bool
	}{
		{"93.184.215.14", true},
		{"2606:2800:21f:cb07:6820:80da:af6b:8b2c", true},
		{"127.0.0.1", false},
		{"127.8.9.10", false},
		{"::1", false},
		{"10.0.0.1", false},
		{"172.16.5.4", false},
		{"192.168.1.1", false},
		{"169.254.169.254", false}, // cloud metadata
		{"fe80::1", false},
		{"fc00::1", false},
		{"0.0.0.0", false},
		{"::", false},
		{"100.64.0.1", false}, // CGNAT
		{"100.127.255.254", false},
		{"224.0.0.1", false},
		{"ff02::1", false},
		{"255.255.255.255", false},
		{"::ffff:127.0.0.1", false}, // IPv4-mapped loopback
		{"::ffff:8.8.8.8", true},
		{"64:ff9b::a00:1", false}, // NAT64 of 10.0.0.1
		{"64:ff9b::808:808", true},
		{"2002:7f00:1::", false}, // 6to4 of 127.0.0.1
		{"198.18.0.1", false},
	} {
		if got := PublicAddr(netip.MustParseAddr(tc.ip)); got != tc.public {
			t.Errorf("PublicAddr(%s) = %v, want %v", tc.ip, got, tc.public)
		}
	}
}

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
		_, err := strict.Create(f.admin, f.projectID, u, []string{"*"})
		if fault.KindOf(err) != fault.KindValidation {
			t.Errorf("Create(%q): %v, want a validation error", u, err)
		}
	}
	sub, err := strict.Create(f.admin, f.projectID, "https://hooks.example.com/carehub", []string{"*"})
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

// The dialer judges the address it connects to, after name resolution: "localhost" passes no
// literal check here, resolves to loopback, and is refused before any byte is sent.
func TestDialerRefusesNonPublicAddressesAtConnect(t *testing.T) {
	hit := false
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hit = true }))
	defer srv.Close()
	port := srv.URL[strings.LastIndexByte(srv.URL, ':')+1:]
	s := newSender(false, 5*time.Second, 1)
	for _, u := range []string{"https://localhost:" + port + "/", srv.URL} {
		out := s.send(context.Background(), u, "evt_1", []byte(`{}`), []string{newSecret()})
		if out.StatusCode != 0 || !strings.Contains(out.Err, ErrForbiddenDestination.Error()) {
			t.Errorf("%s: status %d, error %q; want refused at connect", u, out.StatusCode, out.Err)
		}
	}
	if hit {
		t.Error("the loopback server was reached")
	}
	if err := dialControl("tcp", "127.0.0.1:443", nil); !errors.Is(err, ErrForbiddenDestination) {
		t.Errorf("dialControl(127.0.0.1) = %v", err)
	}
	if err := dialControl("tcp", "93.184.215.14:443", nil); err != nil {
		t.Errorf("dialControl(public) = %v", err)
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
