package pipelinetest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"carehub/e2e/pipelinetest"
	"carehub/e2e/servertest"
	"carehub/storage/kafka/kafkatest"
)

// EnvKafkaScript points the outage test at deploy/local/kafka/kafka.sh when it runs on a real
// broker (as in storage/kafka's restart test).
const EnvKafkaScript = "CAREHUB_TEST_KAFKA_SCRIPT"

// broker is a Kafka-protocol broker the test may stop and start again on the same address.
type broker interface {
	addrs() []string
	stop(t *testing.T)
	start(t *testing.T)
}

// fakeBroker is a one-broker kfake cluster on a fixed port whose state (topics, records,
// committed offsets, producer ids) persists in a directory, so it comes back as the same
// broker: what a restarted Kafka broker is. (A fresh kfake without the directory comes back
// without topics; carehub creates topics only at start, so its producers then retry
// UNKNOWN_TOPIC_OR_PARTITION until the node restarts.)
type fakeBroker struct {
	port int
	dir  string
	mu   sync.Mutex
	c    *kfake.Cluster
}

func newFakeBroker(t *testing.T) *fakeBroker {
	b := &fakeBroker{port: freePort(t), dir: t.TempDir()}
	b.start(t)
	// Registered before the node starts, so it runs after the node has stopped.
	t.Cleanup(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.c != nil {
			b.c.Close()
		}
	})
	return b
}

func (b *fakeBroker) addrs() []string {
	return []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))}
}

func (b *fakeBroker) start(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var err error
	// The port was just released by the stopped broker; binding it again may take a moment.
	for deadline := time.Now().Add(10 * time.Second); ; {
		b.c, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(b.port), kfake.DataDir(b.dir))
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("start kfake on port %d: %v", b.port, err)
	}
}

func (b *fakeBroker) stop(t *testing.T) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.c.Close()
	b.c = nil
}

// scriptBroker is the real broker of CAREHUB_TEST_KAFKA_BROKERS, stopped and started with
// kafka.sh down and up.
type scriptBroker struct {
	script  string
	brokers []string
}

func (b *scriptBroker) addrs() []string { return b.brokers }

func (b *scriptBroker) run(t *testing.T, args ...string) {
	t.Helper()
	_, port, err := net.SplitHostPort(b.brokers[0])
	if err != nil {
		t.Fatalf("broker %q: %v", b.brokers[0], err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.script, args...)
	cmd.Env = append(os.Environ(), "KAFKA_PORT="+port)
	began := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kafka.sh %v: %v\n%s", args, err, out)
	}
	t.Logf("kafka.sh %v took %v", args, time.Since(began).Round(time.Millisecond))
}

func (b *scriptBroker) stop(t *testing.T)  { b.run(t, "down") }
func (b *scriptBroker) start(t *testing.T) { b.run(t, "up") }

func outageBroker(t *testing.T) broker {
	if !kafkatest.Real() {
		return newFakeBroker(t)
	}
	script := os.Getenv(EnvKafkaScript)
	if script == "" {
		t.Skipf("on a real broker (%s) this test must stop and start it: set %s to deploy/local/kafka/kafka.sh (make test-kafka does)",
			kafkatest.EnvBrokers, EnvKafkaScript)
	}
	b := &scriptBroker{script: script, brokers: kafkatest.Brokers(t)}
	// Whatever happens, leave the broker up for the tests after this one.
	t.Cleanup(func() { b.start(t) })
	return b
}

// TestBrokerOutage: with the node's only broker stopped, mutations keep succeeding because
// their events wait in the outbox; /readyz says kafka is unreachable; nothing of the outage
// reaches the log. When the broker is back on the same address, /readyz is ready again and
// every event published during the outage reaches GET /v1/events exactly once.
//
// Two outages. In a short one the relay's produce simply waits for the broker. A long one
// outlasts both the relay's publish timeout and the minute Postgres lets the claiming
// transaction idle (storage/postgres.Connect), so the batch in hand fails one way or the other
// and is produced again: with franz-go's idempotent producer, which will not give up records
// it has not heard back about, the produce outlives the timeout, Postgres ends the transaction,
// and the batch, acknowledged once the broker is back, cannot be marked sent. The relay must
// count that failed batch, and the log must still hold each event once.
func TestBrokerOutage(t *testing.T) {
	cases := []struct {
		name string
		hold time.Duration // the broker stays down at least this long
		long bool
	}{
		{"short", 3 * time.Second, false},
		{"longer than the claiming transaction may idle", 70 * time.Second, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.long && testing.Short() {
				t.Skipf("-short: skipping a %v broker outage", tc.hold)
			}
			brokerOutage(t, tc.hold, tc.long)
		})
	}
}

