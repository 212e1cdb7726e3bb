package webhooks

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/internal/testenv"
	"carehub/kernel/access"
	"carehub/kernel/events"
	"carehub/kernel/ids"
	"carehub/kernel/sealing"
	"carehub/kernel/whsig"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) {
	// The crash test re-executes this binary as a dispatcher it kills with SIGKILL; that child
	// uses the parent's database and broker, so it must not start servers of its own.
	testenv.ChildMain(crashChildEnv, crashChild)
	pgtest.Main(m)
}

// fastSchedule retries quickly so tests run in milliseconds; its length is the real one.
var fastSchedule = []time.Duration{0, 20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond,
	20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond}

// oneShotSchedule makes every delivery wait an hour after its first failure, so each is
// attempted exactly once while a test runs.
var oneShotSchedule = []time.Duration{0, time.Hour, time.Hour, time.Hour, time.Hour, time.Hour, time.Hour, time.Hour}

// testKey is the server sealing key of every service and dispatcher of these tests, the crash
// test's child process included: fixed, so that the child needs not be told it.
var testKey = func() *sealing.Key {
	k, err := sealing.New(bytes.Repeat([]byte{0x5e}, sealing.Size))
	if err != nil {
		panic(err)
	}
	return k
}()

// fixture is one test's database, broker, topic, tenant and service.
type fixture struct {
	t         testing.TB
	dsn       string
	pool      *pgxpool.Pool
	brokers   []string
	topic     string
	orgID     string
	projectID string
	admin     context.Context // a principal of orgID holding admin:org
	svc       *Service        // AllowPrivate: receivers are httptest servers on loopback
	prod      *kgo.Client
	adm       *kadm.Client // committedAll's, made when first needed
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	return newFixtureOn(t, pgtest.NewDSN(t))
}

