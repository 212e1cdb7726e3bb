package subscriptiontest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"carehub/kernel/demo"

	"carehub/internal/testenv"
)

// nodeClientDir holds api/ws's client.mjs, which drives an endpoint with the npm graphql-ws
// (createClient) and subscriptions-transport-ws (SubscriptionClient) libraries, and its pinned
// node_modules (`make node-deps`, or npm ci there).
var nodeClientDir = filepath.Join("..", "ws", "nodetest")

// nodeSummary is what client.mjs prints.
type nodeSummary struct {
	OK      bool   `json:"ok"`
	Error   string `json:"error"`
	Results []struct {
		Library  string          `json:"library"`
		OK       bool            `json:"ok"`
		Received int             `json:"received"`
		Sample   json.RawMessage `json:"sample"`
		Error    string          `json:"error"`
	} `json:"results"`
}

// TestNodeClients: the npm graphql-ws and subscriptions-transport-ws clients subscribe to a real
// node's eventStream with a key in their connection parameters and receive the events published
// through HTTP meanwhile, as {data: {eventStream: {...}}}. A bad key makes both fail.
func TestNodeClients(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Missing(t, "node is not on PATH: skipping the graphql-ws and subscriptions-transport-ws clients")
	}
	if _, err := os.Stat(filepath.Join(nodeClientDir, "node_modules", "graphql-ws")); err != nil {
		npm, lookErr := exec.LookPath("npm")
		if lookErr != nil {
			testenv.Missing(t, "npm is not on PATH and api/ws/nodetest/node_modules is missing (make node-deps)")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, npm, "ci", "--prefer-offline", "--no-audit", "--no-fund", "--ignore-scripts")
		cmd.Dir = nodeClientDir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", nodeClientDir, err, out)
		}
	}

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
			s, err := runNodeClient(t, node, append(env, "WS_KEY=Bearer "+key, "WS_LIBRARY="+library)...)
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
		s, err := runNodeClient(t, node, append(env, "WS_KEY=Bearer chk_live_0123456789abcdefghijABCDEFGHIJ01", "WS_LIBRARY=all",
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

func runNodeClient(t *testing.T, node string, env ...string) (nodeSummary, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "client.mjs")
	cmd.Dir = nodeClientDir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	var s nodeSummary
	if err := json.Unmarshal(bytes.TrimSpace(out), &s); err != nil {
		t.Fatalf("client.mjs printed no JSON summary (%v): stdout %q stderr %q", runErr, out, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Logf("client.mjs stderr: %s", stderr.String())
	}
	return s, runErr
}
