package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/storage/idempotency"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// thing is what the test's steps create: a row of table things, returned to the caller.
type thing struct {
	ID       string
	OrgID    string `json:"-"` // kept although JSON would drop it
	Tags     []string
	Note     *string
	Raw      []byte // nil stays nil
	Created  time.Time
	Children []child
}

type child struct{ Names []string }

type env struct {
	t     *testing.T
	pool  *pgxpool.Pool
	store *idempotency.Store
	ctx   context.Context
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	if _, err := pool.Exec(ctx, `create table things (id text primary key)`); err != nil {
		t.Fatal(err)
	}
	return &env{t: t, pool: pool, store: idempotency.NewStore(pool, idempotency.Config{}), ctx: ctx}
}

var (
	scopeA = idempotency.Scope{OrgID: "org_a", KeyID: "key_a"}
	scopeB = idempotency.Scope{OrgID: "org_b", KeyID: "key_b"}
	hash1  = bytes.Repeat([]byte{1}, 32)
	hash2  = bytes.Repeat([]byte{2}, 32)
)

// claim must claim key for a run.
func (e *env) claim(scope idempotency.Scope, key string, hash []byte) *idempotency.Claim {
	e.t.Helper()
	c, a, err := e.store.Claim(e.ctx, scope, key, hash)
	if err != nil || c == nil || a != nil {
		e.t.Fatalf("claim %s: claim %v, answer %v, err %v", key, c, a, err)
	}
	return c
}

// create is a service's effect: a row of things, as a step of the claim in ctx.
func (e *env) create(ctx context.Context, id string) (*thing, error) {
	note := "n"
	var out *thing
	err := idempotency.Tx(ctx, e.pool, &out, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `insert into things (id) values ($1)`, id); err != nil {
			return err
		}
		out = &thing{ID: id, OrgID: "org_a", Tags: []string{}, Note: &note, Created: time.Now().UTC(),
			Children: []child{{Names: []string{}}}}
		return nil
	})
	return out, err
}

func (e *env) count() int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.ctx, `select count(*) from things`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// abandon makes the claim's request look dead: its lease has run out, as when its node was
// killed after a step committed.
func (e *env) abandon() {
	e.t.Helper()
	if _, err := e.pool.Exec(e.ctx, `update idempotency_keys set locked_until = now() - interval '1 second'`); err != nil {
		e.t.Fatal(err)
	}
}

// A retry of a request whose node died after its step committed does not run the step again:
// it gets the step's recorded result, and goes on from there.
func TestRetryAfterCrashReplaysCommittedSteps(t *testing.T) {
	e := newEnv(t)
	first := e.claim(scopeA, "k1", hash1)
	made, err := e.create(idempotency.With(e.ctx, first), "thing_1")
	if err != nil {
		t.Fatal(err)
	}
	// The node dies here: no answer recorded, the lease is not renewed.
	e.abandon()

	if _, _, err := e.store.Claim(e.ctx, scopeA, "k1", hash2); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("another request with the key: %v, want ErrMismatch", err)
	}
	retry := e.claim(scopeA, "k1", hash1)
	again, err := e.create(idempotency.With(e.ctx, retry), "thing_2")
	if err != nil {
		t.Fatal(err)
	}
	if n := e.count(); n != 1 {
		t.Fatalf("%d things after the retry, want 1", n)
	}
	if !retry.Replayed() {
		t.Error("Replayed() is false after a replayed step")
	}
	if again.ID != made.ID || again.OrgID != made.OrgID || !again.Created.Equal(made.Created) || *again.Note != "n" {
		t.Errorf("replayed %+v, want %+v", again, made)
	}
	if again.Tags == nil || again.Children[0].Names == nil || again.Raw != nil {
		t.Errorf("replayed slices: tags %#v, names %#v, raw %#v: empty slices come back empty, nil bytes nil",
			again.Tags, again.Children[0].Names, again.Raw)
	}
	// The retry's second step is new: it runs.
	if _, err := e.create(idempotency.With(e.ctx, retry), "thing_3"); err != nil || e.count() != 2 {
		t.Fatalf("a step the first attempt did not reach: err %v, %d things, want 2", err, e.count())
	}
}

// A request that outlived its lease, and whose claim a retry took over, cannot commit an
// effect any more.
func TestStalledRequestIsFenced(t *testing.T) {
	e := newEnv(t)
	stalled := e.claim(scopeA, "k1", hash1)
	e.abandon()
	e.claim(scopeA, "k1", hash1)
	if _, err := e.create(idempotency.With(e.ctx, stalled), "thing_1"); !errors.Is(err, idempotency.ErrClaimLost) {
		t.Fatalf("step of the stalled request: %v, want ErrClaimLost", err)
	}
	if n := e.count(); n != 0 {
		t.Fatalf("%d things, want 0", n)
	}
}

