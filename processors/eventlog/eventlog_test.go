package eventlog_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/internal/testenv"
	"carehub/kernel/events"
	"carehub/kernel/telemetry/telemetrytest"
	"carehub/processors/eventlog"
	"carehub/storage"
	"carehub/storage/kafka"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// countingStore wraps the real Postgres event log: it counts how often each event id is
// appended (to see re-processing) and can be told to fail.
type countingStore struct {
	storage.EventLog
	fail    atomic.Bool
	largest atomic.Int64 // most events in one AppendEvents call

	mu       sync.Mutex
	appended map[string]int
}

func newCountingStore(t *testing.T) *countingStore {
	return &countingStore{EventLog: postgres.NewEventLog(pgtest.New(t)), appended: map[string]int{}}
}

var errStoreDown = errors.New("store down")

func (s *countingStore) AppendEvents(ctx context.Context, evs []events.Event) error {
	if s.fail.Load() {
		return errStoreDown
	}
	if err := s.EventLog.AppendEvents(ctx, evs); err != nil {
		return err
	}
	s.count(evs)
	return nil
}

func (s *countingStore) count(evs []events.Event) {
	for n := int64(len(evs)); ; {
		m := s.largest.Load()
		if n <= m || s.largest.CompareAndSwap(m, n) {
			break
		}
	}
	s.mu.Lock()
	for _, ev := range evs {
		s.appended[ev.ID]++
	}
	s.mu.Unlock()
}

// deferredStore is a countingStore that appends as the writer does on Postgres
// (storage.DeferredEventLog: visible at once, durable later). While hold is set its Durable
// reports nothing durable, to keep the writer's commits back; restarted makes them
// report a new epoch, as after a crash of the server.
type deferredStore struct {
	*countingStore
	pg        *postgres.EventLog
	pool      *pgxpool.Pool
	hold      atomic.Bool
	restarted atomic.Bool
}

func newDeferredStore(t *testing.T) *deferredStore {
	pool := pgtest.New(t)
	pg := postgres.NewEventLog(pool)
	pg.DeferFrom = 1 // the tests' batches are small
	return &deferredStore{countingStore: &countingStore{EventLog: pg, appended: map[string]int{}}, pg: pg, pool: pool}
}

// twin is another store on the same log, counted apart.
func (s *deferredStore) twin() *deferredStore {
	return &deferredStore{countingStore: &countingStore{EventLog: s.pg, appended: map[string]int{}}, pg: s.pg, pool: s.pool}
}

func (s *deferredStore) AppendEventsDeferred(ctx context.Context, evs []events.Event) (storage.DurableMark, error) {
	if s.fail.Load() {
		return storage.DurableMark{}, errStoreDown
	}
	mark, err := s.pg.AppendEventsDeferred(ctx, evs)
	if err != nil {
		return storage.DurableMark{}, err
	}
	s.count(evs)
	return mark, nil
}

func (s *deferredStore) Durable(ctx context.Context) (storage.DurableMark, error) {
	return s.report(s.pg.Durable(ctx))
}

func (s *deferredStore) report(now storage.DurableMark, err error) (storage.DurableMark, error) {
	if s.hold.Load() {
		now.Pos = 0
	}
	if s.restarted.Load() {
		now.Epoch++
	}
	return now, err
}

// counted is what the writer tests need of a store: the event log, counting appends, able to
// fail.
type counted interface {
	storage.EventLog
	timesAppended() map[string]int
	largestAppend() int64
	setFailing(bool)
}

func (s *countingStore) largestAppend() int64 { return s.largest.Load() }
func (s *countingStore) setFailing(f bool)    { s.fail.Store(f) }

// eachStore runs test with a store whose appends are durable when they return (ClickHouse's
// kind: the writer commits each batch at once) and with a deferred one (Postgres's: commits
// wait for the store's durable mark). twin returns another store on the first's log.
func eachStore(t *testing.T, test func(t *testing.T, store counted, twin func() counted)) {
	t.Run("immediate", func(t *testing.T) {
		s := newCountingStore(t)
		test(t, s, func() counted { return &countingStore{EventLog: s.EventLog, appended: map[string]int{}} })
	})
	t.Run("deferred", func(t *testing.T) {
		s := newDeferredStore(t)
		test(t, s, func() counted { return s.twin() })
	})
}

