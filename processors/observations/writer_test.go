package observations_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/internal/testenv"
	"carehub/kernel/events"
	"carehub/kernel/ids"
	obs "carehub/processors/observations"
	"carehub/schemas/kafka/observation"
	"carehub/storage/kafka/consume"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type env struct {
	pool               *pgxpool.Pool
	brokers            []string
	topic, events      string
	orgA, orgB         string // orgB has no project
	projectA           string
	patientA, patientB string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	e := &env{pool: pgtest.New(t), brokers: kafkatest.Brokers(t), topic: kafkatest.Topic(t, "obs"),
		events: kafkatest.Topic(t, "events"),
		orgA:   ids.New(ids.Organization), orgB: ids.New(ids.Organization), projectA: ids.New(ids.Project),
		patientA: ids.New(ids.Patient), patientB: ids.New(ids.Patient)}
	ctx := context.Background()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`insert into organizations (id, name, slug, type, plan) values ($1, 'A', $1, 'clinic', 'growth'), ($2, 'B', $2, 'clinic', 'growth')`, []any{e.orgA, e.orgB}},
		{`insert into projects (id, org_id, name) values ($1, $2, 'p')`, []any{e.projectA, e.orgA}},
		{`insert into patients (id, org_id, name) values ($1, $3, '[]'), ($2, $4, '[]')`, []any{e.patientA, e.patientB, e.orgA, e.orgB}},
	} {
		if _, err := e.pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// message returns a valid record value for patient of org.
func message(org, patient string, value float64) observation.Message {
	eff := time.Date(2026, 11, 1, 8, 0, 0, 0, time.UTC)
	raw := fmt.Sprintf(`{"resourceType":"Observation","status":"final","code":{"coding":[{"system":"http://loinc.org","code":"8867-4"}]},`+
		`"subject":{"reference":"Patient/%s"},"effectiveDateTime":"2026-11-01T08:00:00Z","valueQuantity":{"value":%v,"unit":"/min"}}`, patient, value)
	return observation.Message{ID: ids.New(ids.Observation), OrgID: org, PatientID: patient, ReceivedAt: time.Now().UTC(),
		Observation: json.RawMessage(raw), Status: "final", LOINC: "8867-4", Code: "8867-4", Value: value, Unit: "/min",
		EffectiveAt: eff, DeviceType: "wearable"}
}

func produce(t testing.TB, e *env, values ...[]byte) {
	t.Helper()
	produceTo(t, kafkatest.Client(t), e.topic, values)
}

func produceTo(t testing.TB, cl *kgo.Client, topic string, values [][]byte) {
	t.Helper()
	recs := make([]*kgo.Record, len(values))
	for i, v := range values {
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint(i % 7)), Value: v}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func encode(msgs ...observation.Message) [][]byte {
	out := make([][]byte, len(msgs))
	for i := range msgs {
		out[i] = msgs[i].AppendJSON(nil)
	}
	return out
}

type running struct {
	reg  *prometheus.Registry
	stop func()
}

func run(t *testing.T, e *env, group string, edit ...func(*obs.WriterConfig)) *running {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := obs.WriterConfig{Brokers: e.brokers, Pool: e.pool, Topic: e.topic, Group: group, EventsTopic: e.events,
		MaxBatch: 300, SessionTimeout: 6 * time.Second, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError + 4}))}
	for _, f := range edit {
		f(&cfg)
	}
	w, err := obs.NewWriter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return &running{reg: reg, stop: stop}
}

func (r *running) counter(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := true
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || lp.GetName() == labels[i] && lp.GetValue() == labels[i+1]
				}
				match = match && found
			}
			if match {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, what, cond)
}

