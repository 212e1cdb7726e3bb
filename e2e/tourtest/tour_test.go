// Package tourtest runs README.md's five-minute tour verbatim against a live node, so the tour
// cannot go stale: every ```sh block between <!-- tour --> and <!-- /tour --> is pasted at once,
// as a person pastes it, into one bash (set -euo pipefail) with CAREHUB_URL and CAREHUB_KEY of an
// in-process node. Nothing waits between the blocks but what the blocks write themselves.
package tourtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"carehub/cmd/carehub/node"
	"carehub/e2e/servertest"
	"carehub/internal/testenv"
	"carehub/storage/postgres/pgtest"
)

// binary is bin/carehub of the tour, built once for the package.
var binary string

func TestMain(m *testing.M) {
	var remove func()
	binary, remove = testenv.BuildCarehub()
	code := pgtest.Run(m)
	remove() // after Run, not deferred: os.Exit skips deferred calls
	os.Exit(code)
}

// tourBlocks returns the shell blocks of README.md's tour, in order.
func tourBlocks(t *testing.T) []string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "<!-- tour -->")
	tour, _, ok2 := strings.Cut(rest, "<!-- /tour -->")
	if !ok || !ok2 {
		t.Fatal("README.md: no <!-- tour --> … <!-- /tour --> section")
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(tour, -1) {
		blocks = append(blocks, m[1])
	}
	if len(blocks) < 3 {
		t.Fatalf("README.md tour: %d sh blocks", len(blocks))
	}
	return blocks
}

// paste writes every block into one bash at once, at "the repository root" (a directory with
// bin/carehub), and returns what the shell printed when it ends, within limit.
func paste(t *testing.T, s *servertest.Server, blocks []string, limit time.Duration) (stdout, stderr string, err error) {
	for _, tool := range []string{"bash", "curl", "jq", "python3", "timeout"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, "the README tour needs %s (make test-deps)", tool)
		}
	}
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(binary, filepath.Join(root, "bin", "carehub")); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hookPort := fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
	l.Close()

	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	sh := exec.CommandContext(ctx, "bash", "-euo", "pipefail")
	sh.Dir = root
	sh.Env = append(os.Environ(), "CAREHUB_URL="+slowUpgrades(t, s.URL), "CAREHUB_KEY="+s.DemoKey(), "HOOK_PORT="+hookPort, "TMPDIR="+root)
	// The receiver and the subscriber go with the shell, on time or not.
	sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	sh.Cancel = func() error { return syscall.Kill(-sh.Process.Pid, syscall.SIGKILL) }
	t.Cleanup(func() {
		if sh.Process != nil {
			syscall.Kill(-sh.Process.Pid, syscall.SIGKILL)
		}
	})
	sh.Stdin = strings.NewReader(strings.Join(blocks, "\n"))
	// Files, not pipes: the shell has ended when it exits, whatever it left in the background.
	outFile, errFile := filepath.Join(root, "stdout"), filepath.Join(root, "stderr")
	if sh.Stdout, err = os.Create(outFile); err != nil {
		t.Fatal(err)
	}
	if sh.Stderr, err = os.Create(errFile); err != nil {
		t.Fatal(err)
	}
	err = sh.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("the tour did not end within %s", limit)
	}
	sh.Stdout.(*os.File).Close()
	sh.Stderr.(*os.File).Close()
	o, _ := os.ReadFile(outFile)
	e, _ := os.ReadFile(errFile)
	return string(o), string(e), err
}

// slowUpgrades stands between the tour and the node and holds each WebSocket upgrade for a
// second, as a loaded machine or a distant node does: a block that posts an event before its
// subscription is held then misses it, as the reader did.
func slowUpgrades(t *testing.T, node string) string {
	u, err := url.Parse(node)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			time.Sleep(time.Second)
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestREADMETour(t *testing.T) {
	blocks := tourBlocks(t)
	s := servertest.Start(t)
	start := time.Now()
	got, stderr, err := paste(t, s, blocks, 4*time.Minute)
	if err != nil {
		t.Fatalf("tour: %v\nstdout:\n%s\nstderr:\n%s", err, got, stderr)
	}
	t.Logf("tour output (%s):\n%s", time.Since(start).Round(time.Millisecond), got)
	for _, want := range []string{
		`"name":"Sepsis Early Warning"`,                  // GET /v1/projects
		`"events":["device.observation_received"]`,       // the webhook
		`"type":"device.observation_received"`,           // the subscription
		"webhook ",                                       // the receiver's line
		`"status":"COMPLETED","skill":"news2","score":3`, // NEWS2
		`{"runtime":"onnx","probability":`,               // the demo model
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the tour's output lacks %s", want)
		}
	}
	if !regexp.MustCompile(`webhook \S+ signed: True .*device\.observation_received`).MatchString(got) {
		t.Error("the receiver got no signed device.observation_received")
	}
}

// On a node that does not deliver to loopback, the pasted tour stops at the webhook with the
// server's refusal, which names the flag, instead of printing {"id":null,…} and waiting.
func TestREADMETourStopsAtARefusedWebhook(t *testing.T) {
	blocks := tourBlocks(t)
	s := servertest.Start(t, func(c *node.Config) { c.WebhooksAllowPrivate = false })
	start := time.Now()
	got, stderr, err := paste(t, s, blocks, 2*time.Minute)
	if err == nil {
		t.Fatalf("the tour succeeded on a node without --webhooks-allow-private\nstdout:\n%s\nstderr:\n%s", got, stderr)
	}
	if elapsed := time.Since(start); elapsed > 30*time.Second {
		t.Errorf("the tour took %s to fail; want it stopped at the refusal", elapsed)
	}
	if !strings.Contains(stderr, "webhook refused: ") || !strings.Contains(stderr, "--webhooks-allow-private") {
		t.Errorf("stderr does not carry the refusal naming --webhooks-allow-private:\n%s", stderr)
	}
	if strings.Contains(got, `"id":null`) {
		t.Errorf("the refusal printed as a webhook:\n%s", got)
	}
}
