package clickhouse_test

import (
	"context"
	"encoding/json"
	"net"
	"sync"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"carehub/kernel/events"
	"carehub/kernel/ids"
	"carehub/storage"
	"carehub/storage/clickhouse"
	"carehub/storage/clickhouse/chtest"
	"carehub/storage/storagetest"
)

// newStore opens a store on a database of its own (chtest), dropped when the test ends; without
// a server (CAREHUB_CLICKHOUSE_URL) the test skips.
func newStore(t testing.TB) *clickhouse.Store {
	t.Helper()
	return newStoreAt(t, chtest.NewURL(t))
}

func newStoreAt(t testing.TB, url string) *clickhouse.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := clickhouse.Open(ctx, url, clickhouse.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return store
}

func TestEventLogConformance(t *testing.T) {
	storagetest.TestEventLog(t, func(t *testing.T) storage.EventLog { return newStore(t) })
}

func TestAuditLogConformance(t *testing.T) {
	storagetest.TestAuditLog(t, func(t *testing.T) storage.AuditLog { return newStore(t) })
}

// TestServerSurvivesConnectionReset resets a native-protocol connection after a query, as a node
// killed mid-test does, and checks the server still answers. A non-interactive clickhouse-local
// aborts on it (deploy/local/clickhouse/launcher.c says why and how the launcher avoids it).
func TestServerSurvivesConnectionReset(t *testing.T) {
	dsn := chtest.NewURL(t)
	opts, err := ch.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []*net.TCPConn
	opts.DialContext = func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err == nil {
			mu.Lock()
			conns = append(conns, c.(*net.TCPConn))
			mu.Unlock()
		}
		return c, err
	}
	conn, err := ch.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for _, c := range conns {
		_ = c.SetLinger(0) // close sends RST
		_ = c.Close()
	}
	mu.Unlock()
	_ = conn.Close()
	// The server handles the reset on its own thread; a crash shows within moments, so keep
	// asking for a while rather than once.
	store := newStoreAt(t, dsn)
	for range 20 {
		if _, err := store.QueryEvents(ctx, storage.EventQuery{ProjectID: "prj_x"}); err != nil {
			t.Fatalf("server gone after a client reset its connection: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// openConn is a plain connection to dsn, closed when t ends.
func openConn(t testing.TB, dsn string) driver.Conn {
	t.Helper()
	opts, err := ch.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := ch.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// exec runs statements on the database of dsn.
func exec(t *testing.T, dsn string, stmts ...string) {
	t.Helper()
	conn := openConn(t, dsn)
	for _, stmt := range stmts {
		if err := conn.Exec(context.Background(), stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
}

func testEvent(project string, at time.Time) events.Event {
	return events.Event{ID: ids.New(ids.Event), Type: "a.b", OrgID: "org_a", ProjectID: project, Source: "system",
		Severity: "info", Payload: json.RawMessage(`{}`), CreatedAt: at}
}

// TestPageSkipsUnmergedCopies stores many copies of the newest events with merges stopped, so
// none collapse, and checks pages still hold distinct events: the page reader must ask for more
// rows than the page when copies crowd its first read.
func TestPageSkipsUnmergedCopies(t *testing.T) {
	dsn := chtest.NewURL(t)
	store := newStoreAt(t, dsn)
	exec(t, dsn, "SYSTEM STOP MERGES event_log")
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	var evs []events.Event
	for i := range 10 {
		evs = append(evs, testEvent("prj_a", now.Add(-time.Duration(i)*time.Second)))
	}
	if err := store.AppendEvents(ctx, evs); err != nil {
		t.Fatal(err)
	}
	for range 30 { // 30 more copies of the two newest, one insert (part) each
		if err := store.AppendEvents(ctx, evs[:2]); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	q := storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Limit: 3}
	for {
		page, err := store.QueryEvents(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if page.Total != int64(len(evs)) {
			t.Fatalf("total %d, want %d", page.Total, len(evs))
		}
		if len(page.Events) != min(3, len(evs)-len(got)) {
			t.Fatalf("page of %d events after %d, want %d", len(page.Events), len(got), min(3, len(evs)-len(got)))
		}
		for _, ev := range page.Events {
			got = append(got, ev.ID)
		}
		if page.NextCursor == "" {
			break
		}
		q.Cursor = page.NextCursor
	}
	for i, ev := range evs {
		if got[i] != ev.ID {
			t.Fatalf("pages visited %v, want the %d events newest first", got, len(evs))
		}
	}
}

// TestRetention opens a store with a retention and checks events older than it go, newer stay,
// and reopening with the same retention leaves the table alone.
func TestRetention(t *testing.T) {
	dsn := chtest.NewURL(t)
	store := newStoreAt(t, dsn)
	ctx := context.Background()
	now := time.Now().UTC()
	old, recent := testEvent("prj_a", now.AddDate(-2, 0, 0)), testEvent("prj_a", now.Add(-time.Hour))
	if err := store.AppendEvents(ctx, []events.Event{old, recent}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second Open finds the TTL in place
		s, err := clickhouse.Open(ctx, dsn, clickhouse.Config{EventRetention: 365 * 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		_ = s.Close()
	}
	deadline := time.Now().Add(time.Minute)
	for {
		page, err := store.QueryEvents(ctx, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a"})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Events) == 1 && page.Events[0].ID == recent.ID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events %d a minute after a one-year retention, want only the recent one", len(page.Events))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHostileFilterValues passes quotes, backslashes and SQL through every filter: they must
// match only themselves, never change the query.
func TestHostileFilterValues(t *testing.T) {
	store := newStore(t)
	ctx := context.Background()
	hostile := []string{`x' OR '1'='1`, `x\' OR 1=1 --`, "x'; DROP TABLE event_log; --", `{p:String}`, "x\x00y", `?`}
	var evs []events.Event
	for _, h := range hostile {
		ev := testEvent(h, time.Now().UTC())
		ev.Type, ev.OrgID = h, h
		evs = append(evs, ev)
	}
	if err := store.AppendEvents(ctx, evs); err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		page, err := store.QueryEvents(ctx, storage.EventQuery{OrgID: ev.OrgID, ProjectID: ev.ProjectID, Type: ev.Type})
		if err != nil {
			t.Fatalf("%q: %v", ev.ProjectID, err)
		}
		if len(page.Events) != 1 || page.Events[0].ID != ev.ID || page.Total != 1 {
			t.Errorf("%q: %d events (total %d), want its own one", ev.ProjectID, len(page.Events), page.Total)
		}
		audit, err := store.QueryAudit(ctx, storage.AuditQuery{OrgID: ev.OrgID, KeyID: ev.OrgID, PatientID: ev.OrgID, Operation: ev.OrgID})
		if err != nil || len(audit.Records) != 0 {
			t.Errorf("%q: audit %d records, %v; want none", ev.OrgID, len(audit.Records), err)
		}
	}
}

// TestCountsBackfill opens a store whose event log holds events from before the hourly sums
// existed (0021_event_counts.sql dropped, as on a database migrated by an older release): Open
// counts them once, in each month's partition, and the events appended afterwards through the
// view.
func TestCountsBackfill(t *testing.T) {
	url := chtest.NewURL(t)
	store := newStoreAt(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	at := time.Date(2026, 1, 31, 23, 30, 0, 0, time.UTC) // two months, so two partitions
	var before []events.Event
	for i := range 6 {
		before = append(before, events.Event{ID: ids.New(ids.Event), OrgID: "org_a", ProjectID: "prj_a", Type: "agent.run_completed",
			Source: "agent", Severity: "info", Payload: json.RawMessage(`{"status":"COMPLETED"}`), CreatedAt: at.Add(time.Duration(i) * 20 * time.Minute)})
	}
	if err := store.AppendEvents(ctx, before); err != nil {
		t.Fatal(err)
	}
	conn := openConn(t, url)
	for _, stmt := range []string{"DROP VIEW event_counts_hourly_mv", "DROP TABLE event_counts_hourly"} {
		if err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	store = newStoreAt(t, url)
	after := before[0]
	after.ID, after.CreatedAt = ids.New(ids.Event), at.Add(5*time.Minute)
	if err := store.AppendEvents(ctx, []events.Event{after, before[1]}); err != nil {
		t.Fatal(err)
	}
	var counted uint64
	if err := conn.QueryRow(ctx, "SELECT sum(events) FROM event_counts_hourly").Scan(&counted); err != nil {
		t.Fatal(err)
	}
	if counted != 7 {
		t.Errorf("hourly sums count %d events, want 7 (6 backfilled, 1 appended, a copy not)", counted)
	}
	rows, err := store.AggregateEvents(ctx, storage.AggregateQuery{OrgID: "org_a", Bucket: storage.BucketDay})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Count != 3 || rows[1].Count != 4 {
		t.Errorf("days: %+v, want 3 on Jan 31 and 4 on Feb 1", rows)
	}
}

// TestLargeBatchOfCopiesCountedOnce appends a batch far larger than a query's text could name
// (the ids of the lookup go to the server as a table of their own): 6,000 events, 5,000 of them
// stored already and 100 twice in the batch. Each id is stored and counted once.
func TestLargeBatchOfCopiesCountedOnce(t *testing.T) {
	url := chtest.NewURL(t)
	store := newStoreAt(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Hour)
	batch := make([]events.Event, 6000)
	for i := range batch {
		batch[i] = events.Event{ID: ids.New(ids.Event), OrgID: "org_a", ProjectID: "prj_" + string(rune('a'+i%7)), Type: "agent.run_completed",
			Source: "agent", Severity: "info", Payload: json.RawMessage(`{"status":"COMPLETED"}`), CreatedAt: at.Add(time.Duration(i) * time.Millisecond)}
	}
	if err := store.AppendEvents(ctx, batch[:5000]); err != nil {
		t.Fatal(err)
	}
	if err := store.AppendEvents(ctx, append(batch, batch[4900:5000]...)); err != nil {
		t.Fatal(err)
	}
	conn := openConn(t, url)
	var rows, distinct, counted uint64
	if err := conn.QueryRow(ctx, "SELECT count(), uniqExact(id) FROM event_log").Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT sum(events) FROM event_counts_hourly").Scan(&counted); err != nil {
		t.Fatal(err)
	}
	if rows != 6000 || distinct != 6000 || counted != 6000 {
		t.Errorf("event_log holds %d rows of %d ids and the hourly sums count %d; want 6,000 each", rows, distinct, counted)
	}
}