// events waits until e's events topic holds a committed device.observation_received event of
// each observation of ids (they commit after the observations are stored, later when a
// rebalance aborted a transaction) and returns the events by id; it fails t on an event id
// committed twice.
func eventsOf(t *testing.T, e *env, ids ...string) map[string]events.Event {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		evs := readEvents(t, e)
		missing := 0
		for _, id := range ids {
			if _, ok := evs[observation.EventID(id)]; !ok {
				missing++
			}
		}
		if missing == 0 {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d observations have no committed event", missing, len(ids))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func readEvents(t *testing.T, e *env) map[string]events.Event {
	t.Helper()
	out := map[string]events.Event{}
	for _, r := range kafkatest.ReadAll(t, e.events) {
		var ev events.Event
		if err := json.Unmarshal(r.Value, &ev); err != nil {
			t.Fatal(err)
		}
		if _, dup := out[ev.ID]; dup {
			t.Errorf("event %s committed twice", ev.ID)
		}
		if len(r.Headers) != 1 || string(r.Headers[0].Value) != ev.ID || string(r.Key) != ev.ProjectID || ev.Type != obs.EventType {
			t.Errorf("event record %s: key %q, headers %v", ev.ID, r.Key, r.Headers)
		}
		out[ev.ID] = ev
	}
	return out
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRedeliveryStoresNothingTwice stores a topic, then has a second group read it all again:
// nothing is stored or queued a second time.
func TestRedeliveryStoresNothingTwice(t *testing.T) {
	e := newEnv(t)
	msgs := make([]observation.Message, 1000)
	for i := range msgs {
		msgs[i] = message(e.orgA, e.patientA, float64(50+i%50))
	}
	msgs = append(msgs, msgs[3], msgs[4]) // a duplicate within the stream
	produce(t, e, encode(msgs...)...)
	first := run(t, e, kafkatest.Group(t, "first"))
	waitFor(t, "1000 stored", func() bool { return count(t, e.pool, `select count(*) from observations`) == 1000 })
	waitFor(t, "the first writer's metrics", func() bool {
		return first.counter(t, "carehub_observations_stored_total")+first.counter(t, "carehub_observations_duplicates_total") == 1002
	})
	if s := first.counter(t, "carehub_observations_stored_total"); s != 1000 {
		t.Fatalf("stored_total %v", s)
	}
	first.stop()

	second := run(t, e, kafkatest.Group(t, "second"))
	waitFor(t, "the second group to read everything", func() bool {
		return second.counter(t, "carehub_observations_duplicates_total") == 1002
	})
	if s := second.counter(t, "carehub_observations_stored_total"); s != 0 {
		t.Fatalf("the second pass stored %v", s)
	}
	if n := count(t, e.pool, `select count(*) from observations`); n != 1000 {
		t.Fatalf("%d observations", n)
	}
	// Every record read produces its observation's event, under the observation's event id:
	// the second group's pass produced each again, and the repeated records theirs (consumers
	// deduplicate by event id).
	ids := map[string]int{}
	deadline := time.Now().Add(60 * time.Second)
	for twice := 0; twice < 1000; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 1000 observations have events from both groups", twice)
		}
		clear(ids)
		for _, r := range kafkatest.ReadAll(t, e.events) {
			ids[string(r.Headers[0].Value)]++
		}
		twice = 0
		for i := range 1000 {
			if ids[observation.EventID(msgs[i].ID)] >= 2 {
				twice++
			}
		}
	}
	if len(ids) != 1000 {
		t.Fatalf("%d event ids; want 1000", len(ids))
	}
	for i := range 1000 {
		if n := ids[observation.EventID(msgs[i].ID)]; n < 2 || n > 4 || (n != 2 && i != 3 && i != 4) {
			t.Fatalf("observation %d: %d events", i, n)
		}
	}
}

