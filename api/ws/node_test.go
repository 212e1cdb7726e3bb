package ws

import (
	"errors"
	"os/exec"
	"testing"
	"time"

	"carehub/api/ws/wstest"
	"carehub/internal/testenv"
)

// TestNodeClients runs graphql-ws's createClient and subscriptions-transport-ws's
// SubscriptionClient against the handler, as browsers and Node services would.
func TestNodeClients(t *testing.T) {
	client := wstest.NewNodeClient(t)
	ts := newTestServer(t, Config{})

	const count = 4
	base := []string{
		"WS_URL=" + ts.url + "/graphql",
		"WS_QUERY=subscription($n: Int!) { ticks(n: $n, intervalMs: 10) { n who } }",
		`WS_VARIABLES={"n": 100000}`,
		"WS_FIELD=ticks",
		"WS_COUNT=4",
		"WS_TIMEOUT_MS=20000",
	}

	for _, library := range []string{"graphql-ws", "subscriptions-transport-ws"} {
		t.Run(library, func(t *testing.T) {
			s, err := client.Run(t, append(base, "WS_KEY=Bearer "+keyAlice, "WS_LIBRARY="+library)...)
			if err != nil || !s.OK || len(s.Results) != 1 {
				t.Fatalf("client.mjs failed (%v): %+v", err, s)
			}
			r := s.Results[0]
			if r.Library != library || r.Received != count {
				t.Fatalf("%s received %d results, want %d: %+v", r.Library, r.Received, count, r)
			}
			if got := tickOf(t, r.Sample, "ticks"); got.N != 1 || got.Who != "alice" {
				t.Fatalf("first result %s, want tick 1 for alice", r.Sample)
			}
			// The client's complete (stop) ended the server's operation and source.
			testenv.Eventually(t, 5*time.Second, "the endless source to be stopped by the client", func() bool {
				return ts.root.active.Load() == 0 && ts.metric(t, "carehub_ws_operations", "") == 0
			})
		})
	}

	// The harness can fail: a refused key fails both libraries and the script exits 1.
	t.Run("refused key", func(t *testing.T) {
		s, err := client.Run(t, append(base, "WS_KEY=chk_test_nobody", "WS_LIBRARY=all", "WS_TIMEOUT_MS=5000")...)
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) || exitErr.ExitCode() != 1 {
			t.Fatalf("client.mjs with a bad key: %v, want exit status 1", err)
		}
		if s.OK || len(s.Results) != 2 {
			t.Fatalf("summary %+v, want two failed libraries", s)
		}
		for _, r := range s.Results {
			if r.OK || r.Received != 0 || r.Error == "" {
				t.Fatalf("%s with a bad key: %+v", r.Library, r)
			}
			t.Logf("%s with a bad key: %s", r.Library, r.Error)
		}
	})
}
