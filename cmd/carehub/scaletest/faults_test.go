package scaletest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/e2e/servertest"
	"carehub/internal/testenv"
	"carehub/storage/demo"
	"carehub/storage/kafka"
	"carehub/storage/postgres"
)

// EnvFaults turns the fault suite on: `make test-faults` sets it. The suite starts its own
// engines (a three-broker Kafka cluster, a ClickHouse server, a Postgres cluster) from the
// checkout's scripts, because it stops and kills them.
const EnvFaults = "CAREHUB_TEST_FAULTS"

// EnvFaultOutage is how long the ClickHouse outage lasts (a Go duration; default 2m).
const EnvFaultOutage = "CAREHUB_TEST_FAULT_OUTAGE"

func faultsOn() bool { return os.Getenv(EnvFaults) != "" }

// TestFaults runs carehub as api, ingest and processors processes on a three-broker Kafka
// cluster (replication factor 3, min.insync.replicas 2), ClickHouse and Postgres, under steady
// load (publishEvent, arrays of POST /v1/events, observations, a webhook subscription and a
// GraphQL subscriber of the same events), and injects one fault at a time. After each it counts
// what was acknowledged during the fault and checks that all of it is stored once, delivered to
// the webhook and pushed to the subscriber, and reports how long the service took to recover.
// Each fault is a subtest (-run 'TestFaults/clickhouse' runs one).
func TestFaults(t *testing.T) {
	if !faultsOn() {
		t.Skip("the fault suite kills engines: make test-faults (" + EnvFaults + "=1)")
	}
	root := checkoutRoot(t)
	outage := 2 * time.Minute
	if v := os.Getenv(EnvFaultOutage); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s: %v", EnvFaultOutage, err)
		}
		outage = d
	}

	kc := startCluster(t, root)
	ch := startClickHouse(t, root)
	pg := startPostgres(t)
	dsn := pg.dsn(t)

	api, _, v := startRoles(t, dsn, append(clusterFlags(t, dsn, kc.brokers), "--clickhouse-url", ch.url))

	fault := func(name string, inject func(t *testing.T) (healed time.Time)) {
		t.Run(name, func(t *testing.T) {
			began := time.Now()
			healed := inject(t)
			caughtUp := v.caughtUp(t, healed)
			// The load runs on for 20 s after the fault is healed, so recovery shows in the acks.
			time.Sleep(20*time.Second - time.Since(healed))
			v.report(t, name, began, healed, caughtUp)
		})
	}

	fault("broker", func(t *testing.T) time.Time {
		// A broker that is neither the events topic's first leader nor the controller's choice:
		// the one a cluster loses most often, at random.
		n := 2
		kc.kill(t, n)
		time.Sleep(20 * time.Second)
		kc.start(t, n)
		return time.Now()
	})
	fault("leader", func(t *testing.T) time.Time {
		n := kc.leader(t, kafka.DefaultTopics().Events, 0)
		t.Logf("the leader of %s/0 is broker %d", kafka.DefaultTopics().Events, n)
		kc.kill(t, n)
		time.Sleep(20 * time.Second)
		kc.start(t, n)
		return time.Now()
	})
	fault("clickhouse", func(t *testing.T) time.Time {
		ch.stop(t)
		time.Sleep(min(outage/2, 20*time.Second))
		// Meanwhile the event log's reads say what is wrong, not 500.
		status, dep := api.eventsStatus(v.key, v.project)
		if status != http.StatusServiceUnavailable || dep != "clickhouse" {
			t.Errorf("GET /v1/events with ClickHouse down: %d, dependency %q; want 503 naming clickhouse", status, dep)
		}
		time.Sleep(outage - min(outage/2, 20*time.Second))
		ch.start(t)
		return time.Now()
	})
	fault("postgres", func(t *testing.T) time.Time {
		crashed := time.Now()
		pg.crash(t)
		// The cluster's supervisor (postgres.Local, as the embedded default's and as systemd or
		// a Kubernetes liveness probe would elsewhere) starts it again: crash recovery.
		servertest.Eventually(t, 2*time.Minute, "postgres accepting connections again", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			return v.db.QueryRow(ctx, "select 1").Scan(new(int)) == nil
		})
		t.Logf("postgres accepting connections %v after the kill", time.Since(crashed).Round(100*time.Millisecond))
		return time.Now()
	})
}