func TestAnswersReplayAndConflict(t *testing.T) {
	e := newEnv(t)
	c := e.claim(scopeA, "k1", hash1)
	if _, _, err := e.store.Claim(e.ctx, scopeA, "k1", hash1); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("while running: %v, want ErrInProgress", err)
	}
	if _, _, err := e.store.Claim(e.ctx, scopeA, "k1", hash2); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("another body while running: %v, want ErrMismatch", err)
	}
	// Another credential's key of the same name is another key.
	other := e.claim(scopeB, "k1", hash1)
	if err := other.Release(e.ctx); err != nil {
		t.Fatal(err)
	}
	want := idempotency.Answer{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"secret":"whsec_abc"}`), Patients: []string{"pat_1"}, Resources: []string{"pat_1", "wh_1"}}
	if err := c.Complete(e.ctx, want); err != nil {
		t.Fatal(err)
	}
	_, got, err := e.store.Claim(e.ctx, scopeA, "k1", hash1)
	if err != nil || got == nil {
		t.Fatalf("replay: %v, %v", got, err)
	}
	if got.Status != want.Status || !bytes.Equal(got.Body, want.Body) || got.Header.Get("Content-Type") != "application/json" ||
		strings.Join(got.Patients, ",") != "pat_1" || strings.Join(got.Resources, ",") != "pat_1,wh_1" {
		t.Errorf("replayed %+v, want %+v", got, want)
	}
	if _, _, err := e.store.Claim(e.ctx, scopeA, "k1", hash2); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("another body after the answer: %v, want ErrMismatch", err)
	}
	if _, _, err := e.store.Claim(e.ctx, scopeB, "k1", hash1); err != nil {
		t.Fatalf("the other credential's key: %v", err)
	}
	// Neither the key nor the answer is readable in the table.
	var rows [][]byte
	r, _ := e.pool.Query(e.ctx, `select convert_to(k::text, 'UTF8') from idempotency_keys k`)
	rows, err = pgx.CollectRows(r, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range rows {
		if bytes.Contains(row, []byte("whsec_abc")) || bytes.Contains(row, []byte(`\x6b31`)) || bytes.Contains(row, []byte("pat_1")) {
			t.Errorf("row holds the answer, the key or a patient id in the clear: %s", row)
		}
	}
}

// A reservation (a streamed request, whose hash is known when it has run) holds its key as a
// claim does, and its answer replays to the same request only; a dead one is taken over.
func TestReserve(t *testing.T) {
	e := newEnv(t)
	c, prior, err := e.store.Reserve(e.ctx, scopeA, "k1")
	if err != nil || c == nil || prior != nil {
		t.Fatalf("reserve: %v %v %v", c, prior, err)
	}
	if _, _, err := e.store.Reserve(e.ctx, scopeA, "k1"); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("reserve while running: %v, want ErrInProgress", err)
	}
	if _, _, err := e.store.Claim(e.ctx, scopeA, "k1", hash1); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("claim while reserved: %v, want ErrInProgress", err)
	}
	if err := c.CompleteFor(e.ctx, hash1, idempotency.Answer{Status: 202, Body: []byte(`{"accepted":1}`)}); err != nil {
		t.Fatal(err)
	}
	_, prior, err = e.store.Reserve(e.ctx, scopeA, "k1")
	if err != nil || prior == nil {
		t.Fatalf("reserve after the answer: %v %v", prior, err)
	}
	if a, err := prior.Answer(hash1); err != nil || a.Status != 202 || string(a.Body) != `{"accepted":1}` {
		t.Fatalf("replay: %+v %v", a, err)
	}
	if _, err := prior.Answer(hash2); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("another body: %v, want ErrMismatch", err)
	}
	// The hash is the grant's too: a credential with other scopes gets no answer.
	narrower := scopeA
	narrower.Grant = "live read:patients"
	if _, prior, err := e.store.Reserve(e.ctx, narrower, "k1"); err != nil || prior == nil {
		t.Fatalf("reserve under another grant: %v %v", prior, err)
	} else if _, err := prior.Answer(hash1); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("another grant: %v, want ErrMismatch", err)
	}
	// A key claimed with its hash up front answers a reservation the same way.
	if _, a, err := e.store.Claim(e.ctx, scopeA, "k1", hash1); err != nil || a == nil || a.Status != 202 {
		t.Fatalf("claim of a reserved key's answer: %+v %v", a, err)
	}
	// A reservation whose request died is taken over once its lease has run out; a released one
	// is forgotten.
	dead, _, err := e.store.Reserve(e.ctx, scopeA, "k2")
	if err != nil || dead == nil {
		t.Fatal(err)
	}
	e.abandon()
	if c, _, err := e.store.Reserve(e.ctx, scopeA, "k2"); err != nil || c == nil {
		t.Fatalf("take over a dead reservation: %v %v", c, err)
	} else if err := c.Release(e.ctx); err != nil {
		t.Fatal(err)
	}
	dead.Release(e.ctx) // lost to the retry: ends its lease renewal, changes nothing
	var n int
	if err := e.pool.QueryRow(e.ctx, `select count(*) from idempotency_keys where request_hash is null`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d reservations left, want 0 (%v)", n, err)
	}
}

// A failed request (5xx) releases its key: without a committed step the key is forgotten, with
// one the retry resumes after it.
func TestRelease(t *testing.T) {
	e := newEnv(t)
	c := e.claim(scopeA, "k1", hash1)
	if err := c.Release(e.ctx); err != nil {
		t.Fatal(err)
	}
	c = e.claim(scopeA, "k1", hash2) // forgotten: any request may use it
	if _, err := e.create(idempotency.With(e.ctx, c), "thing_1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(e.ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.store.Claim(e.ctx, scopeA, "k1", hash1); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("another request after a released step: %v, want ErrMismatch", err)
	}
	c = e.claim(scopeA, "k1", hash2)
	if _, err := e.create(idempotency.With(e.ctx, c), "thing_2"); err != nil || e.count() != 1 || !c.Replayed() {
		t.Fatalf("retry after release: err %v, %d things, replayed %v; want the step replayed", err, e.count(), c.Replayed())
	}
}

// A step whose transaction failed keeps its number: the retry runs it, and a later step of
// the first attempt stays the later step.
func TestFailedStepRunsAgain(t *testing.T) {
	e := newEnv(t)
	c := e.claim(scopeA, "k1", hash1)
	ctx := idempotency.With(e.ctx, c)
	boom := errors.New("boom")
	if err := idempotency.Tx(ctx, e.pool, nil, func(pgx.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if _, err := e.create(ctx, "thing_1"); err != nil {
		t.Fatal(err)
	}
	e.abandon()
	c = e.claim(scopeA, "k1", hash1)
	ctx = idempotency.With(e.ctx, c)
	ran := false
	if err := idempotency.Tx(ctx, e.pool, nil, func(pgx.Tx) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("the failed step on retry: ran %v, err %v", ran, err)
	}
	if got, err := e.create(ctx, "thing_2"); err != nil || got.ID != "thing_1" || e.count() != 1 {
		t.Fatalf("the committed step on retry: %+v, %v, %d things", got, err, e.count())
	}
}

// A retry whose step returns another type than the recorded one has diverged.
func TestDivergedRetry(t *testing.T) {
	e := newEnv(t)
	c := e.claim(scopeA, "k1", hash1)
	if _, err := e.create(idempotency.With(e.ctx, c), "thing_1"); err != nil {
		t.Fatal(err)
	}
	e.abandon()
	c = e.claim(scopeA, "k1", hash1)
	var n int64
	err := idempotency.Tx(idempotency.With(e.ctx, c), e.pool, &n, func(pgx.Tx) error { return nil })
	if !errors.Is(err, idempotency.ErrDiverged) {
		t.Fatalf("step of another type: %v, want ErrDiverged", err)
	}
}

// Keys expire after 24 hours: the key is free again, and the sweep deletes it.
func TestExpiry(t *testing.T) {
	e := newEnv(t)
	c := e.claim(scopeA, "k1", hash1)
	if _, err := e.create(idempotency.With(e.ctx, c), "thing_1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(e.ctx, idempotency.Answer{Status: 200}); err != nil {
		t.Fatal(err)
	}
	if n, err := e.store.Sweep(e.ctx); err != nil || n != 0 {
		t.Fatalf("sweep of a fresh key: %d, %v", n, err)
	}
	if _, err := e.pool.Exec(e.ctx, `update idempotency_keys set created_at = now() - interval '24 hours 1 minute'`); err != nil {
		t.Fatal(err)
	}
	c = e.claim(scopeA, "k1", hash2) // expired: free for any request
	if _, err := e.create(idempotency.With(e.ctx, c), "thing_2"); err != nil || e.count() != 2 {
		t.Fatalf("a new request with an expired key: err %v, %d things, want 2", err, e.count())
	}
	if err := c.Complete(e.ctx, idempotency.Answer{Status: 200}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(e.ctx, `update idempotency_keys set created_at = now() - interval '25 hours'`); err != nil {
		t.Fatal(err)
	}
	if n, err := e.store.Sweep(e.ctx); err != nil || n != 1 {
		t.Fatalf("sweep: %d, %v; want 1", n, err)
	}
}

func TestValidKey(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want bool
	}{
		{"a", true},
		{"3f1c2a0e-8f5b-4c1e-9d59-2b8f4c1e9d59", true},
		{strings.Repeat("k", 255), true},
		{"", false},
		{strings.Repeat("k", 256), false},
		{"with space", false},
		{"tab\there", false},
		{"nul\x00", false},
		{"clé", false},
		{"del\x7f", false},
	} {
		if got := idempotency.ValidKey(tc.key); got != tc.want {
			t.Errorf("ValidKey(%q) = %v, want %v", tc.key, got, tc.want)
		}
	}
}
