// Package scaletest proves that carehub scales out by role on the real engines: separate api,
// ingest and processors processes (the built binary) on one Postgres, a real Apache Kafka broker
// and a real ClickHouse server. It runs only with both engines named (CAREHUB_TEST_KAFKA_BROKERS,
// CAREHUB_CLICKHOUSE_URL); `make test-scaleout` starts them, each fresh, and runs it.
package scaletest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/e2e/servertest"
	"carehub/internal/testenv"
	"carehub/processors/audit"
	"carehub/processors/eventlog"
	"carehub/processors/observations"
	"carehub/storage/clickhouse/chtest"
	"carehub/storage/demo"
	"carehub/storage/kafka"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/postgres/pgtest"
)

var binary string

func TestMain(m *testing.M) {
	if (!kafkatest.Real() || !chtest.Real()) && !faultsOn() {
		os.Exit(m.Run()) // the tests skip: nothing to build or start
	}
	var remove func()
	binary, remove = testenv.BuildCarehub()
	code := pgtest.Run(m)
	remove() // after Run, not deferred: os.Exit skips deferred calls
	os.Exit(code)
}

// partitions of the topics the nodes create: more than one, so the processors' groups have
// partitions to hand over.
const partitions = 6

// processorGroups are the consumer groups of the processors role whose work the test counts.
var processorGroups = []string{eventlog.DefaultGroup, audit.DefaultGroup, observations.DefaultGroup}

