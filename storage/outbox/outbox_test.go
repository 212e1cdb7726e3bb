package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"carehub/internal/testenv"
	"carehub/kernel/events"
	"carehub/kernel/telemetry/telemetrytest"
	"carehub/storage/kafka"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/outbox"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestAppend: messages of several topics in one transaction are stored in order, each with its
// own topic and key; a message without a topic writes nothing.
func TestAppend(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	msgs := []outbox.Message{
		{ID: "run_1:1", Topic: "carehub.workflow-runs.v1", Key: "run_1", Value: []byte(`{"runId":"run_1"}`)},
		{ID: "evt_1", Topic: "carehub.events.v1", Key: "prj_1", Value: []byte(`{"id":"evt_1"}`)},
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Append(ctx, tx, msgs...) }); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `select event_id, topic, key, value::text from outbox order by seq`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.Message, error) {
		var m outbox.Message
		var v string
		err := r.Scan(&m.ID, &m.Topic, &m.Key, &v)
		m.Value = []byte(v)
		return m, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(msgs) {
		t.Fatalf("%d rows, want %d", len(got), len(msgs))
	}
	for i := range msgs {
		if got[i].ID != msgs[i].ID || got[i].Topic != msgs[i].Topic || got[i].Key != msgs[i].Key {
			t.Errorf("row %d = %+v, want %+v", i, got[i], msgs[i])
		}
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.Append(ctx, tx, outbox.Message{ID: "evt_2", Key: "prj_1", Value: []byte(`{}`)})
	})
	if err == nil {
		t.Fatal("a message without a topic was appended")
	}
}

// mutate commits one transaction that appends n events of project to the outbox, as a service
// does with its entity change, and returns them.
func mutate(t *testing.T, pool *pgxpool.Pool, topic, project string, n int) []events.Event {
	t.Helper()
	evs := make([]events.Event, n)
	for i := range evs {
		ev, err := events.New("deployment.status_changed", "org_1", project, events.SourceDeployment, events.SeverityInfo,
			map[string]any{"deploymentId": "dep_1", "n": i})
		if err != nil {
			t.Fatal(err)
		}
		evs[i] = ev
	}
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		return outbox.AppendEvents(context.Background(), tx, topic, evs...)
	})
	if err != nil {
		t.Fatalf("mutation failed: %v", err)
	}
	return evs
}

// start runs relay until the test ends.
func start(t *testing.T, relay *outbox.Relay) (stop func()) {
	t.Helper()
	return testenv.Run(t, relay.Run)
}

// consume reads topic from the start until it has n records, failing after a timeout.
func consume(t *testing.T, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := kafkatest.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records before the timeout", len(out), n)
		}
		fetches.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		out = append(out, fetches.Records()...)
	}
	return out
}

// recordIDs decodes records into event ids, checking each record's key and event-id header.
func recordIDs(t *testing.T, recs []*kgo.Record) []string {
	t.Helper()
	ids := make([]string, len(recs))
	for i, r := range recs {
		ev, err := events.Decode(r.Value)
		if err != nil {
			t.Fatalf("record at %s/%d@%d is no envelope: %v", r.Topic, r.Partition, r.Offset, err)
		}
		var header string
		for _, h := range r.Headers {
			if h.Key == outbox.HeaderEventID {
				header = string(h.Value)
			}
		}
		if header != ev.ID {
			t.Errorf("record of %s has event-id header %q", ev.ID, header)
		}
		if string(r.Key) != ev.ProjectID {
			t.Errorf("record of %s has key %q, want the project id %s", ev.ID, r.Key, ev.ProjectID)
		}
		ids[i] = ev.ID
	}
	return ids
}

func unsent(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "select count(*) from outbox where sent_at is null").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFor polls cond until it holds, failing after a timeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, what, cond)
}