// TestUnstorableRecordsAreSkipped mixes records that can never be stored (not a message, a
// value Postgres refuses, a patient of another organization) into a stream: the writer stores
// the rest, sets aside the messages it could not store, and does not stall.
func TestUnstorableRecordsAreSkipped(t *testing.T) {
	e := newEnv(t)
	good := []observation.Message{message(e.orgA, e.patientA, 60), message(e.orgA, e.patientA, 61), message(e.orgB, e.patientB, 62)}
	nul := message(e.orgA, e.patientA, 63) // an escape Postgres's json operators cannot read
	nul.Observation = json.RawMessage(strings.Replace(string(nul.Observation), `"status":"final"`, `"status":"final","note":[{"text":"\u0000"}]`, 1))
	latin1 := message(e.orgA, e.patientA, 65) // not UTF-8: Postgres refuses it
	latin1.Observation = json.RawMessage(strings.Replace(string(latin1.Observation), `"status":"final"`, "\"status\":\"final\",\"note\":[{\"text\":\"caf\xe9\"}]", 1))
	cross := message(e.orgA, e.patientB, 64) // patientB is not orgA's
	values := encode(good[0], nul, cross, latin1, good[1])
	values = append(values, []byte(`{"id":"obs_x"}`), []byte("not json"))
	values = append(values, encode(good[2])...)
	produce(t, e, values...)
	dlq := kafkatest.Topic(t, "obs-dlq")
	w := run(t, e, kafkatest.Group(t, "w"), func(c *obs.WriterConfig) { c.DeadLetterTopic = dlq })
	waitFor(t, "the good records", func() bool {
		return count(t, e.pool, `select count(*) from observations where id = any($1)`, []string{good[0].ID, good[1].ID, good[2].ID}) == 3
	})
	waitFor(t, "every record accounted for", func() bool {
		return w.counter(t, "carehub_observations_skipped_total", "reason", "invalid_message") == 3 &&
			w.counter(t, "carehub_observations_skipped_total", "reason", "rejected_by_database") == 1 &&
			w.counter(t, "carehub_observations_skipped_total", "reason", "unknown_patient") == 1
	})
	if n := count(t, e.pool, `select count(*) from observations`); n != 3 {
		t.Fatalf("%d stored", n)
	}
	// The record Postgres refused and the one whose patient is not in its organization (a
	// patient deleted after its observation was accepted) are set aside, in the poll's
	// transaction, for an operator: acknowledged, never dropped.
	dead := kafkatest.ReadAll(t, dlq)
	if len(dead) != 2 {
		t.Fatalf("%d records on the dead-letter topic, want 2", len(dead))
	}
	want := map[string]string{string(values[2]): "the patient is not in the observation's organization", // cross
		string(values[3]): "the store refuses the data (SQLSTATE 22"} // latin1: invalid UTF-8
	for _, r := range dead {
		if d, err := consume.ReadDeadLettered(r); err != nil || d.Consumer != "observations" || d.SourceTopic != e.topic ||
			want[string(r.Value)] == "" || !strings.HasPrefix(d.Error, want[string(r.Value)]) {
			t.Fatalf("dead-lettered %+v, %v", d, err)
		}
	}
	evs := eventsOf(t, e, good[0].ID, good[1].ID, good[2].ID)
	if len(evs) != 3 {
		t.Fatalf("%d events", len(evs))
	}
	// orgB has no project: its event is filed under the empty project rather than dropped.
	if ev, ok := evs[observation.EventID(good[2].ID)]; !ok || ev.ProjectID != "" {
		t.Fatalf("event %+v", ev)
	}
	if ev, ok := evs[observation.EventID(good[0].ID)]; !ok || ev.ProjectID != e.projectA {
		t.Fatalf("event %+v; want project %s", ev, e.projectA)
	}
	var p struct {
		ObservationID string  `json:"observationId"`
		PatientID     string  `json:"patientId"`
		Value         float64 `json:"value"`
	}
	if err := json.Unmarshal(evs[observation.EventID(good[1].ID)].Payload, &p); err != nil || p.ObservationID != good[1].ID || p.PatientID != e.patientA || p.Value != 61 {
		t.Fatalf("payload %+v, %v", p, err)
	}
}