// TestScaleOutSurvivesKills runs api, ingest and processors as three processes, drives
// publishEvent and arrays of POST /v1/events (api) and observation intake (ingest) from
// concurrent clients, SIGKILLs the processors process mid-load and starts another, then the api
// process (whose arrays are Kafka transactions) and starts another on its address, and counts:
// every acknowledged event and observation is stored once, every array is in the log whole or
// not at all, the processors' replacement owns every partition, and the lag is zero.
func TestScaleOutSurvivesKills(t *testing.T) {
	if !kafkatest.Real() || !chtest.Real() {
		t.Skip("needs a real Kafka broker and ClickHouse server (CAREHUB_TEST_KAFKA_BROKERS, CAREHUB_CLICKHOUSE_URL): make test-scaleout")
	}
	brokers := strings.Join(kafkatest.Brokers(t), ",")
	dsn := pgtest.NewDSN(t)
	common := []string{"--database-url", dsn, "--kafka-brokers", brokers, "--clickhouse-url", chtest.NewURL(t),
		"--partitions", fmt.Sprint(partitions), "--log-format", "text", "--log-level", "warn"}

	// A stable transactional id, as a deployment gives each api instance: the replacement of a
	// killed api fences the transactions it left open at once, instead of after their timeout.
	apiArgs := append(slices.Clone(common), "--roles", "api", "--ingest-transactional-id", "scale-api")
	api := start(t, "api", append(apiArgs, "--demo-key")...)
	key := api.demoKey(t)
	ingest := start(t, "ingest", append(common, "--roles", "ingest", "--seed", "none")...)
	proc := start(t, "processors-1", append(common, "--roles", "processors", "--seed", "none")...)

	ctx := context.Background()
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	var project, devices string
	if err := db.QueryRow(ctx, `select id from projects where org_id = $1 and name = $2`, demo.DemoOrgID, demo.SepsisProjectName).Scan(&project); err != nil {
		t.Fatal(err)
	}
	// Device events land in the organization's oldest project.
	if err := db.QueryRow(ctx, `select id from projects where org_id = $1 order by created_at, id limit 1`, demo.DemoOrgID).Scan(&devices); err != nil {
		t.Fatal(err)
	}

	l := &load{t: t, key: key, api: api.addr, ingest: ingest.addr, project: project, failures: map[string]int{}}
	stop := l.run(4, 2)
	l.waitAcked(200, 120*time.Second)
	beforeKill := l.counts()
	proc.kill(t)
	replaced := time.Now()
	proc = start(t, "processors-2", append(common, "--roles", "processors", "--seed", "none")...)
	l.waitAcked(beforeKill.events+beforeKill.observations+200, 120*time.Second)

	// Then the api process, mid-load, on the same address: arrays in flight die with their
	// transactions open on the broker; the replacement fences them.
	beforeAPIKill := l.counts()
	api.kill(t)
	api = startAt(t, "api-2", api.addr, append(apiArgs, "--seed", "none")...)
	servertest.Eventually(t, 2*time.Minute, "100 events acknowledged by the replacement api", func() bool {
		return l.counts().events >= beforeAPIKill.events+100
	})
	stop()
	acked := l.counts()

	// Every acknowledged event is in the event log once, read back through the API.
	var logged []string
	servertest.Eventually(t, 3*time.Minute, "every acknowledged event in the event log", func() bool {
		var err error
		logged, err = api.eventIDs(key, project, "integration.heartbeat", time.Time{})
		return err == nil && l.missing(logged, l.eventIDs()) == 0
	})
	dupEvents := duplicates(logged)
	if len(dupEvents) > 0 {
		t.Errorf("events served more than once: %v", dupEvents)
	}
	// Every array is in the log whole or not at all, acknowledged or not: a kill of either
	// process never leaves part of one.
	arrays := map[int]int{} // events in the log per array of worker 0
	if err := api.events(key, project, "integration.heartbeat", time.Time{}, func(_ string, payload json.RawMessage) {
		var p struct{ Worker, Seq int }
		if json.Unmarshal(payload, &p) == nil && p.Worker == 0 {
			arrays[p.Seq/arrayLen]++
		}
	}); err != nil {
		t.Fatal(err)
	}
	for i, n := range arrays {
		if n != arrayLen {
			t.Errorf("array %d of worker 0: %d of its %d events in the log", i, n, arrayLen)
		}
	}
	// Every acknowledged observation is stored, and its device event is logged once.
	obsIDs := l.observationIDs()
	var storedObs int
	servertest.Eventually(t, 3*time.Minute, "every acknowledged observation stored", func() bool {
		err := db.QueryRow(ctx, `select count(*) from observations where id = any($1)`, obsIDs).Scan(&storedObs)
		return err == nil && storedObs == len(obsIDs)
	})
	var obsEvents map[string]int
	servertest.Eventually(t, 3*time.Minute, "a device event of every acknowledged observation", func() bool {
		var err error
		if obsEvents, err = api.observationEvents(key, devices, time.Time{}); err != nil {
			return false
		}
		for _, id := range obsIDs {
			if obsEvents[id] == 0 {
				return false
			}
		}
		return true
	})
	dupObs := 0
	for _, id := range obsIDs {
		if obsEvents[id] > 1 {
			dupObs++
			t.Errorf("observation %s: %d device events, want 1", id, obsEvents[id])
		}
	}

	// The replacement owns every partition of the processors' groups, and has caught up: a
	// sentinel record, the last entry of every partition, consumed and committed (lag 0).
	sentinels(t)
	adm := kadm.NewClient(kafkatest.Client(t))
	last := ""
	var lags map[string]int64
	servertest.Eventually(t, 2*time.Minute, "processors' groups rebalanced onto the replacement, caught up", func() bool {
		var why string
		why, lags = settled(adm)
		if why != last {
			t.Logf("groups: %s", why)
			last = why
		}
		return why == ""
	})
	rebalanced := time.Since(replaced)

	// The counts, in one place: what the run proves.
	t.Logf("acknowledged: %d events (%d before the processors' kill, %d before the api's; %d of them in arrays), %d observations (%d before); not acknowledged: %v",
		acked.events, beforeKill.events, beforeAPIKill.events, l.arrayed(), acked.observations, beforeKill.observations, l.failureCounts())
	t.Logf("arrays: %d in the log, each whole (%d acknowledged)", len(arrays), l.arrayed()/arrayLen)
	// Calls in flight when the load stopped may have been stored without their answer being
	// read: served, but not counted as acknowledged.
	t.Logf("stored: all %d acknowledged events served by GET /v1/events (and %d of calls cut off at the stop); all %d acknowledged observations in Postgres, each with its device event (and %d of calls cut off)",
		acked.events, len(logged)-len(dupEvents)-acked.events, storedObs, len(obsEvents)-len(obsIDs))
	t.Logf("lost: 0; duplicated: %d events, %d observations' device events", len(dupEvents), dupObs)
	t.Logf("rebalanced: %s owns all %d partitions of %s and has consumed past the sentinels, %v after it was started; lag %v",
		proc.name, partitions, strings.Join(processorGroups, ", "), rebalanced.Round(time.Second), lags)
}