func TestRelayPublishesInOrderAndMarksSent(t *testing.T) {
	pool := pgtest.New(t)
	topic := kafkatest.Topic(t, "events")
	reg := prometheus.NewRegistry()

	// Rows written before the relay starts, a rolled-back mutation, and rows written while it
	// runs, over three projects (three keys, so several partitions).
	var want []events.Event
	for _, p := range []string{"prj_a", "prj_b", "prj_c"} {
		want = append(want, mutate(t, pool, topic, p, 40)...)
	}
	rolledBack, err := events.New("a.b", "org_1", "prj_a", events.SourceSystem, events.SeverityInfo, nil)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.AppendEvents(context.Background(), tx, topic, rolledBack); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}

	relay := outbox.New(pool, kafkatest.Client(t), outbox.Config{BatchSize: 16, Registerer: reg})
	start(t, relay)
	for i := range 10 {
		want = append(want, mutate(t, pool, topic, []string{"prj_a", "prj_b", "prj_c"}[i%3], 5)...)
	}

	recs := consume(t, topic, len(want))
	got := recordIDs(t, recs)
	if len(got) != len(want) {
		t.Fatalf("consumed %d records, want %d", len(got), len(want))
	}
	if slices.Contains(got, rolledBack.ID) {
		t.Error("an event of a rolled-back transaction was published")
	}
	// Per project (= key = partition), records follow the order the events were appended.
	byProject := map[string][]string{}
	for _, r := range recs {
		ev, _ := events.Decode(r.Value)
		byProject[ev.ProjectID] = append(byProject[ev.ProjectID], ev.ID)
	}
	for _, p := range []string{"prj_a", "prj_b", "prj_c"} {
		var order []string
		for _, ev := range want {
			if ev.ProjectID == p {
				order = append(order, ev.ID)
			}
		}
		if !slices.Equal(byProject[p], order) {
			t.Errorf("%s: records in order %v, want %v", p, byProject[p], order)
		}
	}
	// The published value is the envelope as appended.
	first, _ := events.Decode(recs[0].Value)
	for _, ev := range want {
		if ev.ID == first.ID && (!ev.CreatedAt.Equal(first.CreatedAt) || ev.Type != first.Type || ev.OrgID != first.OrgID) {
			t.Errorf("published %+v, appended %+v", first, ev)
		}
	}

	waitFor(t, "every row marked sent", func() bool { return unsent(t, pool) == 0 })
	waitFor(t, "the published counter", func() bool {
		return metric(t, reg, "carehub_outbox_published_total") == float64(len(want))
	})
	waitFor(t, "the backlog gauge to reach 0", func() bool {
		return metric(t, reg, "carehub_outbox_backlog") == 0
	})
	if n := metric(t, reg, "carehub_outbox_publish_latency_seconds"); n != float64(len(want)) {
		t.Errorf("latency histogram has %v samples, want %d", n, len(want))
	}
}

// metric returns the value of the registered counter or gauge name (the sum over its series),
// or, for a histogram, its sample count.
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return telemetrytest.Value(t, reg, name)
}

func TestRelayWakesOnNotify(t *testing.T) {
	pool := pgtest.New(t)
	topic := kafkatest.Topic(t, "events")
	// No polling to speak of: only the notification can wake the relay in time.
	relay := outbox.New(pool, kafkatest.Client(t), outbox.Config{PollInterval: time.Hour})
	start(t, relay)
	// The first drain runs at start; wait until the listener is certainly up by publishing one
	// mutation, then check that later ones arrive without a poll.
	for round := range 3 {
		want := mutate(t, pool, topic, "prj_a", 3)
		recs := consume(t, topic, (round+1)*3)
		if got := recordIDs(t, recs); !slices.Contains(got, want[2].ID) {
			t.Fatalf("round %d: %s not published", round, want[2].ID)
		}
	}
}

func TestRelayPollsWithoutNotify(t *testing.T) {
	pool := pgtest.New(t)
	topic := kafkatest.Topic(t, "events")
	relay := outbox.New(pool, kafkatest.Client(t), outbox.Config{PollInterval: 50 * time.Millisecond})
	start(t, relay)
	// A row inserted without NOTIFY (as by a tool or a lost notification) is found by polling.
	ev, err := events.New("a.b", "org_1", "prj_a", events.SourceSystem, events.SeverityInfo, nil)
	if err != nil {
		t.Fatal(err)
	}
	value, _ := json.Marshal(ev)
	if _, err := pool.Exec(context.Background(), "insert into outbox (event_id, topic, key, value) values ($1, $2, $3, $4)",
		ev.ID, topic, ev.ProjectID, value); err != nil {
		t.Fatal(err)
	}
	if got := recordIDs(t, consume(t, topic, 1)); got[0] != ev.ID {
		t.Fatalf("published %v, want %s", got, ev.ID)
	}
}