// clusterFlags are the flags every process of a fault test shares: its stores, the topics'
// layout on the three brokers, and one sealing key, as a deployment shares one (the api seals a
// webhook's secret, the processors open it to sign).
func clusterFlags(t *testing.T, dsn, brokers string) []string {
	t.Helper()
	sealing := filepath.Join(t.TempDir(), "sealing.key")
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	if err := os.WriteFile(sealing, []byte(base64.StdEncoding.EncodeToString(secret)), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"--sealing-key-file", sealing, "--database-url", dsn, "--kafka-brokers", brokers,
		"--partitions", fmt.Sprint(partitions), "--kafka-replication-factor", "3", "--kafka-min-insync-replicas", "2",
		"--webhooks-allow-private", "--log-format", "text", "--log-level", "warn"}
}

// startRoles runs api, ingest and processors as processes with the flags common, and the fault
// load on them (loadOn). Its checks read Postgres through a pool on dsn, which connects again
// after Postgres restarts, and finds a promoted standby as carehub does.
func startRoles(t *testing.T, dsn string, common []string) (api *node, l *load, v *verifier) {
	t.Helper()
	api = start(t, "api", append(slices.Clone(common), "--roles", "api", "--ingest-transactional-id", "faults-api", "--demo-key")...)
	ingest := start(t, "ingest", append(slices.Clone(common), "--roles", "ingest", "--seed", "none")...)
	start(t, "processors", append(slices.Clone(common), "--roles", "processors", "--seed", "none")...)
	db, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	l, v = loadOn(t, api, ingest.addr, db)
	return api, l, v
}

// loadOn starts the fault load with the demo key api printed: publishing through api,
// observations through ingest, a webhook receiver and a GraphQL subscriber of the events on api.
// Once 200 calls were acknowledged it returns the load and a verifier of all it acknowledges.
func loadOn(t *testing.T, api *node, ingest string, db querier) (*load, *verifier) {
	t.Helper()
	ctx := context.Background()
	key := api.demoKey(t)
	var project, devices string
	if err := db.QueryRow(ctx, `select id from projects where org_id = $1 and name = $2`, demo.DemoOrgID, demo.SepsisProjectName).Scan(&project); err != nil {
		t.Fatal(err)
	}
	// Device events land in the organization's oldest project.
	if err := db.QueryRow(ctx, `select id from projects where org_id = $1 order by created_at, id limit 1`, demo.DemoOrgID).Scan(&devices); err != nil {
		t.Fatal(err)
	}
	hooks := newReceiver(t)
	hooks.subscribe(t, api.addr, key, project)
	sub := subscribeEvents(t, api.addr, key, project)

	l := &load{t: t, key: key, api: api.addr, ingest: ingest, project: project, failures: map[string]int{}}
	started := time.Now()
	t.Cleanup(l.run(4, 2))
	l.waitAcked(200, 2*time.Minute)
	return l, &verifier{l: l, api: api, key: key, project: project, devices: devices, db: db, hooks: hooks, sub: sub, checked: started}
}

// verifier checks, after each fault, that every call acknowledged since the last check (the
// first: since the load started) reached every store and every consumer once.
type verifier struct {
	l                     *load
	api                   *node
	key, project, devices string
	db                    querier
	hooks                 *receiver
	sub                   *subscriber
	checked               time.Time // calls acknowledged before this were checked
}

// querier is a pgx connection or pool.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// logged lists the heartbeats of the event log from a minute before from: an event's timestamp
// is taken when it is published, before its call is answered.
func (v *verifier) logged(from time.Time) ([]string, error) {
	return v.api.eventIDs(v.key, v.project, "integration.heartbeat", from.Add(-time.Minute))
}

