package fhirsubs

import (
	"testing"
	"time"

	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The sweep deletes old events nothing needs: a rest-hook receiver's taken ones, a websocket
// subscription's, a deleted subscription's; it keeps what a receiver has not taken, however old,
// and whatever is younger than the retention.
func TestSweep(t *testing.T) {
	pool := pgtest.New(t)
	ctx := t.Context()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`insert into organizations (id, name, slug, type, plan) values ('org_s', 'S', 's', 'clinic', 'growth')`)
	for _, sub := range []struct{ id, channel, deleted string }{{"sub_hook", "rest-hook", ""}, {"sub_ws", "websocket", ""}, {"sub_gone", "rest-hook", "now()"}} {
		exec(`insert into fhir_subscriptions (id, org_id, key_id, mode, scopes, topic, channel, content, status, delivered_through, deleted_at)
values ($1, 'org_s', 'key_x', 'live', '{}', 'observation-created', $2, 'id-only', 'active', 2, `+map[string]string{"": "null", "now()": "now()"}[sub.deleted]+`)`,
			sub.id, sub.channel)
		// Events 1-4: 1-3 two days old, 4 new.
		for n := 1; n <= 4; n++ {
			at := time.Now().Add(-48 * time.Hour)
			if n == 4 {
				at = time.Now()
			}
			exec(`insert into fhir_subscription_events (subscription_id, number, event_id, focus_type, focus_id, patient_id, occurred_at)
values ($1, $2::bigint, 'evt_' || $1 || $2::bigint, 'Observation', 'obs_x', 'pat_x', $3)`, sub.id, n, at)
		}
	}
	svc := New(pool, Config{})
	n, err := svc.Sweep(ctx, EventRetention)
	if err != nil {
		t.Fatal(err)
	}
	rows, _ := pool.Query(ctx, `select subscription_id || '/' || number from fhir_subscription_events order by 1`)
	var left []string
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		left = append(left, s)
	}
	// The rest-hook subscription keeps 3 (old, not taken) and 4 (new); the others keep 4 only.
	want := []string{"sub_gone/4", "sub_hook/3", "sub_hook/4", "sub_ws/4"}
	if n != 8 || len(left) != len(want) {
		t.Fatalf("swept %d, left %v, want 8 swept and %v left", n, left, want)
	}
	for i := range want {
		if left[i] != want[i] {
			t.Fatalf("left %v, want %v", left, want)
		}
	}
}