func (s *countingStore) timesAppended() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.appended)
}

func newEvents(t *testing.T, n, projects int) []events.Event {
	t.Helper()
	evs := make([]events.Event, n)
	for i := range evs {
		ev, err := events.New("agent.run_completed", "org_1", fmt.Sprintf("prj_%d", i%projects), events.SourceAgent,
			events.SeverityInfo, map[string]any{"sessionId": fmt.Sprintf("ses_%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		evs[i] = ev
	}
	return evs
}

func produce(t *testing.T, cl *kgo.Client, topic string, evs ...events.Event) {
	t.Helper()
	recs := make([]*kgo.Record, len(evs))
	for i, ev := range evs {
		value, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(ev.ProjectID), Value: value}
	}
	produceRecords(t, cl, recs...)
}

func produceRecords(t *testing.T, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

type env struct {
	brokers []string
	topic   string
	group   string
	cl      *kgo.Client
	adm     *kadm.Client
}

func newEnv(t *testing.T) env {
	cl := kafkatest.Client(t)
	return env{
		brokers: kafkatest.Brokers(t),
		topic:   kafkatest.Topic(t, "events"),
		group:   kafkatest.Group(t, "eventlog"),
		cl:      cl,
		adm:     kadm.NewClient(cl),
	}
}

// start runs a writer until stop or the end of the test.
func start(t *testing.T, e env, store storage.EventLog, mod func(*eventlog.Config)) (stop func()) {
	t.Helper()
	cfg := eventlog.Config{
		Brokers:     e.brokers,
		Group:       e.group,
		Topic:       e.topic,
		Store:       store,
		BatchSize:   50,
		ChunkSize:   20,
		Concurrency: 2,
	}
	if mod != nil {
		mod(&cfg)
	}
	w, err := eventlog.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return testenv.Run(t, w.Run)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 90*time.Second, what, cond)
}

// caughtUp reports whether the group has committed the end of every partition of the topic.
func caughtUp(t *testing.T, e env) bool {
	t.Helper()
	lags, err := kafka.Lag(context.Background(), e.adm, e.group, e.topic)
	if err != nil {
		t.Logf("lag: %v", err)
		return false
	}
	if len(lags) == 0 {
		return false
	}
	for _, l := range lags {
		if l.End > l.Start && l.Committed < l.End {
			return false
		}
	}
	return true
}

// committed returns the group's committed offsets on the topic (partition → offset).
func committed(t *testing.T, e env) map[int32]int64 {
	t.Helper()
	resp, err := e.adm.FetchOffsetsForTopics(context.Background(), e.group, e.topic)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32]int64{}
	resp.Each(func(o kadm.OffsetResponse) {
		if o.Err == nil && o.At >= 0 {
			out[o.Partition] = o.At
		}
	})
	return out
}

// stored returns the ids the event log holds for the given projects.
func stored(t *testing.T, log storage.EventLog, projects int) []string {
	t.Helper()
	var ids []string
	for p := range projects {
		q := storage.EventQuery{OrgID: "org_1", ProjectID: fmt.Sprintf("prj_%d", p), Limit: 1000}
		for {
			page, err := log.QueryEvents(context.Background(), q)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range page.Events {
				ids = append(ids, ev.ID)
			}
			if page.NextCursor == "" {
				break
			}
			q.Cursor = page.NextCursor
		}
	}
	slices.Sort(ids)
	return ids
}

func ids(evs []events.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.ID
	}
	slices.Sort(out)
	return out
}

func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return telemetrytest.Value(t, reg, name)
}

// TestWriterStoresEachEventOnce covers duplicates on the topic (an event the relay published
// twice), malformed records, and a full re-delivery (the group's offsets reset to the start).
func TestWriterStoresEachEventOnce(t *testing.T) {
	eachStore(t, testStoresEachEventOnce)
}