// TestTwoRelaysSendEachRowOnce runs two relays (two carehub instances: separate pools and
// producers) on one database while mutations commit, and checks that each event reaches the
// topic exactly once. Duplicates are possible only when a relay dies between the broker's ack
// and its commit, which this test does not do.
func TestTwoRelaysSendEachRowOnce(t *testing.T) {
	dsn := pgtest.NewDSN(t)
	pools := make([]*pgxpool.Pool, 2)
	for i := range pools {
		p, err := postgres.Connect(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		pools[i] = p
	}
	topic := kafkatest.Topic(t, "events")
	for i, p := range pools {
		producer, err := kafka.NewClient(kafka.ClientConfig{Brokers: kafkatest.Brokers(t), ClientID: fmt.Sprintf("relay-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(producer.Close)
		// Small batches and fast polls make the relays contend for rows all the time.
		start(t, outbox.New(p, producer, outbox.Config{BatchSize: 7, PollInterval: 10 * time.Millisecond}))
	}

	var mu sync.Mutex
	var want []string
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for range 25 {
				evs := mutate(t, pools[w%2], topic, fmt.Sprintf("prj_%d", w), 4)
				mu.Lock()
				for _, ev := range evs {
					want = append(want, ev.ID)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	waitFor(t, "every row marked sent", func() bool { return unsent(t, pools[0]) == 0 })
	// Every row is acknowledged now; read everything the topic holds.
	got := recordIDs(t, consume(t, topic, len(want)))
	end := topicEnd(t, topic)
	if end != int64(len(want)) {
		t.Errorf("topic holds %d records for %d events", end, len(want))
	}
	seen := map[string]int{}
	for _, id := range got {
		seen[id]++
	}
	for _, id := range want {
		if seen[id] != 1 {
			t.Errorf("event %s published %d times", id, seen[id])
		}
	}
}

// topicEnd sums the high watermarks of topic's partitions: the number of records it holds.
func topicEnd(t *testing.T, topic string) int64 {
	t.Helper()
	cl := kafkatest.Client(t)
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := range int32(kafkatest.Partitions) {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = p
		rp.Timestamp = -1 // latest
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	shards := cl.RequestSharded(context.Background(), req)
	var total int64
	for _, sh := range shards {
		if sh.Err != nil {
			t.Fatal(sh.Err)
		}
		for _, tr := range sh.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, pr := range tr.Partitions {
				if pr.ErrorCode != 0 {
					t.Fatalf("list offsets %s/%d: error %d", topic, pr.Partition, pr.ErrorCode)
				}
				total += pr.Offset
			}
		}
	}
	return total
}

// TestBrokerDown points a relay at an address where no broker listens: rows stay unsent,
// mutations keep committing, and a relay that can reach the broker then delivers every row.
func TestBrokerDown(t *testing.T) {
	pool := pgtest.New(t)
	topic := kafkatest.Topic(t, "events")
	reg := prometheus.NewRegistry()
	dead, err := kafka.NewClient(kafka.ClientConfig{Brokers: []string{"127.0.0.1:1"}, ClientID: "dead"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dead.Close)
	stop := start(t, outbox.New(pool, dead, outbox.Config{
		PublishTimeout: 200 * time.Millisecond, PollInterval: 20 * time.Millisecond, Registerer: reg,
	}))

	var want []events.Event
	want = append(want, mutate(t, pool, topic, "prj_a", 5)...)
	waitFor(t, "two failed publish attempts", func() bool {
		return metric(t, reg, "carehub_outbox_publish_errors_total") >= 2
	})
	// Mutations keep succeeding while the broker is unreachable.
	want = append(want, mutate(t, pool, topic, "prj_a", 5)...)
	want = append(want, mutate(t, pool, topic, "prj_b", 5)...)
	if n := unsent(t, pool); n != len(want) {
		t.Fatalf("%d rows unsent, want all %d", n, len(want))
	}
	waitFor(t, "the backlog gauge", func() bool {
		return metric(t, reg, "carehub_outbox_backlog") == float64(len(want))
	})
	stop()

	start(t, outbox.New(pool, kafkatest.Client(t), outbox.Config{}))
	got := recordIDs(t, consume(t, topic, len(want)))
	if !slices.Equal(sorted(got), sorted(eventIDs(want))) {
		t.Fatalf("delivered %v, want %v", got, eventIDs(want))
	}
	waitFor(t, "every row marked sent", func() bool { return unsent(t, pool) == 0 })
}

// TestBrokerRecovers makes one relay's broker refuse writes for a while, as a cluster does
// whose in-sync replicas fell below min.insync.replicas (kfake fault injection: every produce is
// answered NOT_ENOUGH_REPLICAS), and checks that the same relay retries with backoff, keeps the
// rows unsent meanwhile, and delivers them once the broker takes writes again.
//
// (A broker that takes a produce request and never answers is different: the idempotent
// producer may not give up on records it has sent, so the batch waits for the broker; see the
// package documentation.)
func TestBrokerRecovers(t *testing.T) {
	if kafkatest.Real() {
		t.Skip("needs kfake's fault injection; the real-broker variant is TestBrokerDown")
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	var down atomic.Bool
	var refused atomic.Int64
	down.Store(true)
	cluster.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if !down.Load() {
			return nil, nil, false
		}
		refused.Add(1)
		req := kreq.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.NotEnoughReplicas.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})

	producer, err := kafka.NewClient(kafka.ClientConfig{Brokers: cluster.ListenAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(producer.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic = "carehub.events.v1"
	if err := kafka.EnsureTopics(ctx, producer, kafka.Layout{Partitions: 3}, topic); err != nil {
		t.Fatal(err)
	}

	pool := pgtest.New(t)
	reg := prometheus.NewRegistry()
	start(t, outbox.New(pool, producer, outbox.Config{
		PublishTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond, Registerer: reg,
	}))
	want := mutate(t, pool, topic, "prj_a", 10)
	waitFor(t, "refused produce requests and failed batches", func() bool {
		return refused.Load() >= 2 && metric(t, reg, "carehub_outbox_publish_errors_total") >= 2
	})
	if n := unsent(t, pool); n != len(want) {
		t.Fatalf("%d rows unsent during the outage, want %d", n, len(want))
	}
	want = append(want, mutate(t, pool, topic, "prj_a", 10)...)

	down.Store(false)
	waitFor(t, "every row marked sent after recovery", func() bool { return unsent(t, pool) == 0 })

	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	seen := map[string]int{}
	for len(seen) < len(want) && ctx.Err() == nil {
		fetches := consumer.PollFetches(ctx)
		for _, id := range recordIDs(t, fetches.Records()) {
			seen[id]++
		}
	}
	for _, ev := range want {
		if seen[ev.ID] == 0 {
			t.Errorf("event %s never delivered", ev.ID)
		}
	}
	// Refused records never reached the log, so nothing was delivered twice.
	for id, n := range seen {
		if n > 1 {
			t.Errorf("event %s delivered %d times", id, n)
		}
	}
}

func TestCleanup(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	evs := mutate(t, pool, "carehub.events.v1", "prj_a", 6)
	// 0, 1: sent long ago; 2: sent recently; 3: created long ago, sent recently; 4, 5: unsent,
	// one of them created long ago. Only 0 and 1 are past the retention.
	set := func(i int, sql string) {
		if _, err := pool.Exec(ctx, "update outbox set "+sql+" where event_id = $1", evs[i].ID); err != nil {
			t.Fatal(err)
		}
	}
	set(0, "created_at = now() - interval '3 hours', sent_at = now() - interval '2 hours'")
	set(1, "created_at = now() - interval '3 hours', sent_at = now() - interval '90 minutes'")
	set(2, "sent_at = now()")
	set(3, "created_at = now() - interval '3 hours', sent_at = now() - interval '10 minutes'")
	set(5, "created_at = now() - interval '5 hours'")

	relay := outbox.New(pool, nil, outbox.Config{Retention: time.Hour})
	n, err := relay.Cleanup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("deleted %d rows, want 2", n)
	}
	var left []string
	rows, _ := pool.Query(ctx, "select event_id from outbox order by seq")
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := eventIDs(evs[2:]); !slices.Equal(left, want) {
		t.Errorf("rows left %v, want %v", left, want)
	}
}

func eventIDs(evs []events.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.ID
	}
	return out
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