func brokerOutage(t *testing.T, hold time.Duration, long bool) {
	b := outageBroker(t)
	cfg := servertest.Config(t)
	cfg.KafkaBrokers = b.addrs()
	s := servertest.StartConfig(t, cfg)
	c := client(s)
	project := sepsisProject(t, c)
	typ := uniqueType(t, "outage")

	before := publishOne(t, c, project, typ, payload{Worker: 0, Seq: -1})
	servertest.Eventually(t, 60*time.Second, "the event published before the outage in the log", func() bool {
		return visible(t, c, project, typ, []string{before}) == 1
	})
	// Ready once every consumer group holds its partitions, which on this broker may follow the
	// first event's storing by a moment.
	servertest.Eventually(t, 60*time.Second, "/readyz 200 before the outage", func() bool {
		code, _ := readyz(t, s.URL)
		return code == http.StatusOK
	})

	b.stop(t)
	downAt := time.Now()
	servertest.Eventually(t, 30*time.Second, "/readyz to report kafka unreachable", func() bool {
		code, checks := readyz(t, s.URL)
		return code == http.StatusServiceUnavailable && strings.HasPrefix(checks["kafka"], "down: ")
	})
	t.Logf("/readyz reported kafka unreachable %v after the broker stopped", time.Since(downAt).Round(time.Millisecond))

	// Mutations while the broker is down.
	const during = 50
	var ids []string
	var calls []time.Duration
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range during {
		began := time.Now()
		p, err := c.Publish(ctx, project, typ, payload{Worker: 0, Seq: i})
		if err != nil {
			t.Fatalf("publishEvent %d with the broker down: %v", i, err)
		}
		calls = append(calls, time.Since(began))
		ids = append(ids, p.ID)
	}
	var agents []string
	for i := range 2 {
		var out struct{ CreateAgent struct{ ID string } }
		err := c.GraphQL(ctx, `mutation($name: String!, $p: ID!) { createAgent(name: $name, projectId: $p) { id } }`,
			map[string]any{"name": fmt.Sprintf("outage agent %d %s", i, typ), "p": project}, &out)
		if err != nil || out.CreateAgent.ID == "" {
			t.Fatalf("createAgent with the broker down: %v", err)
		}
		agents = append(agents, out.CreateAgent.ID)
	}
	t.Logf("with the broker down: %d publishEvent calls (%v), %d createAgent calls succeeded",
		during, pipelinetest.Distribute(calls), len(agents))

	// Nothing published during the outage can have reached the log: it went nowhere but the
	// outbox. (Were it visible, the broker would not really be down and the test would prove
	// nothing.) The hold gives a leaking path time to show itself.
	time.Sleep(time.Until(downAt.Add(hold)))
	if n := visible(t, c, project, typ, ids); n != 0 {
		t.Fatalf("%d events published with the broker down are already in the log", n)
	}
	if code, checks := readyz(t, s.URL); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with the broker down: %d %v", code, checks)
	}
	outage := time.Since(downAt)

	b.start(t)
	upAt := time.Now()
	servertest.Eventually(t, 60*time.Second, "/readyz ready once the broker is back", func() bool {
		code, _ := readyz(t, s.URL)
		return code == http.StatusOK
	})
	ready := time.Since(upAt)
	servertest.Eventually(t, 120*time.Second, "every event of the outage in the log", func() bool {
		return visible(t, c, project, typ, ids) == len(ids)
	})
	t.Logf("broker down for %v; after it came back: ready in %v, the outage's %d events in the log in %v",
		outage.Round(time.Millisecond), ready.Round(time.Millisecond), len(ids), time.Since(upAt).Round(time.Millisecond))
	failedBatches := metric(t, s.URL, "carehub_outbox_publish_errors_total")
	t.Logf("relay: %v rows published, %v failed batches; event log writer: %v events written (re-deliveries included)",
		metric(t, s.URL, "carehub_outbox_published_total"), failedBatches, metric(t, s.URL, "carehub_eventlog_events_written_total"))
	if long && failedBatches == 0 {
		t.Errorf("after a %v outage no relay batch failed: the outage did not reach the retry path it is meant to test", outage)
	}

	// Exactly once, as published, and the agents made during the outage exist.
	lc := readLog(t, c, project, typ, 7) // small pages: the cursor is part of what is checked
	if len(lc.duplicates) > 0 || len(lc.byID) != during+1 || lc.total != during+1 {
		t.Errorf("log: %d distinct events, %d duplicates (%v), meta.total %d; want %d, 0, %d",
			len(lc.byID), len(lc.duplicates), lc.duplicates, lc.total, during+1, during+1)
	}
	for i, id := range ids {
		if ev, ok := lc.byID[id]; !ok {
			t.Errorf("event %s (seq %d) not in the log", id, i)
		} else if p := decodePayload(t, ev); p.Seq != i {
			t.Errorf("event %s: payload seq %d, published %d", id, p.Seq, i)
		}
	}
	for _, id := range agents {
		var out struct{ Agent *struct{ ID string } }
		if err := c.GraphQL(ctx, `query($id: ID!) { agent(id: $id) { id } }`, map[string]any{"id": id}, &out); err != nil || out.Agent == nil {
			t.Errorf("agent %s created during the outage: %v", id, err)
		}
	}
}

// readyz returns /readyz's status and checks.
func readyz(t testing.TB, base string) (int, map[string]string) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(base + "/readyz")
	if err != nil {
		t.Fatalf("/readyz: %v", err)
	}
	defer resp.Body.Close()
	var body struct{ Checks map[string]string }
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("/readyz (%d): %v", resp.StatusCode, err)
	}
	return resp.StatusCode, body.Checks
}

// metric returns the value of an unlabelled counter or gauge on /metrics (0 when absent).
func metric(t testing.TB, base, name string) float64 {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("/metrics: %s %q: %v", name, v, err)
			}
			return f
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	return 0
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
