package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/internal/testenv"
	"carehub/storage/outbox"
	"carehub/storage/postgres/pgtest"
)

// lineUp holds the outbox locked so that the group's first transaction waits, starts first and
// then the calls of rest (each in its own goroutine, in order), waits until they are all
// queued behind it, and releases the lock. It returns each call's result, first's at [0].
func lineUp(t *testing.T, pool *pgxpool.Pool, g *outbox.Group, first []outbox.Message, rest ...func() error) []error {
	t.Helper()
	release := holdFirst(t, pool, g, first)
	results := []chan error{release.first}
	for i, call := range rest {
		results = append(results, async(call))
		waitUntil(t, fmt.Sprintf("call %d queued", i+1), func() bool { return g.Queued() == i+1 })
	}
	release.unlock()
	out := make([]error, len(results))
	for i, r := range results {
		out[i] = <-r
	}
	return out
}

type held struct {
	first  chan error // the first call's result
	unlock func()
}

// holdFirst locks the outbox, starts a call of first on g and waits until its transaction waits
// for the lock: calls made until unlock queue behind it.
func holdFirst(t *testing.T, pool *pgxpool.Pool, g *outbox.Group, first []outbox.Message) held {
	t.Helper()
	ctx := context.Background()
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Rollback(ctx) })
	if _, err := lock.Exec(ctx, `lock table outbox in exclusive mode`); err != nil {
		t.Fatal(err)
	}
	h := held{first: async(func() error { return g.Append(ctx, first...) }), unlock: func() {
		if err := lock.Rollback(ctx); err != nil {
			t.Error(err)
		}
	}}
	waitUntil(t, "the first transaction waits for the lock", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `select count(*) from pg_stat_activity where wait_event_type = 'Lock' and query like '%insert into outbox%'`).Scan(&n)
		return n == 1
	})
	return h
}

func async(f func() error) chan error {
	c := make(chan error, 1)
	go func() { c <- f() }()
	return c
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, what, cond)
}

func msg(id string) outbox.Message {
	return outbox.Message{ID: id, Topic: "carehub.events.v1", Key: "prj_1", Value: []byte(`{"id":"` + id + `"}`)}
}

// transactions returns the ids of the outbox rows by the transaction that wrote them, in seq
// order of the transactions' first rows.
func transactions(t *testing.T, pool *pgxpool.Pool) [][]string {
	t.Helper()
	rows, _ := pool.Query(context.Background(), `select array_agg(event_id order by seq) from outbox
group by xmin::text order by min(seq)`)
	got, err := pgx.CollectRows(rows, pgx.RowTo[[]string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestGroupCommitsConcurrentCallsTogether: calls that arrive while a transaction commits are
// written by the next one, together, and each returns once it committed.
func TestGroupCommitsConcurrentCallsTogether(t *testing.T) {
	pool := pgtest.New(t)
	g := outbox.NewGroup(pool, outbox.GroupConfig{Transactions: 1})
	ctx := context.Background()
	var calls []func() error
	for i := range 5 {
		calls = append(calls, func() error { return g.Append(ctx, msg(fmt.Sprintf("evt_%d_a", i)), msg(fmt.Sprintf("evt_%d_b", i))) })
	}
	for i, err := range lineUp(t, pool, g, []outbox.Message{msg("evt_first")}, calls...) {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	got := transactions(t, pool)
	want := [][]string{{"evt_first"}, {"evt_0_a", "evt_0_b", "evt_1_a", "evt_1_b", "evt_2_a", "evt_2_b", "evt_3_a", "evt_3_b", "evt_4_a", "evt_4_b"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("transactions %v; want %v", got, want)
	}
}

// TestGroupCallFailsAlone: a call that cannot be written (an id already in the outbox) fails
// with none of its messages written; the calls grouped with it commit.
func TestGroupCallFailsAlone(t *testing.T) {
	pool := pgtest.New(t)
	g := outbox.NewGroup(pool, outbox.GroupConfig{Transactions: 1})
	ctx := context.Background()
	if err := g.Append(ctx, msg("evt_taken")); err != nil {
		t.Fatal(err)
	}
	errs := lineUp(t, pool, g, []outbox.Message{msg("evt_first")},
		func() error { return g.Append(ctx, msg("evt_a")) },
		func() error { return g.Append(ctx, msg("evt_b1"), msg("evt_taken")) },
		func() error { return g.Append(ctx, msg("evt_c")) })
	var pg *pgconn.PgError
	if errs[0] != nil || errs[1] != nil || errs[3] != nil || !errors.As(errs[2], &pg) || pg.Code != "23505" {
		t.Fatalf("results %v; want only call 2 to fail with unique_violation", errs)
	}
	var ids []string
	rows, _ := pool.Query(ctx, `select event_id from outbox order by event_id`)
	if ids, _ = pgx.CollectRows(rows, pgx.RowTo[string]); fmt.Sprint(ids) != "[evt_a evt_c evt_first evt_taken]" {
		t.Fatalf("outbox holds %v", ids)
	}
}

// TestGroupCallCancelledWhileQueued: a call whose context ends before a transaction took it
// returns the context's error and writes nothing; the others are not held up.
func TestGroupCallCancelledWhileQueued(t *testing.T) {
	pool := pgtest.New(t)
	g := outbox.NewGroup(pool, outbox.GroupConfig{Transactions: 1})
	ctx := context.Background()
	h := holdFirst(t, pool, g, []outbox.Message{msg("evt_first")})
	a := async(func() error { return g.Append(ctx, msg("evt_a")) })
	waitUntil(t, "a queued", func() bool { return g.Queued() == 1 })
	cctx, cancel := context.WithCancel(ctx)
	cancelled := async(func() error { return g.Append(cctx, msg("evt_cancelled")) })
	waitUntil(t, "the call to cancel queued", func() bool { return g.Queued() == 2 })
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	c := async(func() error { return g.Append(ctx, msg("evt_c")) })
	waitUntil(t, "c queued", func() bool { return g.Queued() == 2 })
	h.unlock()
	for _, r := range []chan error{h.first, a, c} {
		if err := <-r; err != nil {
			t.Fatal(err)
		}
	}
	if got := transactions(t, pool); fmt.Sprint(got) != "[[evt_first] [evt_a evt_c]]" {
		t.Fatalf("transactions %v", got)
	}
}