// TestRebalanceLosesAndDuplicatesNothing runs two writers in one group while records arrive,
// stops one half way (its partitions move to the other) and checks every record is stored once
// with one event.
func TestRebalanceLosesAndDuplicatesNothing(t *testing.T) {
	e := newEnv(t)
	group := kafkatest.Group(t, "pair")
	a := run(t, e, group)
	b := run(t, e, group)
	var all []string
	for round := range 10 {
		msgs := make([]observation.Message, 300)
		for i := range msgs {
			p, org := e.patientA, e.orgA
			if i%3 == 0 {
				p, org = e.patientB, e.orgB
			}
			msgs[i] = message(org, p, float64(40+i%60))
			all = append(all, msgs[i].ID)
		}
		produce(t, e, encode(msgs...)...)
		if round == 5 {
			a.stop()
		}
	}
	waitFor(t, "every record stored", func() bool {
		return count(t, e.pool, `select count(*) from observations where id = any($1)`, all) == len(all)
	})
	if n := count(t, e.pool, `select count(*) from observations`); n != len(all) {
		t.Fatalf("%d stored of %d", n, len(all))
	}
	evs := eventsOf(t, e, all...)
	if len(evs) != len(all) {
		t.Fatalf("%d events of %d", len(evs), len(all))
	}
	if s := b.counter(t, "carehub_observations_stored_total") + a.counter(t, "carehub_observations_stored_total"); s != float64(len(all)) {
		t.Fatalf("stored_total %v of %d", s, len(all))
	}
}

func TestDisableEvents(t *testing.T) {
	e := newEnv(t)
	m := message(e.orgA, e.patientA, 70)
	produce(t, e, encode(m)...)
	run(t, e, kafkatest.Group(t, "quiet"), func(c *obs.WriterConfig) { c.DisableEvents = true })
	waitFor(t, "the observation", func() bool { return count(t, e.pool, `select count(*) from observations`) == 1 })
	if evs := kafkatest.ReadAll(t, e.events); len(evs) != 0 {
		t.Fatalf("%d events with events disabled", len(evs))
	}
}

func TestWriterMetricsRegisterOnce(t *testing.T) {
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	cfg := obs.WriterConfig{Brokers: e.brokers, Pool: e.pool, Topic: e.topic, Registerer: reg}
	w, err := obs.NewWriter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := obs.NewWriter(cfg); err == nil {
		t.Fatal("a second writer on one registry was accepted")
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		found = found || mf.GetName() == "carehub_observations_stored_total"
	}
	if !found {
		t.Fatal("carehub_observations_stored_total is not registered")
	}
}

// TestStoreFailureReadsThePollAgain has Postgres refuse the writer's inserts for a while: each
// poll fails, its transaction aborts (no offsets, no events committed) and the poll is read
// again, until Postgres accepts it; then every record is stored once with one event.
func TestStoreFailureReadsThePollAgain(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, sql := range []string{
		`create table refuse_observations (since timestamptz)`,
		`insert into refuse_observations values (now())`,
		`create function refuse_observations() returns trigger language plpgsql as $$
		 begin
		   if exists (select 1 from refuse_observations) then raise exception 'refused by the test'; end if;
		   return null;
		 end $$`,
		`create trigger refuse before insert on observations for each statement execute function refuse_observations()`,
	} {
		if _, err := e.pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	msgs := make([]observation.Message, 500)
	ids := make([]string, len(msgs))
	for i := range msgs {
		msgs[i] = message(e.orgA, e.patientA, float64(40+i%60))
		ids[i] = msgs[i].ID
	}
	produce(t, e, encode(msgs...)...)
	w := run(t, e, kafkatest.Group(t, "refused"))
	waitFor(t, "polls to fail while Postgres refuses them", func() bool {
		return w.counter(t, "carehub_consumer_failures_total", "consumer", "observations") >= 2
	})
	if n := count(t, e.pool, `select count(*) from observations`); n != 0 {
		t.Fatalf("%d stored while refused", n)
	}
	if _, err := e.pool.Exec(ctx, `delete from refuse_observations`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every record stored", func() bool { return count(t, e.pool, `select count(*) from observations`) == len(msgs) })
	if evs := eventsOf(t, e, ids...); len(evs) != len(msgs) {
		t.Fatalf("%d events of %d", len(evs), len(msgs))
	}
	if s := w.counter(t, "carehub_observations_stored_total"); s != float64(len(msgs)) {
		t.Fatalf("stored_total %v", s)
	}
}