// sentinels produces one record, outside any transaction, as the last entry of every partition
// of the processors' topics. Their writers skip it as invalid and commit past it.
//
// Without it a caught-up group could not show lag 0: the observation and event topics are written
// in transactions (intake; the observation writer's events), a reader commits the offset after
// its last record, and the commit or abort marker after it, and an aborted transaction's records,
// are log entries no reader is handed (KAFKA-6607), so they would remain as lag. Once a group has
// committed past the sentinel it has read everything before it.
func sentinels(t *testing.T) {
	t.Helper()
	cl := kafkatest.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topics := kafka.DefaultTopics()
	for _, topic := range []string{topics.Events, topics.Observations, topics.Audit} {
		for p := range int32(partitions) {
			r := &kgo.Record{Topic: topic, Partition: p, Value: []byte(`{"scaletest":"sentinel"}`)}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatalf("sentinel to %s/%d: %v", topic, p, err)
			}
		}
	}
}

// settled says what is not yet so of the processors' groups: stable, the replacement's members
// only (the killed process's have left: one, and the observation writer's
// observations.DefaultMembers), every partition assigned to them, lag 0 on every partition; ""
// when all holds. It returns each group's total lag.
func settled(adm *kadm.Client) (string, map[string]int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	described, err := adm.DescribeGroups(ctx, processorGroups...)
	if err != nil {
		return err.Error(), nil
	}
	for _, g := range described.Sorted() {
		members := 1
		if g.Group == observations.DefaultGroup {
			members = observations.DefaultMembers
		}
		if g.Err != nil || g.State != "Stable" || len(g.Members) != members {
			return fmt.Sprintf("group %s: state %s, %d members, want %d (%v)", g.Group, g.State, len(g.Members), members, g.Err), nil
		}
		assigned := 0
		for _, m := range g.Members {
			if a, ok := m.Assigned.AsConsumer(); ok {
				for _, topic := range a.Topics {
					assigned += len(topic.Partitions)
				}
			}
		}
		if assigned != partitions {
			return fmt.Sprintf("group %s: %d partitions assigned, want %d", g.Group, assigned, partitions), nil
		}
	}
	lags, err := adm.Lag(ctx, processorGroups...)
	if err != nil {
		return err.Error(), nil
	}
	totals := map[string]int64{}
	for group, l := range lags {
		if l.Error() != nil {
			return l.Error().Error(), nil
		}
		totals[group] = l.Lag.Total()
		for _, p := range l.Lag.Sorted() {
			if p.Lag != 0 {
				return fmt.Sprintf("group %s: partition %s/%d lag %d", group, p.Topic, p.Partition, p.Lag), totals
			}
		}
	}
	return "", totals
}

func duplicates(ids []string) []string {
	seen := map[string]int{}
	var dup []string
	for _, id := range ids {
		if seen[id]++; seen[id] == 2 {
			dup = append(dup, id)
		}
	}
	return dup
}