func testStoresEachEventOnce(t *testing.T, store counted, _ func() counted) {
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	evs := newEvents(t, 300, 5)
	produce(t, e.cl, e.topic, evs[:150]...)
	produce(t, e.cl, e.topic, evs[100:120]...) // re-published by a relay that crashed before marking them sent
	produceRecords(t, e.cl,
		&kgo.Record{Topic: e.topic, Key: []byte("prj_0"), Value: []byte("not json")},
		&kgo.Record{Topic: e.topic, Key: []byte("prj_1"), Value: []byte(`{"id": "evt_x", "type": "nope"}`)},
		&kgo.Record{Topic: e.topic, Key: []byte("prj_2")},
	)
	produce(t, e.cl, e.topic, evs[150:]...)

	stop := start(t, e, store, func(c *eventlog.Config) { c.Registerer = reg; c.LagInterval = 50 * time.Millisecond })
	waitFor(t, "the writer to commit every record", func() bool { return caughtUp(t, e) })
	if got := stored(t, store, 5); !slices.Equal(got, ids(evs)) {
		t.Fatalf("the log holds %d events, want the %d produced", len(got), len(evs))
	}
	// 300 events were waiting when the writer started: polls of up to 50, stored 20 at a time.
	if n := store.largestAppend(); n == 0 || n > 20 {
		t.Errorf("largest append: %d events, want 1..20 (the chunk size)", n)
	}
	if n := metric(t, reg, "carehub_eventlog_malformed_records_total"); n != 3 {
		t.Errorf("malformed records counted: %v, want 3", n)
	}
	if n := metric(t, reg, "carehub_eventlog_events_written_total"); n != 320 {
		t.Errorf("events written: %v, want 320 (300 events, 20 re-published)", n)
	}
	if n := metric(t, reg, "carehub_eventlog_latency_seconds"); n != 320 {
		t.Errorf("latency samples: %v, want 320", n)
	}
	waitFor(t, "the lag gauge to show the group caught up", func() bool {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "carehub_kafka_consumer_lag" {
				return len(mf.GetMetric()) == kafkatest.Partitions && metric(t, reg, "carehub_kafka_consumer_lag") == 0
			}
		}
		return false
	})
	stop()

	// Re-delivery of everything: rewind the group to the start and run a new writer.
	starts, err := e.adm.ListStartOffsets(context.Background(), e.topic)
	if err != nil {
		t.Fatal(err)
	}
	rewind := kadm.Offsets{}
	starts.Each(func(o kadm.ListedOffset) { rewind.AddOffset(o.Topic, o.Partition, o.Offset, -1) })
	if _, err := e.adm.CommitOffsets(context.Background(), e.group, rewind); err != nil {
		t.Fatal(err)
	}
	if len(committed(t, e)) == 0 || caughtUp(t, e) {
		t.Fatal("rewinding the group did not take")
	}
	start(t, e, store, nil)
	waitFor(t, "the second writer to commit every record", func() bool { return caughtUp(t, e) })
	if got := stored(t, store, 5); !slices.Equal(got, ids(evs)) {
		t.Fatalf("after re-delivery the log holds %d events, want %d", len(got), len(evs))
	}
	appended := store.timesAppended()
	if appended[evs[0].ID] < 2 {
		t.Errorf("event %s appended %d times: the re-delivery did not happen", evs[0].ID, appended[evs[0].ID])
	}
}

// TestWriterDoesNotCommitWhenStoreFails: while the store fails nothing is committed and the
// writer keeps retrying; once it recovers every event is stored and committed.
func TestWriterDoesNotCommitWhenStoreFails(t *testing.T) {
	eachStore(t, testDoesNotCommitWhenStoreFails)
}

func testDoesNotCommitWhenStoreFails(t *testing.T, store counted, _ func() counted) {
	e := newEnv(t)
	store.setFailing(true)
	reg := prometheus.NewRegistry()
	evs := newEvents(t, 120, 3)
	produce(t, e.cl, e.topic, evs...)

	start(t, e, store, func(c *eventlog.Config) { c.Registerer = reg; c.LagInterval = -1 })
	// A batch is stored in several chunks; each failed batch is one store error.
	waitFor(t, "three failed store attempts", func() bool { return metric(t, reg, "carehub_eventlog_store_errors_total") >= 3 })
	if c := committed(t, e); len(c) != 0 {
		t.Fatalf("offsets committed while the store fails: %v", c)
	}
	if got := stored(t, store, 3); len(got) != 0 {
		t.Fatalf("%d events stored by a failing store", len(got))
	}

	store.setFailing(false)
	waitFor(t, "the writer to commit every record after recovery", func() bool { return caughtUp(t, e) })
	if got := stored(t, store, 3); !slices.Equal(got, ids(evs)) {
		t.Fatalf("the log holds %d events, want %d", len(got), len(evs))
	}
}

