// Package local holds the tests of the local tooling a newcomer and an operator run first: the
// Makefile's run targets and deploy/local's engines (kafka.sh, clickhouse.sh), driven as a person
// would, through make and the scripts.
package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/internal/testenv"
)

// root is the checkout this test runs in.
const root = "../.."

// scripts are the files a checkout needs to run its engines.
var scripts = []string{
	"deploy/local/daemon.sh",
	"deploy/local/kafka/kafka.sh", "deploy/local/kafka/cluster.sh", "deploy/local/kafka/pom.xml",
	"deploy/local/clickhouse/clickhouse.sh", "deploy/local/clickhouse/launcher.c",
	"deploy/local/clickhouse/package.json", "deploy/local/clickhouse/package-lock.json",
}

// newCheckout copies the engines' scripts into a directory of their own, as a second clone of
// the repository would hold them, and returns it.
func newCheckout(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range scripts {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// run runs name with args in dir, with env added to the test's environment, and returns its
// stdout, stderr and exit code.
func run(t *testing.T, dir string, env []string, name string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("%s %v: %v", name, args, err)
		}
		code = exit.ExitCode()
	}
	return stdout.String(), stderr.String(), code
}

// must runs the command and fails the test unless it exits 0; it returns stdout, trimmed.
func must(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	out, errOut, code := run(t, dir, env, name, args...)
	if code != 0 {
		t.Fatalf("%s %v: exit %d\n%s%s", name, args, code, out, errOut)
	}
	return strings.TrimSpace(out)
}

// needClickHouse fetches the ClickHouse engine into the shared cache once (npm, cc), or skips.
func needClickHouse(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("npm"); err != nil {
		testenv.Missing(t, "npm not found: clickhouse.sh fetches the engine with it (install Node.js and npm)")
	}
	if _, errOut, code := run(t, root, nil, "deploy/local/clickhouse/clickhouse.sh", "fetch"); code != 0 {
		testenv.Missing(t, "clickhouse.sh fetch: %s", errOut)
	}
}

// needKafka fetches Apache Kafka's jars into the shared cache once (Maven) and checks Java, or
// skips.
func needKafka(t *testing.T) {
	t.Helper()
	if _, errOut, code := run(t, root, nil, "deploy/local/kafka/kafka.sh", "prepare"); code != 0 {
		testenv.Missing(t, "kafka.sh prepare: %s", errOut)
	}
}

// The local three-broker cluster: replication factor 3 and min.insync.replicas 2 by default, a
// topic still written with acks=all while a broker is killed with -9, and the broker back in
// every ISR once started again.
func TestKafkaCluster(t *testing.T) {
	needKafka(t)
	const cluster = "deploy/local/kafka/cluster.sh"
	env := []string{"KAFKA_CLUSTER_STATE_DIR=" + t.TempDir(), fmt.Sprintf("KAFKA_CLUSTER_PORT=%d", testenv.FreePorts(t, 6))}
	t.Cleanup(func() { run(t, root, env, cluster, "down") })
	must(t, root, env, cluster, "up")

	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(must(t, root, env, cluster, "brokers"), ",")...),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	meta, err := adm.BrokerMetadata(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ids := meta.Brokers.NodeIDs(); len(ids) != 3 {
		t.Fatalf("brokers in metadata: %v, want 3", ids)
	}

	// A topic that names neither setting gets the cluster's, as carehub's do by default.
	const topic = "cluster"
	if _, err := adm.CreateTopic(ctx, 3, -1, nil, topic); err != nil {
		t.Fatal(err)
	}
	configs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := configs.On(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rc.Configs {
		if c.Key == "min.insync.replicas" && c.MaybeValue() != "2" {
			t.Errorf("min.insync.replicas %q, want 2", c.MaybeValue())
		}
	}
	// isr waits until every partition's replicas are the three brokers and its in-sync replicas
	// are want.
	isr := func(want string) {
		t.Helper()
		want = fmt.Sprintf("0:%[1]s/3 1:%[1]s/3 2:%[1]s/3", want)
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			var got []string
			if topics, err := adm.ListTopics(ctx, topic); err == nil {
				for _, p := range topics[topic].Partitions.Sorted() {
					slices.Sort(p.ISR)
					got = append(got, fmt.Sprintf("%d:%v/%d", p.Partition, p.ISR, len(p.Replicas)))
				}
			}
			if strings.Join(got, " ") == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("partition:ISR/replicas %v, want %s", got, want)
			}
		}
	}
	isr("[1 2 3]")
	produce := func() {
		t.Helper()
		for p := range int32(3) {
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Value: []byte("x")}).FirstErr(); err != nil {
				t.Fatalf("produce to partition %d: %v", p, err)
			}
		}
	}

	must(t, root, env, cluster, "kill", "2")
	if out, _, code := run(t, root, env, cluster, "pid", "2"); code != 3 {
		t.Fatalf("pid 2 after kill: exit %d, %s", code, out)
	}
	// Every partition, those node 2 led included, takes writes that two replicas hold.
	produce()
	isr("[1 3]")

	must(t, root, env, cluster, "start", "2")
	isr("[1 2 3]")
	produce()
}