// caughtUp waits until every event acknowledged before healed is in the event log, and says how
// long after healed that was.
func (v *verifier) caughtUp(t *testing.T, healed time.Time) time.Duration {
	t.Helper()
	want := v.l.ackedIn(true, v.checked, healed)
	servertest.Eventually(t, 3*time.Minute, "the event log caught up with the events acknowledged before the fault was healed", func() bool {
		logged, err := v.logged(v.checked)
		return err == nil && v.l.missing(logged, want) == 0
	})
	return time.Since(healed)
}

func (v *verifier) report(t *testing.T, name string, began, healed time.Time, caughtUp time.Duration) {
	t.Helper()
	ctx := context.Background()
	from, to := v.checked, time.Now()
	events, obs := v.l.ackedIn(true, from, to), v.l.ackedIn(false, from, to)
	v.checked = to

	var logged []string
	servertest.Eventually(t, 3*time.Minute, "every acknowledged event in the event log", func() bool {
		var err error
		logged, err = v.logged(from)
		return err == nil && v.l.missing(logged, events) == 0
	})
	var stored int
	servertest.Eventually(t, 3*time.Minute, "every acknowledged observation stored", func() bool {
		err := v.db.QueryRow(ctx, `select count(*) from observations where id = any($1)`, obs).Scan(&stored)
		return err == nil && stored == len(obs)
	})
	var obsEvents map[string]int
	servertest.Eventually(t, 3*time.Minute, "a device event of every acknowledged observation", func() bool {
		var err error
		if obsEvents, err = v.api.observationEvents(v.key, v.devices, from.Add(-time.Minute)); err != nil {
			return false
		}
		for _, id := range obs {
			if obsEvents[id] == 0 {
				return false
			}
		}
		return true
	})
	servertest.Eventually(t, 3*time.Minute, "every acknowledged event delivered to the webhook", func() bool {
		return v.l.missing(v.hooks.ids(), events) == 0
	})
	dupObs := 0
	for _, id := range obs {
		if obsEvents[id] > 1 {
			dupObs++
		}
	}
	dupEvents := len(duplicates(logged))
	if dupEvents+dupObs > 0 {
		t.Errorf("duplicated: %d events in the log, %d observations with more than one device event", dupEvents, dupObs)
	}
	pushed, gaps := v.sub.seen()
	unannounced := 0
	for _, id := range events {
		if !pushed[id] && !v.l.ackedWithin(id, gaps) {
			unannounced++
		}
	}
	if unannounced > 0 {
		t.Errorf("the subscriber missed %d acknowledged events outside the gaps its socket announced (%d closes)", unannounced, len(gaps))
	}
	retried := v.hooks.retried(events)
	t.Logf("fault %s: acknowledged %d events and %d observations (since the last check); refused so far: %v",
		name, len(events), len(obs), v.l.failureCounts())
	t.Logf("fault %s: stored %d of %d events in the log and %d of %d observations, each with one device event; lost 0; duplicated 0; webhook: all %d delivered (%d more than once, as retries); subscriber: %d socket closes announced, %d events missed outside them",
		name, len(events), len(events), stored, len(obs), len(events), retried, len(gaps), unannounced)
	t.Logf("fault %s: longest pause in acknowledgements %v; event log caught up %v after the fault was healed",
		name, v.l.longestPause(began, to).Round(100*time.Millisecond), caughtUp.Round(100*time.Millisecond))
}

// cluster is a local three-broker Kafka cluster of deploy/local/kafka/cluster.sh, in a state dir
// of the test's own on free ports.
type cluster struct {
	engine
	brokers string
}

// engine is one of deploy/local's engine scripts, run with an environment of the test's own.
type engine struct {
	script string
	env    []string
}

func (e engine) run(args ...string) (string, error) {
	cmd := exec.Command(e.script, args...)
	cmd.Env = e.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// must runs the script and returns its output, or ends the test saying what it printed.
func (e engine) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := e.run(args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(e.script), strings.Join(args, " "), err, out)
	}
	return out
}