// TestWriterRebalance runs two writers in one group while events keep arriving: the second
// joins (half the partitions move to it) and later the first leaves (they all move to the
// second). Every event is stored once. Because a writer stores and commits its batch before
// giving up a partition, an event is processed twice only when that commit failed (a broker
// may refuse commits while the group rebalances, more often on a loaded machine): the store
// is idempotent and the writer counts the failure, so a second append without a counted
// failed commit is a defect.
func TestWriterRebalance(t *testing.T) {
	eachStore(t, testRebalance)
}

func testRebalance(t *testing.T, storeA counted, twin func() counted) {
	e := newEnv(t)
	storeB := twin() // the same log, counted apart
	const projects = 12

	var mu sync.Mutex
	var produced []events.Event
	stopProducing := make(chan struct{})
	producing := make(chan struct{})
	go func() {
		defer close(producing)
		for {
			select {
			case <-stopProducing:
				return
			case <-time.After(10 * time.Millisecond):
			}
			evs := newEvents(t, 12, projects)
			produce(t, e.cl, e.topic, evs...)
			mu.Lock()
			produced = append(produced, evs...)
			mu.Unlock()
		}
	}()
	// Fast heartbeats: members learn of a rebalance within half a second instead of three.
	regs := map[string]*prometheus.Registry{"writer-a": prometheus.NewRegistry(), "writer-b": prometheus.NewRegistry()}
	fast := func(id string) func(*eventlog.Config) {
		return func(c *eventlog.Config) {
			c.ClientID = id
			c.Registerer = regs[id]
			c.ClientOpts = []kgo.Opt{kgo.HeartbeatInterval(300 * time.Millisecond)}
		}
	}

	stopA := start(t, e, storeA, fast("writer-a"))
	waitFor(t, "writer A to store events", func() bool { return len(storeA.timesAppended()) >= 100 })
	start(t, e, storeB, fast("writer-b"))
	waitFor(t, "writer B to get partitions and store events", func() bool { return len(storeB.timesAppended()) >= 50 })
	aBefore := len(storeA.timesAppended())
	waitFor(t, "writer A to keep its other partitions", func() bool { return len(storeA.timesAppended()) >= aBefore+50 })
	stopA()
	bBefore := len(storeB.timesAppended())
	waitFor(t, "writer B to take over every partition", func() bool { return len(storeB.timesAppended()) >= bBefore+200 })
	close(stopProducing)
	<-producing
	waitFor(t, "the group to commit every record", func() bool { return caughtUp(t, e) })

	if got := stored(t, storeA, projects); !slices.Equal(got, ids(produced)) {
		t.Fatalf("the log holds %d events, want the %d produced", len(got), len(produced))
	}
	a, b := storeA.timesAppended(), storeB.timesAppended()
	failedCommits := metric(t, regs["writer-a"], "carehub_eventlog_commit_errors_total") + metric(t, regs["writer-b"], "carehub_eventlog_commit_errors_total")
	twice := 0
	for _, id := range ids(produced) {
		switch n := a[id] + b[id]; {
		case n == 0:
			t.Errorf("event %s never appended", id)
		case n > 1:
			twice++
			if failedCommits == 0 {
				t.Errorf("event %s appended %d times across the rebalances (A %d, B %d) with no failed commit", id, n, a[id], b[id])
			}
		}
	}
	t.Logf("%d events: writer A stored %d, writer B %d; %d appended again after %v failed commits",
		len(produced), len(a), len(b), twice, failedCommits)
}

