package wstest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"carehub/internal/testenv"
)

// NodeSummary is what api/ws/nodetest/client.mjs prints: how each npm library (graphql-ws's
// createClient, subscriptions-transport-ws's SubscriptionClient) did against an endpoint.
type NodeSummary struct {
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

// NodeClient is client.mjs ready to run: node found and the pinned libraries installed.
type NodeClient struct {
	node string
	dir  string
}

// nodeDir is api/ws/nodetest, found from this file so that any package's tests can use it.
func nodeDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "nodetest")
}

// NewNodeClient finds node and installs the pinned client libraries with npm ci when
// node_modules is missing or older than package-lock.json (`make node-deps` does it ahead).
// --prefer-offline serves repeat installs from npm's cache. Without node (or npm when an
// install is needed) the test is skipped, or fails under testenv.RequireEnv.
func NewNodeClient(t testing.TB) *NodeClient {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Missing(t, "node is not on PATH: skipping the graphql-ws and subscriptions-transport-ws clients")
	}
	c := &NodeClient{node: node, dir: nodeDir()}
	lock, err := os.Stat(filepath.Join(c.dir, "package-lock.json"))
	if err != nil {
		t.Fatalf("package-lock.json: %v", err)
	}
	installed, err := os.Stat(filepath.Join(c.dir, "node_modules", ".package-lock.json"))
	if err == nil && !installed.ModTime().Before(lock.ModTime()) {
		return c
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		testenv.Missing(t, "npm is not on PATH and api/ws/nodetest/node_modules is missing or stale (make node-deps)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--prefer-offline", "--no-audit", "--no-fund", "--ignore-scripts")
	cmd.Dir = c.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", c.dir, err, out)
	}
	return c
}

// Run runs client.mjs with env (WS_URL, WS_QUERY, WS_LIBRARY…) added to the environment and
// returns its summary and exit error; a run that prints no summary fails the test.
func (c *NodeClient) Run(t testing.TB, env ...string) (NodeSummary, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.node, "client.mjs")
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	var s NodeSummary
	if err := json.Unmarshal(bytes.TrimSpace(out), &s); err != nil {
		t.Fatalf("client.mjs printed no JSON summary (%v): stdout %q stderr %q", runErr, out, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Logf("client.mjs stderr: %s", stderr.String())
	}
	return s, runErr
}
