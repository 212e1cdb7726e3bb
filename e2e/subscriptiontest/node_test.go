package subscriptiontest

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"sync"
	"testing"
	"time"

	"carehub/api/ws/wstest"
	"carehub/storage/demo"
)

// TestNodeClients: the npm graphql-ws and subscriptions-transport-ws clients subscribe to a real
// node's eventStream with a key in their connection parameters and receive the events published
// through HTTP meanwhile, as {data: {eventStream: {...}}}. A bad key makes both fail.
func TestNodeClients(t *testing.T) {
	client := wstest.NewNodeClient(t)
	n := startNode(t)
	key := n.DemoKey()
	project := n.projectID(t, key, demo.DemoOrgSlug, demo.SepsisProjectName)
	n.ready(t, key, project)
	vars, _ := json.Marshal(map[string]any{"projectId": project, "types": []string{"node.ping"}})
	env := []string{
		"WS_URL=" + n.wsURL(),
		"WS_QUERY=" + eventStreamQuery,
		"WS_VARIABLES=" + string(vars),
		"WS_FIELD=eventStream",
		"WS_COUNT=3",
		"WS_TIMEOUT_MS=20000",
	}

	for _, library := range []string{"graphql-ws", "subscriptions-transport-ws"} {
		t.Run(library, func(t *testing.T) {
			// Publish a matching event every 100 ms (and a non-matching one) while the client runs.
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var pubErr error
			wg.Go(func() {
				tick := time.NewTicker(100 * time.Millisecond)
				defer tick.Stop()
				for i := 0; ; i++ {
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
					for _, typ := range []string{"node.other", "node.ping"} {
						if _, err := n.publish(ctx, key, project, typ, map[string]any{"seq": i}); err != nil && ctx.Err() == nil {
							pubErr = err
							return
						}
					}
				}
			})
			s, err := client.Run(t, append(env, "WS_KEY=Bearer "+key, "WS_LIBRARY="+library)...)
			cancel()
			wg.Wait()
			if pubErr != nil {
				t.Fatal(pubErr)
			}
			if err != nil || !s.OK || len(s.Results) != 1 || s.Results[0].Library != library || s.Results[0].Received != 3 {
				t.Fatalf("client.mjs (%v): %+v", err, s)
			}
			var sample struct {
				Data struct{ EventStream event }
			}
			if err := json.Unmarshal(s.Results[0].Sample, &sample); err != nil {
				t.Fatal(err)
			}
			if ev := sample.Data.EventStream; ev.Type != "node.ping" || ev.ProjectID != project || ev.seq() < 0 {
				t.Fatalf("%s received %s, want a node.ping event of %s", library, s.Results[0].Sample, project)
			}
			n.waitSubscribers(t, 0) // the client's complete (stop) ended the subscription
		})
	}

	t.Run("refused key", func(t *testing.T) {
		s, err := client.Run(t, append(env, "WS_KEY=Bearer chk_live_0123456789abcdefghijABCDEFGHIJ01", "WS_LIBRARY=all",
			"WS_TIMEOUT_MS=5000")...)
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) || exitErr.ExitCode() != 1 || s.OK || len(s.Results) != 2 {
			t.Fatalf("client.mjs with a bad key: %v, %+v; want both libraries to fail", err, s)
		}
		for _, r := range s.Results {
			if r.OK || r.Received != 0 {
				t.Fatalf("%s with a bad key: %+v", r.Library, r)
			}
			t.Logf("%s with a bad key: %s", r.Library, r.Error)
		}
	})
}