// Two checkouts' engines run side by side: each has its own ports, state dir and database, and
// one checkout's down leaves the other's engine up.
func TestCheckoutsRunTheirOwnEngines(t *testing.T) {
	needClickHouse(t)
	a, b := newCheckout(t), newCheckout(t)
	const ch, kafka = "deploy/local/clickhouse/clickhouse.sh", "deploy/local/kafka/kafka.sh"

	urlA, urlB := must(t, a, nil, ch, "url"), must(t, b, nil, ch, "url")
	if urlA == urlB {
		t.Fatalf("both checkouts' ClickHouse at %s", urlA)
	}
	url := regexp.MustCompile(`^clickhouse://127\.0\.0\.1:(\d+)/(\w+)$`)
	ma, mb := url.FindStringSubmatch(urlA), url.FindStringSubmatch(urlB)
	if ma == nil || mb == nil {
		t.Fatalf("urls %q, %q: want clickhouse://127.0.0.1:PORT/DATABASE", urlA, urlB)
	}
	if ma[1] == mb[1] || ma[2] == mb[2] {
		t.Errorf("checkouts share a port or a database: %s, %s", urlA, urlB)
	}
	if ka, kb := must(t, a, nil, kafka, "brokers"), must(t, b, nil, kafka, "brokers"); ka == kb {
		t.Errorf("both checkouts' Kafka on %s", ka)
	}

	for _, c := range []struct{ dir, port, db string }{{a, ma[1], ma[2]}, {b, mb[1], mb[2]}} {
		t.Cleanup(func() { run(t, c.dir, nil, ch, "down") })
		must(t, c.dir, nil, ch, "up")
		if _, err := os.Stat(filepath.Join(c.dir, ".local", "clickhouse-"+c.port, "clickhouse.pid")); err != nil {
			t.Errorf("pid file not in the checkout's .local: %v", err)
		}
		// The url names a database the engine holds: a node started on it finds it.
		if got := must(t, c.dir, nil, ch, "query", "SELECT name FROM system.databases WHERE name = '"+c.db+"'"); got != c.db {
			t.Errorf("%s: database %s missing (got %q)", c.dir, c.db, got)
		}
	}

	must(t, a, nil, ch, "down")
	if out, _, code := run(t, a, nil, ch, "status"); code != 3 {
		t.Errorf("a's status after its down: exit %d, %s", code, out)
	}
	if out, _, code := run(t, b, nil, ch, "status"); code != 0 {
		t.Errorf("b's engine stopped by a's down: exit %d, %s", code, out)
	}
}

