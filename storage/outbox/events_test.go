package outbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/events"
	"carehub/storage/outbox"
	"carehub/storage/postgres/pgtest"
)

func mustNew(t *testing.T, project string, n int) events.Event {
	t.Helper()
	ev, err := events.New("workflow.completed", "org_1", project, events.SourceWorkflow, events.SeverityInfo,
		map[string]any{"workflowId": "wf_1", "runId": "run_1", "status": "COMPLETED", "durationMs": n})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func TestAppendEvents(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()

	// A session listening on the channel sees the notification only after commit.
	listener, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(ctx, "listen "+outbox.Channel); err != nil {
		t.Fatal(err)
	}
	notified := func(wait time.Duration) bool {
		wctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		_, err := listener.Conn().WaitForNotification(wctx)
		return err == nil
	}

	evs := []events.Event{mustNew(t, "prj_b", 1), mustNew(t, "prj_a", 2), mustNew(t, "prj_b", 3)}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.AppendEvents(ctx, tx, "carehub.events.v1", evs...); err != nil {
		t.Fatal(err)
	}
	if notified(200 * time.Millisecond) {
		t.Fatal("notified before commit")
	}
	var outside int
	if err := pool.QueryRow(ctx, "select count(*) from outbox").Scan(&outside); err != nil || outside != 0 {
		t.Fatalf("rows visible before commit: %d (%v)", outside, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !notified(5 * time.Second) {
		t.Fatal("no notification after commit")
	}

	rows, err := pool.Query(ctx, "select event_id, topic, key, value, sent_at is null from outbox order by seq")
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		id, topic, key string
		value          []byte
		unsent         bool
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.id, &x.topic, &x.key, &x.value, &x.unsent)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(evs) {
		t.Fatalf("%d outbox rows, want %d", len(got), len(evs))
	}
	for i, r := range got {
		ev := evs[i] // seq follows the order of the arguments
		if r.id != ev.ID || r.topic != "carehub.events.v1" || r.key != ev.ProjectID || !r.unsent {
			t.Errorf("row %d = %+v, want event %s keyed %s, unsent", i, r, ev.ID, ev.ProjectID)
		}
		back, err := events.Decode(r.value)
		if err != nil {
			t.Fatalf("row %d value is not an envelope: %v", i, err)
		}
		if back.ID != ev.ID || !back.CreatedAt.Equal(ev.CreatedAt) || back.Type != ev.Type || back.OrgID != ev.OrgID {
			t.Errorf("row %d value %+v, want %+v", i, back, ev)
		}
		var a, b any
		_ = json.Unmarshal(back.Payload, &a)
		_ = json.Unmarshal(ev.Payload, &b)
		if !jsonEqual(a, b) {
			t.Errorf("row %d payload %s, want %s", i, back.Payload, ev.Payload)
		}
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func TestAppendEventsRollbackAndInvalid(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	count := func() int {
		var n int
		if err := pool.QueryRow(ctx, "select count(*) from outbox").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Rolled back: no rows.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := outbox.AppendEvents(ctx, tx, "carehub.events.v1", mustNew(t, "prj_a", 1)); err != nil {
			return err
		}
		return context.Canceled // any error rolls back
	})
	if err == nil || count() != 0 {
		t.Fatalf("rolled-back append left %d rows (err %v)", count(), err)
	}

	// One invalid event: nothing of the call is written.
	bad := mustNew(t, "prj_a", 2)
	bad.Type = "Not A Type"
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.AppendEvents(ctx, tx, "carehub.events.v1", mustNew(t, "prj_a", 3), bad)
	})
	if err == nil || count() != 0 {
		t.Fatalf("append with an invalid event: err %v, %d rows", err, count())
	}

	// No topic, and no events.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := outbox.AppendEvents(ctx, tx, "carehub.events.v1"); err != nil {
			t.Errorf("append of nothing: %v", err)
		}
		return outbox.AppendEvents(ctx, tx, "", mustNew(t, "prj_a", 4))
	})
	if err == nil || count() != 0 {
		t.Fatalf("append without a topic: err %v, %d rows", err, count())
	}

	// The same event twice is refused (event_id is unique): ids come from New.
	ev := mustNew(t, "prj_a", 5)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.AppendEvents(ctx, tx, "carehub.events.v1", ev, ev)
	})
	if err == nil || count() != 0 {
		t.Fatalf("duplicate event: err %v, %d rows", err, count())
	}
}
