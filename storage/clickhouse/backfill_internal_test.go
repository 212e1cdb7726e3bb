package clickhouse

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"carehub/kernel/events"
	"carehub/kernel/ids"
	"carehub/storage"
	"carehub/storage/clickhouse/chtest"
)

var errKilled = errors.New("killed here")

// TestCountsBackfillResumes stops the backfill of the hourly sums after every step it takes, as
// a node killed there would, opens the store again and checks the sums: every event counted
// once, none twice, in its month, and the stage gone. Between the two Opens an event is
// appended, which the view or the resumed backfill must count (depending on whether the cut was
// taken).
func TestCountsBackfillResumes(t *testing.T) {
	url := chtest.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t.Cleanup(func() { backfillStep = func(uint32, uint8) error { return nil } })

	store := openForTest(ctx, t, url)
	var evs []events.Event
	appendAt := func(at time.Time) {
		t.Helper()
		ev := events.Event{ID: ids.New(ids.Event), OrgID: "org_a", ProjectID: "prj_a", Type: "agent.run_completed",
			Source: "agent", Severity: "info", Payload: json.RawMessage(`{"status":"COMPLETED"}`), CreatedAt: at}
		if err := store.AppendEvents(ctx, []events.Event{ev}); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	for month := range 3 { // three partitions
		for i := range 4 {
			appendAt(time.Date(2026, time.Month(1+month), 10, i*5, 0, 0, 0, time.UTC))
		}
	}
	// A store that predates the sums: an older release's database.
	predate := func() {
		t.Helper()
		for _, stmt := range []string{"DROP VIEW event_counts_hourly_mv", "DROP TABLE event_counts_hourly", "DROP TABLE IF EXISTS " + stageTable} {
			if err := store.conn.Exec(ctx, stmt); err != nil {
				t.Fatal(err)
			}
		}
	}

	steps := 0
	backfillStep = func(uint32, uint8) error { steps++; return nil }
	predate()
	openForTest(ctx, t, url)
	checkSums(ctx, t, store, evs)
	if steps != 12 { // pending, cut, 3 × (staged, moved, done), complete
		t.Fatalf("%d steps, want 12", steps)
	}

	for k := 1; k <= steps; k++ {
		t.Run(fmt.Sprintf("killed after step %d", k), func(t *testing.T) {
			predate()
			n := 0
			backfillStep = func(month uint32, state uint8) error {
				if n++; n == k {
					return fmt.Errorf("month %d state %d: %w", month, state, errKilled)
				}
				return nil
			}
			if s, err := Open(ctx, url, Config{}); !errors.Is(err, errKilled) {
				if s != nil {
					_ = s.Close()
				}
				t.Fatalf("Open = %v, want it killed at step %d", err, k)
			}
			backfillStep = func(uint32, uint8) error { return nil }
			appendAt(time.Date(2026, 2, 20, 12, k, 0, 0, time.UTC))
			openForTest(ctx, t, url)
			checkSums(ctx, t, store, evs)
		})
	}
}

func openForTest(ctx context.Context, t *testing.T, url string) *Store {
	t.Helper()
	s, err := Open(ctx, url, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// checkSums compares the hourly sums, month by month, with events, and checks the stage is gone.
func checkSums(ctx context.Context, t *testing.T, s *Store, evs []events.Event) {
	t.Helper()
	want := map[uint32]uint64{}
	for _, ev := range evs {
		want[uint32(ev.CreatedAt.Year()*100+int(ev.CreatedAt.Month()))]++
	}
	rows, err := s.conn.Query(ctx, "SELECT toYYYYMM(hour), sum(events) FROM "+countsTable+" GROUP BY 1")
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint32]uint64{}
	for rows.Next() {
		var m uint32
		var n uint64
		if err := rows.Scan(&m, &n); err != nil {
			t.Fatal(err)
		}
		got[m] = n
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("hourly sums per month %v, want %v", got, want)
	}
	stage, err := column[uint64](ctx, s.conn, "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = ?", stageTable)
	if err != nil {
		t.Fatal(err)
	}
	if stage[0] != 0 {
		t.Errorf("%s still there after the backfill", stageTable)
	}
}

// TestSpans checks each project's span (0023_event_spans.sql) as the view keeps it and as the
// Open that creates it backfills it for a store that predates it, and that a first page reads
// the newest and the oldest events from it whichever way it goes.
func TestSpans(t *testing.T) {
	url := chtest.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store := openForTest(ctx, t, url)
	appendAt := func(project string, at time.Time) {
		t.Helper()
		ev := events.Event{ID: ids.New(ids.Event), OrgID: "org_a", ProjectID: project, Type: "agent.run_completed",
			Source: "agent", Severity: "info", Payload: json.RawMessage(`{}`), CreatedAt: at}
		if err := store.AppendEvents(ctx, []events.Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	first, last := time.Date(2025, 3, 1, 7, 30, 0, 0, time.UTC), time.Date(2026, 2, 9, 22, 59, 0, 0, time.UTC)
	for _, at := range []time.Time{last, first, first.AddDate(0, 6, 0)} {
		appendAt("prj_a", at)
	}
	appendAt("prj_b", last.AddDate(0, 0, 3))
	check := func(how string) {
		t.Helper()
		rows, err := store.conn.Query(ctx, "SELECT project_id, min(first_hour), max(last_hour) FROM "+spansTable+" GROUP BY project_id ORDER BY project_id")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for rows.Next() {
			var project string
			var lo, hi time.Time
			if err := rows.Scan(&project, &lo, &hi); err != nil {
				t.Fatal(err)
			}
			got = append(got, project+" "+lo.UTC().Format(time.RFC3339)+" "+hi.UTC().Format(time.RFC3339))
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			t.Fatal(err)
		}
		want := "[prj_a 2025-03-01T07:00:00Z 2026-02-09T22:00:00Z prj_b 2026-02-12T22:00:00Z 2026-02-12T22:00:00Z]"
		if fmt.Sprint(got) != want {
			t.Errorf("%s: spans %v, want %v", how, got, want)
		}
		for _, ascending := range []bool{false, true} {
			page, err := store.QueryEvents(ctx, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", Limit: 1, Ascending: ascending})
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]time.Time{false: last, true: first}[ascending]; len(page.Events) != 1 || !page.Events[0].CreatedAt.Equal(want) {
				t.Errorf("%s: first page (ascending %v) = %+v, want the event of %s", how, ascending, page.Events, want)
			}
		}
	}
	check("kept by the view")
	for _, stmt := range []string{"DROP VIEW event_spans_mv", "DROP TABLE " + spansTable} { // an older release's database
		if err := store.conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	openForTest(ctx, t, url)
	check("backfilled")
}