// env adds to cluster.sh's environment (KAFKA_CLUSTER_HOST=…).
func startCluster(t *testing.T, root string, env ...string) *cluster {
	t.Helper()
	c := &cluster{engine: engine{script: filepath.Join(root, "deploy/local/kafka/cluster.sh"),
		env: append(append(os.Environ(), "KAFKA_CLUSTER_PORT="+strconv.Itoa(testenv.FreePorts(t, 6)),
			"KAFKA_CLUSTER_STATE_DIR="+filepath.Join(t.TempDir(), "kafka")), env...)}}
	t.Cleanup(func() { _, _ = c.run("down") })
	if out, err := c.run("up"); err != nil {
		// Once in a while on this loaded machine a JVM exits while three start at once, saying
		// nothing; up again starts only the nodes that are not running.
		t.Logf("cluster.sh up: %v\n%s\nup again", err, out)
		c.must(t, "up")
	}
	c.brokers = strings.TrimSpace(c.must(t, "brokers"))
	return c
}

func (c *cluster) kill(t *testing.T, n int) {
	t.Helper()
	c.must(t, "kill", strconv.Itoa(n), "--signal", "KILL")
	t.Logf("broker %d killed (SIGKILL)", n)
}

func (c *cluster) start(t *testing.T, n int) {
	t.Helper()
	c.must(t, "start", strconv.Itoa(n))
	t.Logf("broker %d started again", n)
}

// leader returns the node id (1..3, cluster.sh's node number) leading partition p of topic.
func (c *cluster) leader(t *testing.T, topic string, p int32) int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(c.brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	md, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	part, ok := md[topic].Partitions[p]
	if !ok || part.Leader < 0 {
		t.Fatalf("%s/%d: no leader in %v", topic, p, md[topic])
	}
	return int(part.Leader)
}

// chServer is a ClickHouse server of deploy/local/clickhouse/clickhouse.sh, of the test's own.
type chServer struct {
	engine
	url string
}

func startClickHouse(t *testing.T, root string) *chServer {
	t.Helper()
	port := testenv.FreePorts(t, 2)
	c := &chServer{engine: engine{script: filepath.Join(root, "deploy/local/clickhouse/clickhouse.sh"),
		env: append(os.Environ(), "CLICKHOUSE_TCP_PORT="+strconv.Itoa(port), "CLICKHOUSE_HTTP_PORT="+strconv.Itoa(port+1),
			"CLICKHOUSE_STATE_DIR="+filepath.Join(t.TempDir(), "clickhouse"), "CLICKHOUSE_DATABASE=carehub_faults")}}
	t.Cleanup(func() { _, _ = c.run("down") })
	c.start(t)
	c.url = strings.TrimSpace(c.must(t, "url"))
	return c
}

func (c *chServer) start(t *testing.T) {
	t.Helper()
	c.must(t, "up")
}

func (c *chServer) stop(t *testing.T) {
	t.Helper()
	c.must(t, "down")
	t.Log("clickhouse stopped")
}

// pgServer is a Postgres cluster of the test's own, which it crashes; postgres.Local restarts it.
type pgServer struct {
	dir   string
	local *postgres.Local
}

// postgresDir makes a directory for Postgres clusters under the temp dir, which user postgres
// (who runs them when the test runs as root) can traverse; the caller removes it.
func postgresDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func startPostgres(t *testing.T) *pgServer {
	t.Helper()
	dir := postgresDir(t, "carehub-faults-pg-")
	p := &pgServer{dir: dir}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if p.local != nil {
			_ = p.local.Stop(ctx)
		}
		_ = os.RemoveAll(dir)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	if p.local, err = postgres.StartLocal(ctx, filepath.Join(dir, "cluster"), postgres.LocalConfig{Attached: true}); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *pgServer) dsn(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.local.EnsureDatabase(ctx, "carehub"); err != nil {
		t.Fatal(err)
	}
	return p.local.DSN("carehub")
}

// crash SIGKILLs the postmaster, as the kernel's OOM killer or a power cut to its container
// would: its backends exit, and the next start runs crash recovery.
func (p *pgServer) crash(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.local.DataDir(), "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for syscall.Kill(pid, 0) == nil {
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("postgres killed (SIGKILL to postmaster %d)", pid)
}

