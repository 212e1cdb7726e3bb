package intake_test

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
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"

	"carehub/ingest/intake"
	"carehub/internal/testenv"
	"carehub/kernel/access"
	"carehub/kernel/events"
	"carehub/kernel/ids"
	obs "carehub/processors/observations"
	"carehub/schemas/kafka/observation"
	"carehub/storage/kafka"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) {
	// The kill -9 test re-executes this binary as the writer process it kills.
	testenv.ChildMain(envWriterChild, runWriterChild)
	pgtest.Main(m)
}

// world is one test's tenants, patients and brokers.
type world struct {
	dsn     string
	pool    *pgxpool.Pool
	brokers []string
	topic   string
	group   string
	events  string // the writer's events topic
	txnID   string // the writer's transactional id, the same for each writer of the world

	orgA, orgB         string
	projectA, projectB string // each organization's oldest project
	synthA, realA      string // patients of orgA
	synthB             string // a patient of orgB
}

// newWorld creates two organizations with projects and patients on a fresh database, and a
// topic and group on the test's broker.
func newWorld(t testing.TB) *world {
	t.Helper()
	w := &world{dsn: pgtest.NewDSN(t), brokers: kafkatest.Brokers(t), topic: kafkatest.Topic(t, "obs"), group: kafkatest.Group(t, "writer"),
		events: kafkatest.Topic(t, "events"), txnID: kafkatest.Name(t, "writer")}
	ctx := context.Background()
	pool, err := postgres.Connect(ctx, w.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w.pool = pool
	w.orgA, w.orgB = ids.New(ids.Organization), ids.New(ids.Organization)
	w.projectA, w.projectB = ids.New(ids.Project), ids.New(ids.Project)
	w.synthA, w.realA, w.synthB = ids.New(ids.Patient), ids.New(ids.Patient), ids.New(ids.Patient)
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`insert into organizations (id, name, slug, type, plan) values ($1, 'A', $1, 'clinic', 'growth'), ($2, 'B', $2, 'clinic', 'growth')`,
			[]any{w.orgA, w.orgB}},
		// The newer project is inserted first: the device-event project is the oldest by created_at.
		{`insert into projects (id, org_id, name, created_at) values
	($4, $1, 'newer', now()), ($2, $1, 'oldest', now() - interval '1 day'), ($3, $5, 'only', now())`,
			[]any{w.orgA, w.projectA, w.projectB, ids.New(ids.Project), w.orgB}},
		{`insert into patients (id, org_id, synthetic, name) values
	($1, $4, true, '[{"family":"Synth"}]'), ($2, $4, false, '[{"family":"Real"}]'), ($3, $5, true, '[{"family":"Other"}]')`,
			[]any{w.synthA, w.realA, w.synthB, w.orgA, w.orgB}},
	} {
		if _, err := w.pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// principal returns a context carrying a caller of org with scopes in mode.
func principal(org, mode string, scopes ...string) context.Context {
	if scopes == nil {
		scopes = []string{access.WriteObservations}
	}
	return access.With(context.Background(), &access.Principal{OrgID: org, KeyID: "key_test", Mode: mode, Scopes: scopes})
}

type intakeOption func(*intake.Config)

// newIntake returns an Intake on w's topic, closed and stopped when the test ends. Backpressure
// is off unless an option sets MaxLag or LatencyBudget.
func newIntake(t testing.TB, w *world, opts ...intakeOption) *intake.Intake {
	t.Helper()
	cfg := intake.Config{Brokers: w.brokers, Pool: w.pool, Topic: w.topic, WriterGroup: w.group, MaxLag: -1, LatencyBudget: -1,
		Registerer: prometheus.NewRegistry(), Logger: testLogger(t), RequestTimeout: 20 * time.Second, Producers: 4}
	for _, o := range opts {
		o(&cfg)
	}
	in, err := intake.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); in.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; in.Close() })
	return in
}

