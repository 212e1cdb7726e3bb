package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/internal/testenv"
	"carehub/kernel/events"
	"carehub/storage"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
	"carehub/storage/storagetest"
)

func TestEventLogConformance(t *testing.T) {
	storagetest.TestEventLog(t, func(t *testing.T) storage.EventLog {
		return postgres.NewEventLog(pgtest.New(t))
	})
}

func TestAuditLogConformance(t *testing.T) {
	storagetest.TestAuditLog(t, func(t *testing.T) storage.AuditLog {
		return postgres.NewAuditLog(pgtest.New(t))
	})
}

func TestQueryEventsNeedsProject(t *testing.T) {
	log := postgres.NewEventLog(pgtest.New(t))
	if _, err := log.QueryEvents(context.Background(), storage.EventQuery{OrgID: "org_a"}); err == nil {
		t.Fatal("query without a project succeeded")
	}
}

// TestQueryEventsPlans checks that the page and the count use the event_log indexes rather
// than a sequential scan, the difference between milliseconds and seconds at millions of rows.
func TestQueryEventsPlans(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	// Many small projects and one busy one (prj_3, a twentieth of the log), interleaved in time:
	// for the busy project, sorting its events or visiting their heap pages costs far more than
	// walking an index in order. The load commits synchronously (the test server runs with
	// synchronous_commit off): vacuum marks a page all-visible, which index-only counts need,
	// only once the inserting commit is flushed.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
insert into event_log (id, org_id, project_id, type, source, severity, payload, created_at)
select 'evt_' || lpad(i::text, 26, '0'),
       case when i % 20 = 0 then 'org_3' else 'org_' || (i % 997 % 50) end,
       case when i % 20 = 0 then 'prj_3' else 'prj_x' || (i % 997) end,
       'type.t' || (i % 7), 'system', 'info', '{"k": "some payload of a realistic size, with ids and states"}',
       now() - i * interval '1 second'
from generate_series(1, 200000) as i`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "vacuum analyze event_log"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, sql, index string
		args             []any
	}{
		{"page", `select * from event_log where project_id = $1 and org_id = $2 order by created_at desc, id desc limit 101`,
			"event_log_project", []any{"prj_3", "org_3"}},
		{"page after cursor", `select * from event_log where project_id = $1 and org_id = $2 and (created_at, id) < ($3, $4) order by created_at desc, id desc limit 101`,
			"event_log_project", []any{"prj_3", "org_3", time.Now().Add(-time.Hour), "evt_x"}},
		{"page of a type", `select * from event_log where project_id = $1 and org_id = $2 and type = $3 order by created_at desc, id desc limit 101`,
			"event_log_project_type", []any{"prj_3", "org_3", "type.t0"}},
		{"count", `select count(*) from event_log where project_id = $1 and org_id = $2`,
			"Index Only Scan using event_log_project", []any{"prj_3", "org_3"}},
		{"count of a type", `select count(*) from event_log where project_id = $1 and org_id = $2 and type = $3`,
			"Index Only Scan using event_log_project_type", []any{"prj_3", "org_3", "type.t0"}},
		{"operator page", `select * from event_log where project_id = $1 order by created_at desc, id desc limit 101`,
			"event_log_project", []any{"prj_3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var plan strings.Builder
			rows, err := pool.Query(ctx, "explain "+tt.sql, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				plan.WriteString(line + "\n")
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(plan.String(), tt.index) || strings.Contains(plan.String(), "Seq Scan") || strings.Contains(plan.String(), "Sort") {
				t.Errorf("plan does not walk %s in order:\n%s", tt.index, plan.String())
			}
		})
	}
}

// TestTimeIndexesFillTheirPages: rows stored in time order, as the writers store them, leave
// the time-ordered indexes of the event log, the audit log and the webhook deliveries mostly
// full (schemas/postgres/0048). Led by (group, time desc), each new entry went to the left of
// its page and every full page split in half, so those indexes stayed half full: twice the
// pages, page splits and WAL. The rows are one project's events of one type, the audit of one
// organization and one subscription's deliveries: a b-tree fills the pages of the group that
// sorts last (the embedded default's single organization); a busy group among many fills its
// pages only when its entries are of one size and no wider than two int8s (nbtsplitloc.c).
func TestTimeIndexesFillTheirPages(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "create extension if not exists pgstattuple"); err != nil {
		t.Fatal(err)
	}
	log := postgres.NewEventLog(pool)
	start := time.Now().UTC().Add(-time.Hour)
	for b := range 20 {
		evs := benchEvents(1000, func(int) string { return "prj_1" }, func(j int) time.Time { return start.Add(time.Duration(b*1000+j) * time.Millisecond) })
		for i := range evs {
			evs[i].Type = benchTypes[0]
		}
		if err := log.AppendEvents(ctx, evs); err != nil {
			t.Fatal(err)
		}
	}
	for b := range 20 {
		if _, err := pool.Exec(ctx, `
insert into audit_log (id, time, org_id, key_id, mode, client_ip, user_agent, operation, outcome, status, latency_ms)
select 'req_' || lpad(i::text, 26, '0'), $2::timestamptz + i * interval '1 millisecond', 'org_1', 'key_1', 'live',
       '127.0.0.1', 'test', 'query events', 'ok', 200, 1
from generate_series($1::int * 1000, $1::int * 1000 + 999) as i`, b, start); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `
insert into webhook_deliveries (id, org_id, webhook_id, event_id, event_type, event_created_at, body, status, created_at)
select 'dlv_' || lpad(i::text, 26, '0'), 'org_1', 'wh_1', 'evt_' || lpad(i::text, 26, '0'), 'asset.installed',
       $2::timestamptz + i * interval '1 millisecond', '{}', 'succeeded', $2::timestamptz + i * interval '1 millisecond'
from generate_series($1::int * 1000, $1::int * 1000 + 999) as i`, b, start); err != nil {
			t.Fatal(err)
		}
	}
	for _, index := range []string{"event_log_project", "event_log_project_type", "event_log_deployment",
		"audit_log_time", "audit_log_org_time", "audit_log_key_time", "audit_log_operation_time",
		"webhook_deliveries_webhook"} {
		var density float64
		if err := pool.QueryRow(ctx, "select avg_leaf_density from pgstatindex($1)", index).Scan(&density); err != nil {
			t.Fatal(err)
		}
		if density < 80 {
			t.Errorf("%s: leaf pages %.1f %% full, want at least 80 %%", index, density)
		}
	}
}

// TestAppendEventsCopyConflicts: a batch large enough to be copied straight into the log, that
// holds an event stored before and an id twice, still stores every new event once and leaves
// the stored one as it was (the direct COPY fails on the conflict; the staged insert skips it).
func TestAppendEventsCopyConflicts(t *testing.T) {
	pool := pgtest.New(t)
	log := postgres.NewEventLog(pool)
	ctx := context.Background()
	now := time.Now().UTC()
	evs := benchEvents(postgres.CopyThreshold+10, func(int) string { return "prj_1" }, func(j int) time.Time { return now.Add(time.Duration(j) * time.Millisecond) })
	first := evs[500]
	if err := log.AppendEvents(ctx, []events.Event{first}); err != nil {
		t.Fatal(err)
	}
	evs[500].Payload = json.RawMessage(`{"changed":true}`)
	evs = append(evs, evs[7])
	if err := log.AppendEvents(ctx, evs); err != nil {
		t.Fatal(err)
	}
	var n, kept int
	if err := pool.QueryRow(ctx, `select count(*), count(*) filter (where id = $1 and payload = $2::jsonb) from event_log`,
		first.ID, string(first.Payload)).Scan(&n, &kept); err != nil {
		t.Fatal(err)
	}
	if n != postgres.CopyThreshold+10 || kept != 1 {
		t.Fatalf("%d events, stored one kept %d times; want %d and 1", n, kept, postgres.CopyThreshold+10)
	}
}

// TestAppendEventsCopyStoresEachEvent: the COPY paths (straight in, and staged when the batch
// holds a stored event) store each event's own fields, whatever order the batch is in, and an
// event without a payload as JSON null.
func TestAppendEventsCopyStoresEachEvent(t *testing.T) {
	pool := pgtest.New(t)
	log := postgres.NewEventLog(pool)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	evs := benchEvents(2*postgres.CopyThreshold, func(i int) string { return fmt.Sprintf("prj_%d", i%3) },
		func(j int) time.Time { return now.Add(time.Duration(j) * time.Millisecond) })
	for i := range evs {
		evs[i].Payload = json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))
	}
	evs[3].Payload = nil
	slices.Reverse(evs) // not in id order: COPY sorts by id
	straight, staged := evs[:postgres.CopyThreshold], evs[postgres.CopyThreshold-1:]
	for _, batch := range [][]events.Event{straight, staged} {
		if err := log.AppendEvents(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := pool.Query(ctx, `select id, org_id, project_id, type, payload::text, created_at from event_log`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]events.Event{}
	for rows.Next() {
		var ev events.Event
		var payload string
		if err := rows.Scan(&ev.ID, &ev.OrgID, &ev.ProjectID, &ev.Type, &payload, &ev.CreatedAt); err != nil {
			t.Fatal(err)
		}
		ev.Payload = json.RawMessage(payload)
		got[ev.ID] = ev
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(evs) {
		t.Fatalf("%d events stored, want %d", len(got), len(evs))
	}
	for _, want := range evs {
		g := got[want.ID]
		payload := string(want.Payload)
		if payload == "" {
			payload = "null"
		}
		if g.OrgID != want.OrgID || g.ProjectID != want.ProjectID || g.Type != want.Type || !g.CreatedAt.Equal(want.CreatedAt) ||
			strings.ReplaceAll(string(g.Payload), " ", "") != payload {
			t.Fatalf("stored %+v (payload %s), want %+v (payload %s)", g, g.Payload, want, payload)
		}
	}
}

// TestAppendEventsDeferred: deferred appends store what AppendEvents stores (small batches,
// copied ones, copied ones holding an event stored before), visible at once, with marks that
// grow and that Durable reaches. Below DeferFrom they wait for their commit.
func TestAppendEventsDeferred(t *testing.T) {
	pool := pgtest.New(t)
	log := postgres.NewEventLog(pool)
	log.DeferFrom = 1
	ctx := context.Background()
	now := time.Now().UTC()
	evs := benchEvents(2*postgres.CopyThreshold+20, func(int) string { return "prj_1" }, func(j int) time.Time { return now.Add(time.Duration(j) * time.Millisecond) })

	// A log's first deferred append waits for its commit: the zero mark.
	if mark, err := log.AppendEventsDeferred(ctx, evs[:10]); err != nil || mark != (storage.DurableMark{}) {
		t.Fatalf("first deferred append: mark %+v, %v; want the zero mark", mark, err)
	}
	var last storage.DurableMark
	for _, batch := range [][]events.Event{
		evs[10:20],                          // unnest
		evs[20 : 20+postgres.CopyThreshold], // COPY straight in
		evs[15 : 30+postgres.CopyThreshold], // COPY fails on the stored ones: staged
		evs[30+postgres.CopyThreshold:],     // unnest again
	} {
		mark, err := log.AppendEventsDeferred(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		if mark.Epoch == 0 || last != (storage.DurableMark{}) && (mark.Epoch != last.Epoch || mark.Pos <= last.Pos) {
			t.Fatalf("deferred append's mark %+v, want the epoch of the previous %+v and a later position", mark, last)
		}
		last = mark
	}
	var n int
	if err := pool.QueryRow(ctx, `select count(distinct id) from event_log`).Scan(&n); err != nil || n != len(evs) {
		t.Fatalf("%d events stored (%v), want %d", n, err, len(evs))
	}
	testenv.Eventually(t, 30*time.Second, "the WAL flush to pass the last append", func() bool {
		now, err := log.Durable(ctx)
		durable, lost := last.Within(now)
		return err == nil && durable && !lost
	})
	more := benchEvents(postgres.CopyThreshold, func(int) string { return "prj_2" }, func(int) time.Time { return now })
	if mark, err := log.AppendEventsDeferred(ctx, nil); err != nil || mark != (storage.DurableMark{}) {
		t.Fatalf("empty deferred append: mark %+v, %v; want the zero mark", mark, err)
	}

	// By default, batches below the COPY threshold wait.
	def := postgres.NewEventLog(pool)
	if _, err := def.AppendEventsDeferred(ctx, more); err != nil { // the first deferred one waits
		t.Fatal(err)
	}
	small := benchEvents(10, func(int) string { return "prj_2" }, func(int) time.Time { return now })
	if mark, err := def.AppendEventsDeferred(ctx, small); err != nil || mark != (storage.DurableMark{}) {
		t.Fatalf("deferred append of %d events: mark %+v, %v; want the zero mark (DeferFrom %d)", len(small), mark, err, def.DeferFrom)
	}
}