// receiver is a webhook receiver on loopback that remembers the event id of every delivery.
type receiver struct {
	srv *httptest.Server

	mu  sync.Mutex
	got []string
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		r.mu.Lock()
		r.got = append(r.got, req.Header.Get("webhook-id"))
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) subscribe(t *testing.T, api, key, project string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"projectId": project, "url": r.srv.URL + "/hook", "events": []string{"integration.heartbeat"}})
	req, _ := http.NewRequest(http.MethodPost, "http://"+api+"/v1/webhooks", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/webhooks: %s %s", resp.Status, body)
	}
}

func (r *receiver) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// retried counts the events of ids delivered more than once.
func (r *receiver) retried(ids []string) int {
	seen := map[string]int{}
	for _, id := range r.ids() {
		seen[id]++
	}
	n := 0
	for _, id := range ids {
		if seen[id] > 1 {
			n++
		}
	}
	return n
}

// subscriber holds a GraphQL eventStream subscription of the project's heartbeats on the api
// process (graphql-transport-ws), and subscribes again whenever the socket closes; each close is
// a gap the server announced.
type subscriber struct {
	mu     sync.Mutex
	pushed map[string]bool
	gaps   [][2]time.Time // from the close to the next subscription's start
}

func subscribeEvents(t *testing.T, api, key, project string) *subscriber {
	t.Helper()
	s := &subscriber{pushed: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	ready := make(chan struct{})
	go func() {
		defer close(done)
		first := true
		for ctx.Err() == nil {
			closed := time.Now()
			err := s.stream(ctx, api, key, project, func() {
				if first {
					close(ready)
					first = false
					return
				}
				s.mu.Lock()
				s.gaps = append(s.gaps, [2]time.Time{closed, time.Now()})
				s.mu.Unlock()
			})
			if ctx.Err() == nil {
				t.Logf("subscription closed (%v); subscribing again", err)
				time.Sleep(time.Second)
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(time.Minute):
		t.Fatal("the subscription did not start")
	}
	return s
}

// stream runs one subscription until its socket closes; started is called once the server has
// registered it (the pong after subscribe, docs: "Ping as a barrier").
func (s *subscriber) stream(ctx context.Context, api, key, project string, started func()) error {
	conn, _, err := websocket.Dial(ctx, "ws://"+api+"/graphql", &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	if err != nil {
		return err
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	send := func(m map[string]any) error {
		b, _ := json.Marshal(m)
		return conn.Write(ctx, websocket.MessageText, b)
	}
	if err := send(map[string]any{"type": "connection_init", "payload": map[string]string{"Authorization": "Bearer " + key}}); err != nil {
		return err
	}
	if err := send(map[string]any{"id": "1", "type": "subscribe", "payload": map[string]any{
		"query":     `subscription($p: ID!) { eventStream(projectId: $p, types: ["integration.heartbeat"]) { id } }`,
		"variables": map[string]any{"p": project}}}); err != nil {
		return err
	}
	if err := send(map[string]any{"type": "ping"}); err != nil {
		return err
	}
	for {
		_, b, err := conn.Read(ctx)
		if err != nil {
			return err
		}
		var m struct {
			Type    string
			Payload struct {
				Data struct{ EventStream struct{ ID string } }
			}
		}
		if err := json.Unmarshal(b, &m); err != nil {
			return err
		}
		switch m.Type {
		case "pong":
			started()
		case "next":
			s.mu.Lock()
			s.pushed[m.Payload.Data.EventStream.ID] = true
			s.mu.Unlock()
		case "error", "complete":
			return fmt.Errorf("subscription ended: %s", b)
		}
	}
}

func (s *subscriber) seen() (map[string]bool, [][2]time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.pushed), slices.Clone(s.gaps)
}

// eventsStatus is GET /v1/events's status and, on an error, the dependency it names.
func (n *node) eventsStatus(key, project string) (int, string) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+n.addr+"/v1/events?projectId="+project+"&limit=1", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	var e struct {
		Error struct{ Details struct{ Dependency string } }
	}
	_ = json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Error.Details.Dependency
}

// checkoutRoot is the repository's root, where the engines' scripts are.
func checkoutRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	if _, err := os.Stat(filepath.Join(root, "deploy/local/kafka/kafka.sh")); err != nil {
		testenv.Missing(t, "deploy/local/kafka/kafka.sh not found under %s", root)
	}
	return root
}