// An engine's port held by another process stops up with one line that names the port and the
// make variable that chooses another.
func TestUpNamesAHeldPort(t *testing.T) {
	needClickHouse(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	dir := newCheckout(t)
	env := []string{fmt.Sprintf("CLICKHOUSE_TCP_PORT=%d", port)}
	t.Cleanup(func() { run(t, dir, env, "deploy/local/clickhouse/clickhouse.sh", "down") })
	_, errOut, code := run(t, dir, env, "deploy/local/clickhouse/clickhouse.sh", "up")
	if code == 0 {
		t.Fatal("up succeeded on a held port")
	}
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	want := fmt.Sprintf("port %d is held by ", port)
	if len(lines) != 1 || !strings.Contains(lines[0], want) ||
		!strings.Contains(lines[0], "make clickhouse-up CLICKHOUSE_TCP_PORT=") {
		t.Errorf("up on a held port said:\n%s\nwant one line with %q and the make command choosing another", errOut, want)
	}
}

// make run takes external engines and keeps its own flags; make run-engines starts this
// checkout's engines and runs on their addresses.
func TestRunOnEngines(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		testenv.Missing(t, "make not found")
	}
	serve := func(out string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "bin/carehub serve ") {
				return l
			}
		}
		t.Fatalf("no serve command in:\n%s", out)
		return ""
	}
	kept := []string{"--webhooks-allow-private", "--demo-key", "--data-dir /tmp/carehub", "--http-addr 127.0.0.1:8080"}

	line := serve(must(t, root, nil, "make", "-n", "run", "KAFKA=k1:9092,k2:9092",
		"CLICKHOUSE=clickhouse://ch:9000/db?dial_timeout=5s&compress=lz4", "DATABASE_URL=postgres://u@pg/carehub"))
	for _, want := range append(kept, "--kafka-brokers 'k1:9092,k2:9092'",
		"--clickhouse-url 'clickhouse://ch:9000/db?dial_timeout=5s&compress=lz4'", "--database-url 'postgres://u@pg/carehub'") {
		if !strings.Contains(line, want) {
			t.Errorf("make run with engines: %s\nlacks %s", line, want)
		}
	}
	line = serve(must(t, root, nil, "make", "-n", "run"))
	for _, flag := range []string{"--kafka-brokers", "--clickhouse-url", "--database-url"} {
		if strings.Contains(line, flag) {
			t.Errorf("make run without engines passes %s: %s", flag, line)
		}
	}

	out := must(t, root, nil, "make", "-n", "run-engines")
	brokers := must(t, root, nil, "deploy/local/kafka/kafka.sh", "brokers")
	url := must(t, root, nil, "deploy/local/clickhouse/clickhouse.sh", "url")
	for _, want := range []string{"deploy/local/kafka/kafka.sh up", "deploy/local/clickhouse/clickhouse.sh up"} {
		if !strings.Contains(out, want) {
			t.Errorf("make run-engines does not run %s:\n%s", want, out)
		}
	}
	line = serve(out)
	for _, want := range append(kept, "--kafka-brokers '"+brokers+"'", "--clickhouse-url '"+url+"'") {
		if !strings.Contains(line, want) {
			t.Errorf("make run-engines: %s\nlacks %s", line, want)
		}
	}
}

// make help lines every target's description up in one column.
func TestHelpAligned(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		testenv.Missing(t, "make not found")
	}
	out, errOut, code := run(t, root, nil, "make", "-s", "help")
	if code != 0 {
		t.Fatalf("make help: exit %d: %s", code, errOut)
	}
	out = strings.TrimRight(regexp.MustCompile("\x1b\\[[0-9;]*m").ReplaceAllString(out, ""), "\n")
	target := regexp.MustCompile(`^  (\S+)( +)\S`)
	col, n := -1, 0
	for _, l := range strings.Split(out, "\n") {
		m := target.FindStringSubmatchIndex(l)
		if m == nil {
			t.Errorf("make help line %q: want two spaces, a target, spaces, its description", l)
			continue
		}
		n++
		if at := m[5]; col < 0 {
			col = at
		} else if at != col {
			t.Errorf("make help: %q starts its description at column %d, the first line at %d", l, at, col)
		}
	}
	if n < 20 {
		t.Errorf("make help listed %d targets:\n%s", n, out)
	}
}

// A node built by make build serves carehub_build_info{revision} with the git commit it was
// built from, even where GOFLAGS turns Go's own VCS stamp off.
func TestBuildStampsRevision(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the binary")
	}
	head, _, code := run(t, root, nil, "git", "rev-parse", "HEAD")
	if code != 0 {
		t.Skip("not a git checkout: nothing to stamp")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "carehub")
	must(t, root, []string{"GOFLAGS=-buildvcs=false"}, "make", "-s", "build", "BIN="+bin)

	addr := testenv.FreeAddr(t)
	node := exec.Command(bin, "serve", "--data-dir", filepath.Join(dir, "data"), "--http-addr", addr, "--seed", "none")
	var logs bytes.Buffer
	node.Stdout, node.Stderr = &logs, &logs
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- node.Wait() }()
	t.Cleanup(func() {
		_ = node.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = node.Process.Kill()
			<-exited
		}
	})

	want := `revision="` + strings.TrimSpace(head) + `"`
	var info string
	testenv.Eventually(t, 2*time.Minute, "carehub_build_info on /metrics", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "carehub_build_info{") {
				info = l
			}
		}
		return info != ""
	})
	if !strings.Contains(info, want) {
		t.Errorf("make build's node serves %s, want %s\n%s", info, want, logs.String())
	}
}