// startWriter runs an observation writer on w's topic and group until the returned stop is
// called or the test ends.
func startWriter(t testing.TB, w *world) (stop func()) {
	t.Helper()
	wr, err := obs.NewWriter(obs.WriterConfig{Brokers: w.brokers, Pool: w.pool, Topic: w.topic, Group: w.group,
		EventsTopic: w.events, TransactionalID: w.txnID, SessionTimeout: 6 * time.Second, Logger: testLogger(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); wr.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Error("writer did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// events returns the committed records of the world's events topic by event id (the record
// header), decoded. An observation whose record is on the topic more than once (a client that
// sent it again) has an event record per copy, all with one id.
func eventsOf(t testing.TB, w *world) map[string][]events.Event {
	t.Helper()
	out := map[string][]events.Event{}
	for _, r := range kafkatest.ReadAll(t, w.events) {
		var ev events.Event
		if err := json.Unmarshal(r.Value, &ev); err != nil {
			t.Fatal(err)
		}
		if len(r.Headers) != 1 || string(r.Headers[0].Value) != ev.ID || string(r.Key) != ev.ProjectID {
			t.Fatalf("event record %s: key %q, headers %v", ev.ID, r.Key, r.Headers)
		}
		out[ev.ID] = append(out[ev.ID], ev)
	}
	return out
}

// waitEvents waits until the events topic holds a committed event for each observation of ids
// and returns the events as events does. Stored is not enough: a poll's events commit after
// its observations are stored, and a transaction aborted by a rebalance commits them later.
func waitEvents(t testing.TB, w *world, ids []string) map[string][]events.Event {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		evs := eventsOf(t, w)
		missing := 0
		for _, id := range ids {
			if len(evs[observation.EventID(id)]) == 0 {
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

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// vital returns a valid vital-sign Observation of patient (heart rate unless changed by edit).
func vital(patient string, edit ...func(map[string]any)) map[string]any {
	o := map[string]any{
		"resourceType": "Observation",
		"status":       "final",
		"category": []any{map[string]any{"coding": []any{map[string]any{
			"system": "http://terminology.hl7.org/CodeSystem/observation-category", "code": "vital-signs"}}}},
		"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4", "display": "Heart rate"}}},
		"subject":           map[string]any{"reference": "Patient/" + patient},
		"effectiveDateTime": time.Now().Add(-time.Minute).UTC().Format(time.RFC3339),
		"valueQuantity":     map[string]any{"value": 72, "unit": "/min", "system": "http://unitsofmeasure.org", "code": "/min"},
		"device":            map[string]any{"display": "wearable"},
	}
	for _, e := range edit {
		e(o)
	}
	return o
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func bundle(t testing.TB, typ string, resources ...map[string]any) []byte {
	entries := make([]any, len(resources))
	for i, r := range resources {
		entries[i] = map[string]any{"resource": r, "request": map[string]any{"method": "POST", "url": "Observation"}}
	}
	return mustJSON(t, map[string]any{"resourceType": "Bundle", "type": typ, "entry": entries})
}

func ndjson(t testing.TB, resources ...map[string]any) []byte {
	var b strings.Builder
	for _, r := range resources {
		b.Write(mustJSON(t, r))
		b.WriteByte('\n')
	}
	return []byte(b.String())
}

func submit(t testing.TB, in *intake.Intake, ctx context.Context, contentType string, body []byte) (intake.Result, error) {
	t.Helper()
	return in.Submit(ctx, intake.Submission{ContentType: contentType, Body: strings.NewReader(string(body))})
}

// waitStored waits until every id is in observations. On a timeout it says which are missing
// and where the writer's group stands on each partition, which tells a writer that never read
// a record from one held back by an open transaction and from one that read it and did not
// store it.
func waitStored(t testing.TB, w *world, want []string) {
	t.Helper()
	want = distinct(want)
	deadline := time.Now().Add(60 * time.Second)
	for {
		var missing []string
		if err := w.pool.QueryRow(context.Background(), `select array(select unnest($1::text[]) except select id from observations)`, want).Scan(&missing); err != nil {
			t.Fatal(err)
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d observations stored after 60 s; missing %v\n%s", len(want)-len(missing), len(want), missing, groupState(t, w))
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// groupState describes the writer group's partitions of the world's topic: the group's
// committed offset, the last stable offset (what read-committed consumers may read) and the
// end, and the member assigned.
func groupState(t testing.TB, w *world) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := kadm.NewClient(kafkatest.Client(t))
	lags, err := kafka.Lag(ctx, adm, w.group, w.topic)
	if err != nil {
		return fmt.Sprintf("group %s: %v", w.group, err)
	}
	stable, err := adm.ListCommittedOffsets(ctx, w.topic)
	if err != nil {
		return fmt.Sprintf("topic %s: last stable offsets: %v", w.topic, err)
	}
	var b strings.Builder
	for _, l := range lags {
		lso, _ := stable.Lookup(l.Topic, l.Partition)
		fmt.Fprintf(&b, "partition %d: committed %d, stable %d, end %d, member %q\n", l.Partition, l.Committed, lso.Offset, l.End, l.MemberID)
	}
	return b.String()
}

func distinct(ss []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	return pgtest.Scalar[int](t, pool, sql, args...)
}

func codesOf(rejected []intake.EntryError) string {
	parts := make([]string, len(rejected))
	for i, r := range rejected {
		parts[i] = fmt.Sprintf("%d:%s", r.Index, r.Code)
	}
	return strings.Join(parts, ",")
}

// kfakeCluster starts a broker of the test's own, with topic, for tests that stop it.
func kfakeCluster(t *testing.T, topic string) (*kfake.Cluster, error) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(kafkatest.Partitions, topic))
	if err != nil {
		return nil, err
	}
	t.Cleanup(c.Close)
	return c, nil
}