// load publishes events through the api process and ingests observations through the ingest
// process, and remembers what was acknowledged.
type load struct {
	t                         *testing.T
	key, api, ingest, project string

	mu       sync.Mutex
	events   []string
	inArrays int // of events, those published in arrays
	obs      []string
	failures map[string]int       // by what was answered
	acks     []time.Time          // when each acknowledged call was answered, in order
	ackedAt  map[string]time.Time // event id → when its call was answered
}

// acked records the ids a call acknowledged.
func (l *load) acked(ids []string, events, arrayed bool) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acks = append(l.acks, now)
	if l.ackedAt == nil {
		l.ackedAt = map[string]time.Time{}
	}
	for _, id := range ids {
		l.ackedAt[id] = now
	}
	if !events {
		l.obs = append(l.obs, ids...)
		return
	}
	l.events = append(l.events, ids...)
	if arrayed {
		l.inArrays += len(ids)
	}
}

// ackedWithin reports whether event id was acknowledged inside one of the windows, widened by
// 5 s on each side (a call is answered after its event is published, and a subscription starts
// receiving a little after it is registered).
func (l *load) ackedWithin(id string, windows [][2]time.Time) bool {
	l.mu.Lock()
	at, ok := l.ackedAt[id]
	l.mu.Unlock()
	for _, w := range windows {
		if ok && at.After(w[0].Add(-5*time.Second)) && at.Before(w[1].Add(5*time.Second)) {
			return true
		}
	}
	return false
}

// longestPause is the longest time between two acknowledgements (or from from to the first)
// in [from, to]: how long the service answered no call.
func (l *load) longestPause(from, to time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	longest, last := time.Duration(0), from
	for _, at := range l.acks {
		if at.Before(from) || at.After(to) {
			continue
		}
		longest, last = max(longest, at.Sub(last)), at
	}
	return max(longest, to.Sub(last))
}

func (l *load) failed(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures[why]++
}

func (l *load) failureCounts() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.failures)
}

func (l *load) arrayed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inArrays
}

type counts struct{ events, observations int }

func (l *load) counts() counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return counts{len(l.events), len(l.obs)}
}

func (l *load) eventIDs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.events...)
}

// ackedIn returns the ids of the events, or of the observations, acknowledged in [from, to).
func (l *load) ackedIn(events bool, from, to time.Time) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	all := l.obs
	if events {
		all = l.events
	}
	var ids []string
	for _, id := range all {
		if at := l.ackedAt[id]; !at.Before(from) && at.Before(to) {
			ids = append(ids, id)
		}
	}
	return ids
}

func (l *load) observationIDs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.obs...)
}

func (l *load) missing(seen, want []string) int {
	have := map[string]bool{}
	for _, id := range seen {
		have[id] = true
	}
	n := 0
	for _, id := range want {
		if !have[id] {
			n++
		}
	}
	return n
}

// The load's pace, under the demo key's rate limits (DECISIONS §3: 50/s, ingest 200/s).
const (
	publishRate = 40
	ingestRate  = 150
)

// run starts publishers and ingesters, which share a pace of publishRate and ingestRate calls a
// second; the returned func stops them and waits.
func (l *load) run(publishers, ingesters int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	pubTick, ingTick := time.NewTicker(time.Second/publishRate), time.NewTicker(time.Second/ingestRate)
	paced := func(tick *time.Ticker) bool {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
			return true
		}
	}
	var wg sync.WaitGroup
	for w := range publishers {
		wg.Go(func() {
			for i := 0; paced(pubTick); i++ {
				publish := l.publish
				if w == 0 {
					publish = l.publishArray
				}
				if ids, ok := publish(ctx, w, i); ok {
					l.acked(ids, true, w == 0)
				}
			}
		})
	}
	for range ingesters {
		wg.Go(func() {
			for paced(ingTick) {
				if ids, ok := l.observe(ctx); ok {
					l.acked(ids, false, false)
				}
			}
		})
	}
	return func() { cancel(); wg.Wait(); pubTick.Stop(); ingTick.Stop() }
}