// newFixtureOn is newFixture on the database at dsn, which must be migrated.
func newFixtureOn(t testing.TB, dsn string) *fixture {
	t.Helper()
	f := &fixture{t: t, dsn: dsn, brokers: kafkatest.Brokers(t)}
	pool, err := postgres.Connect(t.Context(), f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	f.pool = pool
	f.topic = kafkatest.Topic(t, "webhooks")
	f.orgID = f.addOrg("acme")
	f.projectID = f.addProject(f.orgID)
	f.admin = principal(f.orgID, access.AdminOrg)
	f.svc = NewService(pool, ServiceConfig{AllowPrivate: true, Key: testKey})
	f.prod = kafkatest.Client(t, kgo.DefaultProduceTopic(f.topic))
	return f
}

func principal(orgID string, scopes ...string) context.Context {
	return access.With(context.Background(), &access.Principal{OrgID: orgID, KeyID: "key_test", Mode: access.Test, Scopes: scopes})
}

func (f *fixture) addOrg(slug string) string {
	f.t.Helper()
	id := ids.New(ids.Organization)
	if _, err := f.pool.Exec(context.Background(), `insert into organizations (id, name, slug, type, plan)
values ($1, $2, $3, 'clinic', 'growth')`, id, slug, slug+"-"+id); err != nil {
		f.t.Fatal(err)
	}
	return id
}

func (f *fixture) addProject(orgID string) string {
	f.t.Helper()
	id := ids.New(ids.Project)
	if _, err := f.pool.Exec(context.Background(), `insert into projects (id, org_id, name) values ($1, $2, 'p')`, id, orgID); err != nil {
		f.t.Fatal(err)
	}
	return id
}

func (f *fixture) create(url string, patterns ...string) *Subscription {
	f.t.Helper()
	return f.createWith(Options{}, url, patterns...)
}

// createWith creates a subscription with delivery settings.
func (f *fixture) createWith(opts Options, url string, patterns ...string) *Subscription {
	f.t.Helper()
	sub, err := f.svc.Create(f.admin, f.projectID, url, patterns, opts)
	if err != nil {
		f.t.Fatalf("create webhook: %v", err)
	}
	return sub
}

// publish produces an event of f's project to f's topic, as the outbox relay would.
func (f *fixture) publish(typ string, payload any) events.Event {
	f.t.Helper()
	ev, err := events.New(typ, f.orgID, f.projectID, events.SourceIntegration, events.SeverityInfo, payload)
	if err != nil {
		f.t.Fatal(err)
	}
	f.produce(ev)
	return ev
}

func (f *fixture) produce(evs ...events.Event) {
	f.t.Helper()
	recs := make([]*kgo.Record, len(evs))
	for i, ev := range evs {
		recs[i] = eventRecord(f.t, ev)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		f.t.Fatalf("produce: %v", err)
	}
}

// eventRecord is ev as the outbox relay publishes it: keyed by project, the JSON envelope.
func eventRecord(t testing.TB, ev events.Event) *kgo.Record {
	v, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return &kgo.Record{Key: []byte(ev.ProjectID), Value: v}
}

// running is a dispatcher run by a test.
type running struct {
	*Dispatcher
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// stop cancels the dispatcher and waits for it; later calls do nothing.
func (r *running) stop(t testing.TB) {
	t.Helper()
	r.once.Do(func() { r.stopOnce(t) })
}

func (r *running) stopOnce(t testing.TB) {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("dispatcher: %v", err)
		}
	case <-time.After(30 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("dispatcher did not stop; goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	}
}

// start runs a dispatcher on f's database and topic, with a group of its own, the fast
// schedule and a short poll interval unless tweak says otherwise. It stops when the test ends.
func (f *fixture) start(tweak ...func(*DispatcherConfig)) *running {
	f.t.Helper()
	cfg := DispatcherConfig{
		Pool:         f.pool,
		Brokers:      f.brokers,
		Topic:        f.topic,
		Group:        kafkatest.Group(f.t, "carehub-webhooks"),
		Logger:       testLogger(f.t),
		Key:          testKey,
		AllowPrivate: true,
		Schedule:     fastSchedule,
		PollInterval: 20 * time.Millisecond,
	}
	for _, fn := range tweak {
		fn(&cfg)
	}
	d, err := NewDispatcher(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Dispatcher: d, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- d.Run(ctx) }()
	f.t.Cleanup(func() { r.stop(f.t) })
	return r
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// request is one delivery a receiver got.
type request struct {
	Header http.Header
	Body   []byte
	At     time.Time
	Proto  string // HTTP/1.1, HTTP/2.0
	Remote string // the connection's client address
}

func (r request) id() string { return r.Header.Get(whsig.HeaderID) }

func (r request) eventType() string {
	var b struct {
		Event string `json:"event"`
	}
	_ = json.Unmarshal(r.Body, &b)
	return b.Event
}

// eventTypes returns the event type of each request rc received, in order.
func (rc *receiver) eventTypes() []string {
	var types []string
	for _, r := range rc.requests() {
		types = append(types, r.eventType())
	}
	return types
}

// receiver is a webhook endpoint on loopback that records every request and answers with
// respond (200 when nil). respond gets the 0-based number of the request.
type receiver struct {
	*httptest.Server
	mu      sync.Mutex
	reqs    []request
	respond func(n int, w http.ResponseWriter, r *http.Request)
	arrived chan struct{}
}

func newReceiver(t testing.TB, respond func(n int, w http.ResponseWriter, r *http.Request)) *receiver {
	rc := &receiver{respond: respond, arrived: make(chan struct{}, 1)}
	rc.Server = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	n := len(rc.reqs)
	rc.reqs = append(rc.reqs, request{Header: r.Header.Clone(), Body: body, At: time.Now(), Proto: r.Proto, Remote: r.RemoteAddr})
	rc.mu.Unlock()
	select {
	case rc.arrived <- struct{}{}:
	default:
	}
	if rc.respond != nil {
		rc.respond(n, w, r)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (rc *receiver) requests() []request {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]request(nil), rc.reqs...)
}

func (rc *receiver) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.reqs)
}

// waitRequests waits until the receiver has at least n requests and returns them.
func (rc *receiver) waitRequests(t testing.TB, n int, timeout time.Duration) []request {
	t.Helper()
	testenv.Eventually(t, timeout, "requests at the receiver", func() bool { return rc.count() >= n })
	return rc.requests()
}

func status(code int) func(int, http.ResponseWriter, *http.Request) {
	return func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) }
}