// storedButHeld runs a writer on a deferred store whose Durable reports nothing durable, until
// it has stored n events of the given number of projects, and returns them.
func storedButHeld(t *testing.T, n, projects int) (env, *deferredStore, []events.Event) {
	e := newEnv(t)
	store := newDeferredStore(t)
	// A log's first deferred append waits for its commit (the zero mark, durable at once);
	// after it, every append is deferred.
	if _, err := store.AppendEventsDeferred(context.Background(), newEvents(t, 1, 1)); err != nil {
		t.Fatal(err)
	}
	evs := newEvents(t, n, projects)
	produce(t, e.cl, e.topic, evs...)
	store.hold.Store(true)
	start(t, e, store, nil)
	waitFor(t, "the writer to store every event", func() bool { return len(store.timesAppended()) >= len(evs)+1 })
	return e, store, evs
}

// TestWriterCommitsOnlyWhenDurable: with a deferred store, events are visible as soon as they
// are stored, but their offsets are committed only once the store reports them durable.
func TestWriterCommitsOnlyWhenDurable(t *testing.T) {
	e, store, _ := storedButHeld(t, 200, 4)
	if c := committed(t, e); len(c) != 0 {
		t.Fatalf("offsets committed before the store reported the events durable: %v", c)
	}
	store.hold.Store(false)
	waitFor(t, "the writer to commit every record once durable", func() bool { return caughtUp(t, e) })
}

// TestWriterStoresAgainAfterRestart: batches stored but not yet durable when the store
// restarts (a crash of Postgres loses commits not yet flushed) are appended again before their
// offsets are committed.
func TestWriterStoresAgainAfterRestart(t *testing.T) {
	const projects = 3
	e, store, evs := storedButHeld(t, 150, projects)
	// The crash: what was not flushed is gone, and the server has a new epoch.
	if _, err := store.pool.Exec(context.Background(), `delete from event_log`); err != nil {
		t.Fatal(err)
	}
	store.restarted.Store(true)
	store.hold.Store(false)
	waitFor(t, "the writer to commit every record", func() bool { return caughtUp(t, e) })
	if got := stored(t, store, projects); !slices.Equal(got, ids(evs)) {
		t.Fatalf("after the restart the log holds %d events, want the %d produced", len(got), len(evs))
	}
	for _, ev := range evs {
		if n := store.timesAppended()[ev.ID]; n != 2 {
			t.Fatalf("event %s appended %d times, want 2 (deferred, then again after the restart)", ev.ID, n)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	store := postgres.NewEventLog(nil)
	for name, cfg := range map[string]eventlog.Config{
		"no brokers":     {Store: store},
		"no store":       {Brokers: []string{"localhost:9092"}},
		"negative batch": {Brokers: []string{"localhost:9092"}, Store: store, BatchSize: -1},
	} {
		if _, err := eventlog.New(cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
}

// batchedStore is a countingStore that asks for batches of its own size
// (storage.BatchedEventLog, as ClickHouse's store does).
type batchedStore struct {
	*countingStore
	batch int
}

func (s batchedStore) AppendBatch() int { return s.batch }

// TestWriterTakesTheStoresBatch: without a BatchSize of its own the writer polls and appends as
// many events at once as the store asks for, and a BatchSize set still wins.
func TestWriterTakesTheStoresBatch(t *testing.T) {
	for _, c := range []struct {
		name            string
		batch, explicit int
		want            int64
	}{{"the store's", 120, 0, 120}, {"an explicit one", 120, 40, 40}} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			store := batchedStore{newCountingStore(t), c.batch}
			evs := newEvents(t, 1000, 4)
			produce(t, e.cl, e.topic, evs...)
			start(t, e, store, func(cfg *eventlog.Config) { cfg.BatchSize, cfg.ChunkSize, cfg.Concurrency = c.explicit, 0, 1 })
			waitFor(t, "the writer to commit every record", func() bool { return caughtUp(t, e) })
			if n := store.largestAppend(); n == 0 || n > c.want {
				t.Errorf("largest append: %d events, want 1..%d", n, c.want)
			}
			if got := stored(t, store, 4); !slices.Equal(got, ids(evs)) {
				t.Fatalf("the log holds %d events, want %d", len(got), len(evs))
			}
		})
	}
}