// waitAcked waits until n calls in all were acknowledged.
func (l *load) waitAcked(n int, timeout time.Duration) {
	servertest.Eventually(l.t, timeout, fmt.Sprintf("%d acknowledged calls", n), func() bool {
		c := l.counts()
		return c.events+c.observations >= n
	})
}

// publish is one publishEvent (GraphQL, through the outbox).
func (l *load) publish(ctx context.Context, worker, i int) ([]string, bool) {
	var out struct {
		Data struct{ PublishEvent struct{ ID string } }
	}
	ok := l.call(ctx, "http://"+l.api+"/graphql", map[string]any{
		"query":     `mutation($p: ID!, $pl: JSON!) { publishEvent(type: "integration.heartbeat", payload: $pl, projectId: $p) { id } }`,
		"variables": map[string]any{"p": l.project, "pl": map[string]any{"worker": worker, "seq": i}},
	}, &out)
	return []string{out.Data.PublishEvent.ID}, ok && out.Data.PublishEvent.ID != ""
}

// arrayLen is the size of publishArray's arrays.
const arrayLen = 5

// publishArray is one POST /v1/events with an array of arrayLen events (straight to Kafka, in a
// transaction the processors' consumers read committed).
func (l *load) publishArray(ctx context.Context, worker, i int) ([]string, bool) {
	drafts := make([]map[string]any, arrayLen)
	for j := range drafts {
		drafts[j] = map[string]any{"projectId": l.project, "type": "integration.heartbeat",
			"payload": map[string]any{"worker": worker, "seq": i*arrayLen + j}}
	}
	var out struct{ Data []struct{ ID string } }
	if !l.call(ctx, "http://"+l.api+"/v1/events", drafts, &out) || len(out.Data) != arrayLen {
		return nil, false
	}
	ids := make([]string, arrayLen)
	for j, ev := range out.Data {
		ids[j] = ev.ID
	}
	return ids, true
}

func (l *load) observe(ctx context.Context) ([]string, bool) {
	var out struct{ IDs []string }
	ok := l.call(ctx, "http://"+l.ingest+"/v1/observations", heartRate(), &out)
	return out.IDs, ok && len(out.IDs) == 1
}

// heartRate is an observation of the demo's stable patient, taken now.
func heartRate() map[string]any {
	return map[string]any{
		"resourceType":      "Observation",
		"status":            "final",
		"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4"}}},
		"subject":           map[string]any{"reference": "Patient/" + demo.StablePatientID},
		"effectiveDateTime": time.Now().UTC().Format(time.RFC3339),
		"valueQuantity":     map[string]any{"value": 72, "unit": "/min"},
	}
}

// call POSTs body and decodes a 2xx answer into out; anything else counts as a failed call
// (not acknowledged, so not counted).
func (l *load) call(ctx context.Context, u string, body, out any) bool {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+l.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			l.failed("no answer")
		}
		return false
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode/100 != 2 {
		l.failed(resp.Status)
		return false
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		l.failed("undecodable " + resp.Status)
		return false
	}
	return true
}

// node is one carehub process.
type node struct {
	name, addr string
	log        string // the file of its stdout and stderr
	cmd        *exec.Cmd
	exited     chan struct{} // closed when the process has exited
}

// output is everything the process wrote so far.
func (n *node) output() string {
	b, _ := os.ReadFile(n.log)
	return string(b)
}

// start runs `carehub serve` with args on a free loopback port and waits until /readyz
// answers 200. The process is stopped with SIGTERM when the test ends.
func start(t *testing.T, name string, args ...string) *node {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return startAt(t, name, addr, args...)
}

// startAt is start on addr.
func startAt(t *testing.T, name, addr string, args ...string) *node {
	t.Helper()
	args = append([]string{"serve", "--http-addr", addr, "--data-dir", filepath.Join(t.TempDir(), "data")}, args...)
	return launch(t, name, addr, exec.Command(binary, args...), nil)
}

