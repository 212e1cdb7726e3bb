package attacktest

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"carehub/e2e/servertest"
	"carehub/internal/testenv/rawhttp"
	"carehub/kernel/access"
)

// TestFHIRRestHookUpgradeAnswer: a rest-hook endpoint that answers the handshake "101 Switching
// Protocols" and then says nothing. net/http hands a protocol switch's connection to the caller
// outside the request's deadline, so the attempt read it until the endpoint hung up: without
// egress.Guard the attempts never ended, the subscriptions never left "requested" for "error",
// and each held a round of the deliverer (a round waits for all its attempts; a node runs two).
// The attempts must fail at once, the subscriptions go to error saying why, and another
// organization's handshake still make its subscription active.
func TestFHIRRestHookUpgradeAnswer(t *testing.T) {
	s := servertest.Start(t)
	attacker := s.Key("northwind-health", access.Live, access.Scopes...)
	url, answered := rawhttp.Serve(t, []byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: rcv\r\nConnection: Upgrade\r\n\r\n"), true)
	var hostile []string
	for i := range 2 { // as many as the deliverer runs rounds at once
		id, _, _ := fsubCreate(t, s, attacker, fsubBody("", "", url))
		hostile = append(hostile, id)
		servertest.Eventually(t, patience, "the hostile endpoint answered a handshake", func() bool { return answered.Load() > int64(i) })
	}

	var took atomic.Int64
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { took.Add(1) }))
	t.Cleanup(healthy.Close)
	theirs, _, _ := fsubCreate(t, s, s.DemoKey(), fsubBody("", "", healthy.URL))

	status := func(key, id string) (string, string) {
		var st struct{ Status, Error string }
		s.Do(http.MethodGet, "/fhir/R4/Subscription/"+id, key, nil).JSON(t, &st)
		return st.Status, st.Error
	}
	servertest.Eventually(t, patience, "another organization's rest-hook subscription active, its endpoint reached, beside endpoints that answer 101", func() bool {
		st, _ := status(s.DemoKey(), theirs)
		return st == "active" && took.Load() > 0
	})
	for _, id := range hostile {
		servertest.Eventually(t, patience, "the hostile subscriptions in error, saying why", func() bool {
			st, why := status(attacker, id)
			return st == "error" && why != ""
		})
	}
}