// quiet asserts that the dispatcher makes at least passes more claims (so it had every chance
// to attempt something) and that the receiver gets nothing meanwhile.
func quiet(t testing.TB, d *running, rc *receiver, passes int64) {
	t.Helper()
	before, start := rc.count(), d.claimPasses.Load()
	testenv.Eventually(t, 20*time.Second, "claim passes", func() bool { return d.claimPasses.Load() >= start+passes })
	if got := rc.count(); got != before {
		t.Fatalf("receiver got %d more requests while none were due", got-before)
	}
}

// committedAll reports whether group has committed the end of every partition of f's topic
// that holds records.
func (f *fixture) committedAll(group string) bool {
	ctx := context.Background()
	if f.adm == nil {
		f.adm = kadm.NewClient(kafkatest.Client(f.t))
	}
	ends, err := f.adm.ListEndOffsets(ctx, f.topic)
	if err != nil {
		return false
	}
	committed, err := f.adm.FetchOffsets(ctx, group)
	if err != nil {
		return false
	}
	caught := true
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			c, ok := committed.Lookup(o.Topic, o.Partition)
			caught = caught && ok && c.At >= o.Offset
		}
	})
	return caught
}

// deliveryRow is a delivery as stored.
type deliveryRow struct {
	ID, EventID, Status string
	AttemptCount        int
	LeaseOwner          *string
	NextAttemptAt       time.Time
}

func (f *fixture) deliveries(webhookID string) []deliveryRow {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), `select id, event_id, status, attempt_count, lease_owner, next_attempt_at
from webhook_deliveries where webhook_id = $1 order by seq`, webhookID)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	var out []deliveryRow
	for rows.Next() {
		var d deliveryRow
		if err := rows.Scan(&d.ID, &d.EventID, &d.Status, &d.AttemptCount, &d.LeaseOwner, &d.NextAttemptAt); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// attemptCodes returns the status codes (0: no response) of a delivery's attempts, oldest first.
func (f *fixture) attemptCodes(deliveryID string) []int {
	f.t.Helper()
	atts, err := f.svc.Attempts(f.admin, []string{deliveryID})
	if err != nil {
		f.t.Fatal(err)
	}
	var out []int
	for _, a := range atts[deliveryID] {
		if a.StatusCode == nil {
			out = append(out, 0)
		} else {
			out = append(out, *a.StatusCode)
		}
	}
	return out
}

func (f *fixture) get(id string) *Subscription {
	f.t.Helper()
	sub, err := f.svc.Get(f.admin, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return sub
}

func (f *fixture) waitDeliveryStatus(webhookID, eventID, want string) deliveryRow {
	f.t.Helper()
	var found deliveryRow
	testenv.Eventually(f.t, 20*time.Second, "delivery of "+eventID+" to be "+want, func() bool {
		for _, d := range f.deliveries(webhookID) {
			if d.EventID == eventID && d.Status == want {
				found = d
				return true
			}
		}
		return false
	})
	return found
}

func requestIDs(reqs []request) []string {
	out := make([]string, len(reqs))
	for i, r := range reqs {
		out[i] = r.id()
	}
	return out
}

func eventIDs(evs []events.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.ID
	}
	return out
}

func join(s []string) string { return strings.Join(s, " ") }

// oneAtATime is a concurrent subscription with one attempt in flight: first attempts in seq
// order, a failure retried on its own schedule.
func oneAtATime() Options { return Options{MaxInFlight: ptr(1)} }

func ptr[T any](v T) *T { return &v }