// launch runs cmd, a carehub serve (or a command that execs one) answering on addr, and waits
// until /readyz answers 200. When the test ends it is stopped with SIGTERM (SIGKILL after a
// minute), then stopped runs, if given.
func launch(t *testing.T, name, addr string, cmd *exec.Cmd, stopped func()) *node {
	t.Helper()
	n := &node{name: name, addr: addr, log: filepath.Join(t.TempDir(), name+".log"), cmd: cmd, exited: make(chan struct{})}
	out, err := os.Create(n.log)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = out.Close() }() // the child has its own descriptor
	n.cmd.Stdout, n.cmd.Stderr = out, out
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = n.cmd.Wait(); close(n.exited) }()
	t.Cleanup(func() {
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.exited:
		case <-time.After(time.Minute):
			_ = n.cmd.Process.Kill()
			<-n.exited
		}
		if stopped != nil {
			stopped()
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", n.name, n.output())
		}
	})
	servertest.Eventually(t, 2*time.Minute, name+" ready", func() bool {
		select {
		case <-n.exited:
			t.Fatalf("%s exited: %s", name, n.output())
		default:
		}
		return n.readyz() == "200"
	})
	return n
}

// readyz is /readyz's status, and its body when not 200.
func (n *node) readyz() string {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + n.addr + "/readyz")
	if err != nil {
		return err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode == http.StatusOK {
		return "200"
	}
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(b))
}

// kill SIGKILLs the process and waits for it to be gone.
func (n *node) kill(t *testing.T) {
	t.Helper()
	if err := n.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-n.exited
}

// demoKey is the key `serve --demo-key` prints once ready.
func (n *node) demoKey(t *testing.T) string {
	t.Helper()
	var key string
	servertest.Eventually(t, 30*time.Second, "the demo key", func() bool {
		for line := range strings.SplitSeq(n.output(), "\n") {
			if k, ok := strings.CutPrefix(strings.TrimSpace(line), "export CAREHUB_KEY="); ok {
				key = k
			}
		}
		return key != ""
	})
	return key
}

// events pages GET /v1/events of project (of typ, when given; from since, when not zero) and
// calls each for every event.
func (n *node) events(key, project, typ string, since time.Time, each func(id string, payload json.RawMessage)) error {
	cursor := ""
	for {
		q := url.Values{"projectId": {project}, "limit": {"1000"}}
		if typ != "" {
			q.Set("type", typ)
		}
		if !since.IsZero() {
			q.Set("from", since.UTC().Format(time.RFC3339Nano))
		}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		req, _ := http.NewRequest(http.MethodGet, "http://"+n.addr+"/v1/events?"+q.Encode(), nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		var page struct {
			Data []struct {
				ID      string
				Payload json.RawMessage
			}
			Meta struct{ Cursor *string }
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil {
			return fmt.Errorf("GET /v1/events: %s %v", resp.Status, err)
		}
		for _, e := range page.Data {
			each(e.ID, e.Payload)
		}
		if page.Meta.Cursor == nil || *page.Meta.Cursor == "" {
			return nil
		}
		cursor = *page.Meta.Cursor
	}
}

func (n *node) eventIDs(key, project, typ string, since time.Time) ([]string, error) {
	var ids []string
	err := n.events(key, project, typ, since, func(id string, _ json.RawMessage) { ids = append(ids, id) })
	return ids, err
}

// observationEvents counts the device.observation_received events of project (from since, when
// not zero) per observation.
func (n *node) observationEvents(key, project string, since time.Time) (map[string]int, error) {
	out := map[string]int{}
	err := n.events(key, project, "device.observation_received", since, func(_ string, payload json.RawMessage) {
		var p struct{ ObservationID string }
		if json.Unmarshal(payload, &p) == nil && p.ObservationID != "" {
			out[p.ObservationID]++
		}
	})
	return out, err
}
