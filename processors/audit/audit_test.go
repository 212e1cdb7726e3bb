package audit_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/internal/testenv"
	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/processors/audit"
	"carehub/storage"
	"carehub/storage/kafka/consume"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func record(org string, patients ...string) storage.AuditRecord {
	return storage.AuditRecord{ID: ids.New(ids.Request), Time: time.Now().UTC().Truncate(time.Microsecond), OrgID: org,
		KeyID: "key_1", Mode: access.Live, ClientIP: "192.0.2.1", UserAgent: "test", Operation: "GET /v1/patients/{id}",
		ResourceIDs: patients, PatientIDs: patients, Outcome: "success", Status: 200, LatencyMs: 3}
}

// runWriter runs a writer on topic until the test ends.
func runWriter(t *testing.T, topic, group string, store storage.AuditLog) {
	t.Helper()
	runWriterWith(t, audit.WriterConfig{Topic: topic, Group: group, Store: store})
}

// runWriterWith runs a writer of cfg (on the test's brokers) until the test ends.
func runWriterWith(t *testing.T, cfg audit.WriterConfig) {
	t.Helper()
	cfg.Brokers = kafkatest.Brokers(t)
	w, err := audit.NewWriter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Run(t, w.Run)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, what, cond)
}

func count(t *testing.T, log storage.AuditLog, q storage.AuditQuery) int64 {
	t.Helper()
	page, err := log.QueryAudit(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	return page.Total
}

func TestPublishAndWrite(t *testing.T) {
	pool := pgtest.New(t)
	store := postgres.NewAuditLog(pool)
	topic := kafkatest.Topic(t, "audit")
	pub, err := audit.NewPublisher(audit.PublisherConfig{Brokers: kafkatest.Brokers(t), Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(5 * time.Second)
	ctx := context.Background()

	synced := record("org_a", "pat_1")
	if err := pub.PublishSync(ctx, synced); err != nil {
		t.Fatal(err)
	}
	async := record("org_a")
	pub.Publish(async)
	// The same record twice (a redelivery) and a message that is not a record.
	if err := pub.PublishSync(ctx, synced); err != nil {
		t.Fatal(err)
	}
	raw := kafkatest.Client(t)
	if err := raw.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("org_a"), Value: []byte("{not json")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	last := record("org_b", "pat_2")
	if err := pub.PublishSync(ctx, last); err != nil {
		t.Fatal(err)
	}

	runWriter(t, topic, kafkatest.Group(t, "audit"), store)
	waitFor(t, "three records stored", func() bool { return count(t, store, storage.AuditQuery{}) == 3 })
	page, err := store.QueryAudit(ctx, storage.AuditQuery{PatientID: "pat_1"})
	if err != nil || len(page.Records) != 1 {
		t.Fatalf("records of pat_1: %+v, %v; want exactly one", page.Records, err)
	}
	got := page.Records[0]
	if got.ID != synced.ID || !got.Time.Equal(synced.Time) || got.OrgID != "org_a" || got.Operation != synced.Operation || got.Status != 200 {
		t.Fatalf("stored %+v, want %+v", got, synced)
	}
}

// failingStore fails its first n appends: the writer must retry, and must not commit offsets
// before a batch is stored.
type failingStore struct {
	storage.AuditLog
	failures atomic.Int32
	calls    atomic.Int32
}

func (s *failingStore) AppendAudit(ctx context.Context, rs []storage.AuditRecord) error {
	s.calls.Add(1)
	if s.failures.Add(-1) >= 0 {
		return errors.New("store down")
	}
	return s.AuditLog.AppendAudit(ctx, rs)
}

func TestWriterCommitsOnlyStoredRecords(t *testing.T) {
	pool := pgtest.New(t)
	store := &failingStore{AuditLog: postgres.NewAuditLog(pool)}
	store.failures.Store(3)
	topic := kafkatest.Topic(t, "audit")
	group := kafkatest.Group(t, "audit")
	pub, err := audit.NewPublisher(audit.PublisherConfig{Brokers: kafkatest.Brokers(t), Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(5 * time.Second)
	ctx := context.Background()
	const n = 50
	for range n {
		if err := pub.PublishSync(ctx, record("org_a", "pat_1")); err != nil {
			t.Fatal(err)
		}
	}
	adm := kadm.NewClient(kafkatest.Client(t))
	committed := func() int64 {
		offs, err := adm.FetchOffsets(ctx, group)
		if err != nil {
			return -1
		}
		var sum int64
		offs.Each(func(o kadm.OffsetResponse) { sum += o.At })
		return sum
	}
	runWriter(t, topic, group, store)
	waitFor(t, "the writer to meet the failing store", func() bool { return store.calls.Load() >= 2 })
	if c := committed(); c > 0 {
		t.Fatalf("offsets committed (%d) while the store was failing", c)
	}
	waitFor(t, "all records stored", func() bool { return count(t, store, storage.AuditQuery{}) == n })
	waitFor(t, "offsets committed", func() bool { return committed() == n })
}

// hangingStore never answers its first append: it returns only when the call's context ends, as
// a ClickHouse insert whose answer never comes returns only at the context's deadline.
type hangingStore struct {
	storage.AuditLog
	calls atomic.Int32
}

func (s *hangingStore) AppendAudit(ctx context.Context, rs []storage.AuditRecord) error {
	if s.calls.Add(1) == 1 {
		<-ctx.Done()
		return ctx.Err()
	}
	return s.AuditLog.AppendAudit(ctx, rs)
}

// A store call that never returns must not stop the writer for good: the attempt is abandoned at
// the store timeout and retried, and the records are stored.
func TestWriterRetriesAStoreCallThatNeverReturns(t *testing.T) {
	pool := pgtest.New(t)
	store := &hangingStore{AuditLog: postgres.NewAuditLog(pool)}
	topic := kafkatest.Topic(t, "audit")
	pub, err := audit.NewPublisher(audit.PublisherConfig{Brokers: kafkatest.Brokers(t), Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(5 * time.Second)
	const n = 20
	for range n {
		if err := pub.PublishSync(context.Background(), record("org_a", "pat_1")); err != nil {
			t.Fatal(err)
		}
	}
	runWriterWith(t, audit.WriterConfig{Topic: topic, Group: kafkatest.Group(t, "audit"), Store: store,
		StoreTimeout: 100 * time.Millisecond})
	waitFor(t, "the records stored after the unanswered call", func() bool { return count(t, store, storage.AuditQuery{}) == n })
	if c := store.calls.Load(); c < 2 {
		t.Fatalf("%d store calls, want the unanswered one and a retry", c)
	}
}

func TestServiceQuery(t *testing.T) {
	pool := pgtest.New(t)
	store := postgres.NewAuditLog(pool)
	ctx := context.Background()
	a1, a2, b1 := record("org_a", "pat_1"), record("org_a"), record("org_b", "pat_1")
	a2.Time = a1.Time.Add(time.Second)
	if err := store.AppendAudit(ctx, []storage.AuditRecord{a1, a2, b1}); err != nil {
		t.Fatal(err)
	}
	svc := audit.NewService(store)
	as := func(p *access.Principal) context.Context { return access.With(ctx, p) }
	admin := &access.Principal{OrgID: "org_a", KeyID: "key_a", Mode: access.Live, Scopes: []string{access.AdminOrg}}

	if _, err := svc.Query(ctx, storage.AuditQuery{}); fault.KindOf(err) != fault.KindUnauthenticated {
		t.Fatalf("no caller: %v", err)
	}
	reader := &access.Principal{OrgID: "org_a", KeyID: "key_r", Mode: access.Live, Scopes: []string{access.ReadPatients}}
	if _, err := svc.Query(as(reader), storage.AuditQuery{}); fault.KindOf(err) != fault.KindInsufficientScope {
		t.Fatalf("without admin:org: %v", err)
	}
	page, err := svc.Query(as(admin), storage.AuditQuery{OrgID: "org_b"}) // another org's filter is ignored
	if err != nil || len(page.Records) != 2 || page.Records[0].ID != a2.ID || page.Records[1].ID != a1.ID {
		t.Fatalf("org_a's records newest first: %+v, %v", page.Records, err)
	}
	ctx2, rec := access.WithRecorder(as(admin))
	page, err = svc.Query(ctx2, storage.AuditQuery{PatientID: "pat_1"})
	if err != nil || len(page.Records) != 1 || page.Records[0].ID != a1.ID {
		t.Fatalf("pat_1 in org_a: %+v, %v", page.Records, err)
	}
	if got := rec.PatientIDs(); len(got) != 1 || got[0] != "pat_1" {
		t.Fatalf("a read of a patient's accesses touched %v, want [pat_1]", got)
	}
	platform := &access.Principal{KeyID: "key_p", Mode: access.Live, Platform: true}
	if page, err := svc.Query(as(platform), storage.AuditQuery{}); err != nil || page.Total != 3 {
		t.Fatalf("platform sees %d records, %v; want 3", page.Total, err)
	}
	for _, q := range []storage.AuditQuery{{Limit: 1001}, {Limit: -1}, {Cursor: "bogus"},
		{From: a2.Time, To: a1.Time}} {
		if _, err := svc.Query(as(admin), q); fault.KindOf(err) != fault.KindInvalid {
			t.Errorf("query %+v: %v, want INVALID_REQUEST", q, err)
		}
	}
	page, err = svc.Query(as(admin), storage.AuditQuery{Limit: 1})
	if err != nil || len(page.Records) != 1 || page.NextCursor == "" {
		t.Fatalf("first page: %+v, %v", page, err)
	}
	next, err := svc.Query(as(admin), storage.AuditQuery{Limit: 1, Cursor: page.NextCursor})
	if err != nil || len(next.Records) != 1 || next.Records[0].ID != a1.ID || next.NextCursor != "" {
		t.Fatalf("second page: %+v, %v", next, err)
	}
}

// A record the store refuses as data (a NUL in its User-Agent: Postgres text cannot hold it)
// goes to the dead-letter topic with where it came from, and the records behind it are stored:
// it never stalls its partition.
func TestRefusedRecordIsDeadLettered(t *testing.T) {
	pool := pgtest.New(t)
	store := postgres.NewAuditLog(pool)
	topic, dlq := kafkatest.Topic(t, "audit"), kafkatest.Topic(t, "audit-dlq")
	ctx := context.Background()
	bad, good := record("org_a"), record("org_a")
	// What the publisher encodes never holds a raw NUL, but a record produced to the topic by
	// anything else may; it passes decode.
	badValue := []byte(`{"id":"` + bad.ID + `","time":"` + bad.Time.Format(time.RFC3339Nano) +
		`","orgId":"org_a","operation":"GET /v1/x","userAgent":"x\u0000y"}`)
	goodValue := []byte(`{"id":"` + good.ID + `","time":"` + good.Time.Format(time.RFC3339Nano) + `","orgId":"org_a","operation":"GET /v1/x"}`)
	raw := kafkatest.Client(t)
	// One key, one partition: the good record is behind the bad one.
	if err := raw.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("org_a"), Value: badValue},
		&kgo.Record{Topic: topic, Key: []byte("org_a"), Value: goodValue}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	runWriterWith(t, audit.WriterConfig{Topic: topic, DeadLetterTopic: dlq, Group: kafkatest.Group(t, "audit"), Store: store})
	waitFor(t, "the good record stored", func() bool { return count(t, store, storage.AuditQuery{}) == 1 })
	var dead []consume.DeadLettered
	waitFor(t, "the bad record dead-lettered", func() bool {
		dead = dead[:0]
		for _, r := range kafkatest.ReadAll(t, dlq) {
			if d, err := consume.ReadDeadLettered(r); err == nil {
				dead = append(dead, d)
			}
		}
		return len(dead) > 0
	})
	d := dead[0]
	if len(dead) != 1 || string(d.Record.Value) != string(badValue) || d.SourceTopic != topic || d.Consumer != "audit" ||
		!strings.HasPrefix(d.Error, "the store refuses the data (SQLSTATE 22") {
		t.Fatalf("dead-lettered %d: %+v", len(dead), d)
	}
	page, err := store.QueryAudit(ctx, storage.AuditQuery{})
	if err != nil || len(page.Records) != 1 || page.Records[0].ID != good.ID {
		t.Fatalf("stored %+v, %v; want only %s", page.Records, err, good.ID)
	}
}
