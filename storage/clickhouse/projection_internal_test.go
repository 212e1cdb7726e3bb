package clickhouse

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"carehub/kernel/events"
	"carehub/kernel/ids"
	"carehub/storage"
	"carehub/storage/clickhouse/chtest"
)

// TestProjections: a count of one type over time reads the by-type projection (0003); a page or
// an export of one patient's events reads the by-patient projection (0022), with the payload;
// every other page and export reads the table in its own order, newest first, although the
// by-patient projection could serve it too (the server would pick it on a tie, and could not
// read it in time order).
func TestProjections(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	store := openForTest(ctx, t, chtest.NewURL(t))
	// Enough granules of interleaved types and patients that reading one run costs less than
	// the table.
	evs := make([]events.Event, 40_000)
	at := time.Now().UTC().Add(-time.Hour)
	for i := range evs {
		evs[i] = events.Event{ID: ids.New(ids.Event), Type: fmt.Sprintf("t.%02d", i%20), OrgID: "org_a", ProjectID: "prj_a",
			Source: "system", Severity: "info", Payload: json.RawMessage(fmt.Sprintf(`{"patientId":"pat_%03d"}`, i%500)),
			CreatedAt: at.Add(time.Duration(i) * time.Millisecond)}
	}
	if err := store.AppendEvents(ctx, evs); err != nil {
		t.Fatal(err)
	}
	run := func(sql string, args []any, settings ch.Settings) error {
		rows, err := store.conn.Query(ch.Context(ctx, ch.WithSettings(settings)), sql, args...)
		if err != nil {
			return err
		}
		for rows.Next() {
		}
		_ = rows.Close()
		return rows.Err()
	}

	counts := `SELECT toStartOfDay(created_at) AS d, count() FROM event_log WHERE org_id = 'org_a' AND project_id = 'prj_a'
AND type = 't.07' GROUP BY d`
	if err := run(counts, nil, ch.Settings{"force_optimize_projection_name": "event_log_by_type"}); err != nil {
		t.Errorf("counts of one type do not read the by-type projection: %v", err)
	}

	for _, tc := range []struct {
		name       string
		q          storage.EventQuery
		projection string // "": the table
	}{
		{"a page", storage.EventQuery{}, ""},
		{"a page of one type", storage.EventQuery{Type: "t.07"}, ""},
		{"a page oldest first", storage.EventQuery{Ascending: true}, ""},
		{"a page of one patient", storage.EventQuery{PatientID: "pat_007"}, patientProjection},
		{"a page of one patient oldest first", storage.EventQuery{PatientID: "pat_007", Ascending: true}, patientProjection},
		{"a page of one patient and type", storage.EventQuery{PatientID: "pat_007", Type: "t.07"}, patientProjection},
	} {
		tc.q.OrgID, tc.q.ProjectID = "org_a", "prj_a"
		sql, args, err := eventsInOrder(tc.q, eventQueryFilter(tc.q))
		if err != nil {
			t.Fatal(err)
		}
		got, err := readFrom(ctx, store, "EXPLAIN "+sql+" LIMIT 10", args, projectionFor(tc.q))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got != tc.projection {
			t.Errorf("%s reads %q; want %q (\"\": the table)", tc.name, got, tc.projection)
		}
	}

	// And what the store returns from the projection is the patient's events, newest first.
	page, err := store.QueryEvents(ctx, storage.EventQuery{OrgID: "org_a", ProjectID: "prj_a", PatientID: "pat_007", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Events) != 40_000/500 {
		t.Fatalf("%d events of pat_007; want %d", len(page.Events), 40_000/500)
	}
	for i, ev := range page.Events {
		if want := evs[len(evs)-500+7-i*500]; ev.ID != want.ID || string(ev.Payload) != string(want.Payload) {
			t.Fatalf("event %d: %s %s; want %s %s", i, ev.ID, ev.Payload, want.ID, want.Payload)
		}
	}
}

// readFrom returns the projection the plan explain reads from, or "" for the table itself.
func readFrom(ctx context.Context, store *Store, explain string, args []any, settings ch.Settings) (string, error) {
	rows, err := store.conn.Query(ch.Context(ctx, ch.WithSettings(settings)), explain, args...)
	if err != nil {
		return "", err
	}
	defer func() { _ = rows.Close() }()
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return "", err
		}
		plan = append(plan, line)
	}
	for _, line := range plan {
		if _, after, ok := strings.Cut(line, "ReadFromMergeTree ("); ok {
			if name, _, _ := strings.Cut(after, ")"); strings.HasPrefix(name, "event_log_by_") {
				return name, rows.Err()
			}
			return "", rows.Err()
		}
	}
	return "", fmt.Errorf("no ReadFromMergeTree in the plan %q", plan)
}
