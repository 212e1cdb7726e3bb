package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/internal/testenv"
)

// These tests drive the real binary as an operator would: build it once, then start, stop,
// kill and misconfigure it.

var binary string

const testRevision = "0123456789abcdef0123456789abcdef01234567"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "carehub-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "carehub")
	// The revision as the Makefile sets it: carehub_build_info must carry it.
	out, err := exec.Command("go", "build", "-ldflags", "-X main.revision="+testRevision, "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build carehub: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// dataDir is a data dir the postgres user can traverse (t.TempDir is under /tmp).
func dataDir(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "data")
}

type process struct {
	cmd    *exec.Cmd
	addr   string
	stdout *syncBuffer
	stderr *syncBuffer
	exited chan struct{} // closed once the process has exited; then err is its Wait's error
	err    error
}

// syncBuffer is written by exec's copying goroutine while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// serve starts `carehub serve` on addr and waits until /readyz answers 200. FreeAddr's port was
// free when it was chosen, not necessarily when carehub binds it (another test's connection may
// take it meanwhile): a carehub that exits for that reason is started again on another free
// port, and the process's addr is the one it serves on.
func serve(t *testing.T, dir, addr string, extra ...string) *process {
	t.Helper()
	for attempt := 1; ; attempt++ {
		n := start(t, dir, addr, extra...)
		if n.ready(t) {
			return n
		}
		if !strings.Contains(n.stderr.String(), "address already in use") || attempt == 3 {
			t.Fatalf("carehub exited before it was ready (%v)\nstderr:\n%s", n.err, n.stderr)
		}
		t.Logf("%s was taken before carehub bound it; starting again on another port", n.addr)
		addr = testenv.FreeAddr(t)
	}
}

// ready waits until n answers /readyz with 200 (true) or exits (false); it fails the test when
// neither happens within 90 s.
func (n *process) ready(t *testing.T) bool {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get("http://" + n.addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
		select {
		case <-n.exited:
			return false
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("carehub not ready after 90 s\nstderr:\n%s", n.stderr)
		}
	}
}

// start starts `carehub serve`; the test's cleanup stops it if it is still running, with SIGTERM
// so that it stops the Postgres it started (a killed node leaves that running), then kills it.
func start(t *testing.T, dir, addr string, extra ...string) *process {
	t.Helper()
	args := append([]string{"serve", "--data-dir", dir, "--http-addr", addr, "--partitions", "2"}, extra...)
	cmd := exec.Command(binary, args...)
	n := &process{cmd: cmd, addr: addr, stdout: &syncBuffer{}, stderr: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = n.stdout, n.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		n.err = cmd.Wait()
		close(n.exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-n.exited
		}
	})
	return n
}

func (n *process) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	n.cmd.Process.Signal(sig)
	select {
	case <-n.exited:
		if sig == syscall.SIGTERM && n.err != nil {
			t.Fatalf("carehub exited with %v after SIGTERM\nstderr:\n%s", n.err, n.stderr)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("carehub did not exit within 60 s")
	}
}

// checkLogLines checks a first start's log (the embedded cluster made, migrations applied, demo
// data seeded): durations are numbers of milliseconds under a key saying so, not nanoseconds,
// no line names its component twice, and the seed is reported once.
func checkLogLines(t *testing.T, log string) {
	t.Helper()
	seeded := 0
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Errorf("not a JSON log line: %s", sc.Text())
			continue
		}
		if line["msg"] == "demo data seeded" {
			seeded++
		}
		if n := strings.Count(sc.Text(), `"component":`); n > 1 {
			t.Errorf("component %d times: %s", n, sc.Text())
		}
		for k, v := range line {
			if (strings.Contains(k, "duration") || strings.Contains(k, "elapsed")) && !strings.HasSuffix(k, "_ms") {
				t.Errorf("%s=%v is not in milliseconds: %s", k, v, sc.Text())
			}
		}
	}
	if seeded != 1 {
		t.Errorf("%d lines say the demo data was seeded, want 1:\n%s", seeded, log)
	}
}

// demoKey returns the key `serve --demo-key` prints just after the node reports ready.
func (n *process) demoKey(t *testing.T) string {
	t.Helper()
	key := ""
	for deadline := time.Now().Add(10 * time.Second); key == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		sc := bufio.NewScanner(strings.NewReader(n.stdout.String()))
		for sc.Scan() {
			if k, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "export CAREHUB_KEY="); ok {
				key = k
			}
		}
	}
	if !strings.HasPrefix(key, "chk_live_") {
		t.Fatalf("serve --demo-key printed no key:\n%s", n.stdout)
	}
	return key
}

func runCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func graphql(t *testing.T, addr, key, query string) map[string]any {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"query": query})
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/graphql", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("decode graphql response (HTTP %d): %v", resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("graphql HTTP %d: %v", resp.StatusCode, out)
	}
	return out
}

// TestServeRestartKeepsDataAndSurvivesSIGKILL is the newcomer's path: start with demo data, get
// a key, stop, start again (data kept), SIGKILL, start again (no manual cleanup).
func TestServeRestartKeepsDataAndSurvivesSIGKILL(t *testing.T) {
	dir, addr := dataDir(t), testenv.FreeAddr(t)
	n := serve(t, dir, addr, "--demo-key")
	key := n.demoKey(t)
	checkLogLines(t, n.stderr.String())
	if resp, err := http.Get("http://" + n.addr + "/metrics"); err != nil {
		t.Fatal(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := `revision="` + testRevision + `"`; !strings.Contains(string(body), want) {
			t.Errorf("/metrics: carehub_build_info without %s", want)
		}
	}
	countAssets := func() int {
		out := graphql(t, n.addr, key, `{ assets(limit: 100) { id } }`)
		data, _ := out["data"].(map[string]any)
		assets, _ := data["assets"].([]any)
		return len(assets)
	}
	first := countAssets()
	if first < 5 {
		t.Fatalf("demo data: %d assets", first)
	}
	anonymousBrokerRefused(t, n, dir)
	n.stop(t, syscall.SIGTERM)

	// A second start prints the kept key rather than minting another live key with every scope.
	n = serve(t, dir, n.addr, "--demo-key")
	if again := n.demoKey(t); again != key {
		t.Fatalf("serve --demo-key after a restart printed another key: %s, then %s", key, again)
	}
	if fi, err := os.Stat(filepath.Join(dir, "demo.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("demo.key: %v (%v), want mode 0600", fi, err)
	}
	if got := countAssets(); got != first {
		t.Fatalf("after restart: %d assets, want %d", got, first)
	}
	n.stop(t, syscall.SIGKILL)

	n = serve(t, dir, n.addr)
	if got := countAssets(); got != first {
		t.Fatalf("after SIGKILL and restart: %d assets, want %d", got, first)
	}
	// The key created before the crash still works, and a new one can be made with the CLI
	// while the server runs.
	out, stderr, code := runCLI(t, "keys", "create", "--data-dir", dir, "--org", "demo-health", "--mode", "test", "--scopes", "read:patients", "--json")
	if code != 0 {
		t.Fatalf("keys create while serving: exit %d: %s", code, stderr)
	}
	var created struct{ ID, Key, OrgID, Mode string }
	if err := json.Unmarshal([]byte(out), &created); err != nil || !strings.HasPrefix(created.Key, "chk_test_") {
		t.Fatalf("keys create --json: %q (%v)", out, err)
	}
	if got := countAssets(); got != first {
		t.Fatalf("server lost its database after the CLI ran: %d assets", got)
	}
	n.stop(t, syscall.SIGTERM)
}

func TestKeysCLIWithoutServer(t *testing.T) {
	dir := dataDir(t)
	out, stderr, code := runCLI(t, "seed", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("seed: exit %d: %s", code, stderr)
	}
	out, stderr, code = runCLI(t, "keys", "create", "--data-dir", dir, "--platform", "--json")
	if code != 0 {
		t.Fatalf("keys create --platform: exit %d: %s", code, stderr)
	}
	var k struct {
		ID, Key  string
		Platform bool
	}
	if err := json.Unmarshal([]byte(out), &k); err != nil || !k.Platform || !strings.HasPrefix(k.Key, "chk_live_") {
		t.Fatalf("platform key: %q (%v)", out, err)
	}
	out, stderr, code = runCLI(t, "keys", "list", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, k.ID) || strings.Contains(out, k.Key) {
		t.Fatalf("keys list (exit %d) must show the id and never the key:\n%s%s", code, out, stderr)
	}
	out, stderr, code = runCLI(t, "keys", "revoke", "--data-dir", dir, k.ID)
	if code != 0 || !strings.Contains(out, "revoked") {
		t.Fatalf("keys revoke: exit %d: %s%s", code, out, stderr)
	}
	_, stderr, code = runCLI(t, "keys", "create", "--data-dir", dir, "--org", "no-such-org", "--mode", "live")
	if code != 1 || !strings.Contains(stderr, "no-such-org") {
		t.Fatalf("unknown org: exit %d: %s", code, stderr)
	}
}

// TestBadConfiguration: each problem exits non-zero with one clear line naming it, and each cause
// in it once (issue 58: not the usage after a mistyped flag, not the start-up log before an
// unreachable Kafka, not pgx's two identical dial errors).
func TestBadConfiguration(t *testing.T) {
	readonly := filepath.Join(t.TempDir(), "ro")
	os.MkdirAll(readonly, 0o555)
	// Root ignores directory permissions; a path under a regular file cannot be created by anyone.
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown role", []string{"--roles", "api,cooking"}, `unknown role "cooking"`},
		{"malformed address", []string{"--http-addr", "localhost"}, "--http-addr"},
		{"bad port", []string{"--http-addr", "127.0.0.1:99999"}, "--http-addr"},
		{"unwritable data dir", []string{"--data-dir", filepath.Join(file, "data")}, "data dir"},
		{"mistyped flag", []string{"--htp-addr", "x"}, "unknown flag --htp-addr; did you mean --http-addr? (carehub serve -h lists the flags)"},
		{"unreachable kafka", []string{"--kafka-brokers", "127.0.0.1:1"}, "--kafka-brokers: no broker of 127.0.0.1:1 can be reached"},
		{"unreachable database", []string{"--database-url", "postgres://carehub@127.0.0.1:1/carehub?connect_timeout=2"}, "database"},
		{"malformed database url", []string{"--database-url", "postgres://%zz"}, "--database-url"},
		{"bad seed", []string{"--seed", "lots"}, "--seed"},
		{"bad partitions", []string{"--partitions", "0"}, "--partitions"},
		{"replicas on the embedded broker", []string{"--kafka-replication-factor", "3"}, "the embedded broker has no replicas"},
		{"more in sync than replicas", []string{"--kafka-brokers", "127.0.0.1:1", "--kafka-replication-factor", "2", "--kafka-min-insync-replicas", "3"}, "--kafka-min-insync-replicas 3"},
		{"negative GraphQL budget", []string{"--graphql-max-cost", "-1"}, "--graphql-max-cost"},
		{"bad Kafka namespace", []string{"--kafka-namespace", "../prod"}, "--kafka-namespace"},
		{"negative retention", []string{"--clickhouse-audit-retention", "-24h"}, "--clickhouse-audit-retention"},
		{"bad trusted proxy", []string{"--trusted-proxies", "10.0.0.0/8,proxy.local"}, "--trusted-proxies"},
		{"non-loopback without TLS", []string{"--http-addr", "0.0.0.0:8080"}, "not a loopback address"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"serve", "--data-dir", dataDir(t)}, c.args...)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, binary, args...)
			var errb bytes.Buffer
			cmd.Stderr = &errb
			err := cmd.Run()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() == 0 {
				t.Fatalf("want non-zero exit, got %v; stderr:\n%s", err, errb.String())
			}
			lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], c.want) {
				t.Fatalf("want one line containing %q, got:\n%s", c.want, errb.String())
			}
			if n := strings.Count(lines[0], "connection refused"); n > 1 {
				t.Fatalf("the same cause %d times: %s", n, lines[0])
			}
		})
	}
}

// anonymousBrokerRefused checks that the node's embedded broker, on a loopback port any user of
// the host can reach, serves nothing to a client without its credentials (issue 51, finding 5),
// and that its data dir is the owner's alone.
func anonymousBrokerRefused(t *testing.T, n *process, dir string) {
	t.Helper()
	var brokers []string
	sc := bufio.NewScanner(strings.NewReader(n.stderr.String()))
	for sc.Scan() {
		var line struct {
			Msg     string   `json:"msg"`
			Brokers []string `json:"kafka_brokers"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "carehub ready" {
			brokers = line.Brokers
		}
	}
	if len(brokers) == 0 {
		t.Fatalf("no kafka_brokers in the ready line:\n%s", n.stderr)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RequestRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if topics, err := kadm.NewClient(cl).ListTopics(ctx); err == nil && len(topics) > 0 {
		t.Fatalf("an anonymous client listed the embedded broker's topics: %v", topics.Names())
	}
	kafkaDir := filepath.Join(dir, "kafka")
	if fi, err := os.Stat(kafkaDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("%s: %v (%v), want mode 0700", kafkaDir, fi, err)
	}
}
