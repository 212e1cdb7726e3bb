package ws

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"carehub/internal/testenv"
)

// nodeDir holds client.mjs, package.json and the committed package-lock.json.
const nodeDir = "nodetest"

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

// ensureNodeModules installs the pinned client libraries with npm ci when node_modules is
// missing or older than package-lock.json. --prefer-offline serves repeat installs from
// npm's cache, so after the first run this needs no network.
func ensureNodeModules(t *testing.T, npm string) {
	t.Helper()
	lock, err := os.Stat(filepath.Join(nodeDir, "package-lock.json"))
	if err != nil {
		t.Fatalf("package-lock.json: %v", err)
	}
	installed, err := os.Stat(filepath.Join(nodeDir, "node_modules", ".package-lock.json"))
	if err == nil && !installed.ModTime().Before(lock.ModTime()) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--prefer-offline", "--no-audit", "--no-fund", "--ignore-scripts")
	cmd.Dir = nodeDir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", nodeDir, err, out)
	}
}

func runNodeClient(t *testing.T, node string, env ...string) (nodeSummary, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "client.mjs")
	cmd.Dir = nodeDir
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

// TestNodeClients runs graphql-ws's createClient and subscriptions-transport-ws's
// SubscriptionClient against the handler, as browsers and Node services would.
func TestNodeClients(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Missing(t, "node is not on PATH: skipping the graphql-ws and subscriptions-transport-ws client test")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		testenv.Missing(t, "npm is not on PATH: skipping the graphql-ws and subscriptions-transport-ws client test")
	}
	ensureNodeModules(t, npm)
	ts := newTestServer(t, Options{})

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
			s, err := runNodeClient(t, node, append(base, "WS_KEY=Bearer "+keyAlice, "WS_LIBRARY="+library)...)
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
			waitFor(t, 5*time.Second, "the endless source to be stopped by the client", func() bool {
				return ts.root.active.Load() == 0 && ts.metric(t, "carehub_ws_operations", "") == 0
			})
		})
	}

	// The harness can fail: a refused key fails both libraries and the script exits 1.
	t.Run("refused key", func(t *testing.T) {
		s, err := runNodeClient(t, node, append(base, "WS_KEY=chk_test_nobody", "WS_LIBRARY=all", "WS_TIMEOUT_MS=5000")...)
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
