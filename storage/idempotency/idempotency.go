package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/fault"
)

// Errors of Claim and Tx. All are CONFLICT (409): the request did not run, or stopped.
var (
	// ErrMismatch: the key was used in the last 24 hours for another request.
	ErrMismatch = &fault.Error{Kind: fault.KindConflict,
		Message: "this Idempotency-Key was used in the last 24 hours with a different request (method, path or body) or by a credential with other scopes or mode; use a new key for a new request"}
	// ErrInProgress: a request with the key is running (or died less than a lease ago).
	ErrInProgress = &fault.Error{Kind: fault.KindConflict,
		Message: "a request with this Idempotency-Key is in progress; retry after it has finished"}
	// ErrClaimLost: this request outlived its lease and a retry took its claim over.
	ErrClaimLost = &fault.Error{Kind: fault.KindConflict,
		Message: "a retry with this Idempotency-Key took over while this request was stalled; its answer is the retry's"}
	// ErrUnreadable: what was recorded for the key does not open under this node's sealing key:
	// it was sealed before the server key was part of the seal, or under another node's key
	// (nodes must share one). The request is not run again, as its effect may have happened.
	ErrUnreadable = &fault.Error{Kind: fault.KindConflict,
		Message: "what was recorded for this Idempotency-Key cannot be read by this server (sealed before an upgrade or under another sealing key); check whether the first request took effect, then use a new key"}
	// ErrDiverged: a retry reached a step that its first attempt had recorded as something else.
	ErrDiverged = &fault.Error{Kind: fault.KindConflict,
		Message: "the retry with this Idempotency-Key took another path than its first attempt; use a new key"}
)

// Claim is a running request's hold on its key. It is safe for concurrent use.
type Claim struct {
	store *Store
	scope Scope
	keys  keys
	owner string

	next     atomic.Int32 // the number of the next step
	inStep   atomic.Bool  // a step's transaction is open
	replayed atomic.Bool  // a step returned a recorded result

	stop     context.CancelFunc // ends the lease renewal
	renewing sync.WaitGroup
	endOnce  sync.Once
}

type claimKey struct{}

// With returns ctx carrying c: the transactions Tx runs under it are c's steps.
func With(ctx context.Context, c *Claim) context.Context {
	return context.WithValue(ctx, claimKey{}, c)
}

// From returns the claim in ctx, or nil.
func From(ctx context.Context) *Claim {
	c, _ := ctx.Value(claimKey{}).(*Claim)
	return c
}

// Replayed reports whether a step of the request returned a recorded result instead of running:
// its answer repeats an effect that an earlier attempt committed.
func (c *Claim) Replayed() bool { return c.replayed.Load() }

// Tx runs fn in a transaction on db, as pgx.BeginFunc does, and is how services write their
// effects. out points at what fn produces for the caller (the row it created, a count…), or is
// nil when fn produces nothing.
//
// Under a claim (ctx carries one), the transaction is the request's next step. It locks the
// claim's row, and when the step has not committed before, runs fn and writes *out, sealed, as
// the step's result in the same transaction: the effect and its record commit together. When an
// earlier attempt of the request committed this step (it died before answering), fn does not
// run and *out is set to the recorded result. A claim lost to a retry (this request outlived its
// lease) is ErrClaimLost, before fn runs.
//
// Steps are numbered in the order the request runs them, so a request must run its steps in the
// same order when it runs again (GraphQL runs a document's mutations one after another); a
// step whose transaction failed keeps its number and runs again on retry. *out must be
// encodable by encoding/gob: exported fields, no interfaces. A Tx inside another Tx's fn runs
// outside the claim (the outer step holds the row).
func Tx(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, out any, fn func(pgx.Tx) error) error {
	c := From(ctx)
	if c == nil || !c.inStep.CompareAndSwap(false, true) {
		return pgx.BeginFunc(ctx, db, fn)
	}
	defer c.inStep.Store(false)
	n := int(c.next.Add(1) - 1)
	replayed := false
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var found bool
		err := tx.QueryRow(ctx, `select true from idempotency_keys
where org_id = $1 and key_id = $2 and key_hash = $3 and owner = $4 for update`,
			c.scope.OrgID, c.scope.KeyID, c.keys.lookup, c.owner).Scan(&found)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrClaimLost
		}
		if err != nil {
			return fmt.Errorf("lock idempotency claim: %w", err)
		}
		var sealed []byte
		err = tx.QueryRow(ctx, `select result from idempotency_steps
where org_id = $1 and key_id = $2 and key_hash = $3 and step = $4`,
			c.scope.OrgID, c.scope.KeyID, c.keys.lookup, n).Scan(&sealed)
		switch {
		case err == nil:
			replayed = true
			return c.restore(sealed, n, out)
		case !errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("read idempotency step: %w", err)
		}
		if err := fn(tx); err != nil {
			return err
		}
		sealed, err = c.record(n, out)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `insert into idempotency_steps (org_id, key_id, key_hash, step, result)
values ($1, $2, $3, $4, $5)`, c.scope.OrgID, c.scope.KeyID, c.keys.lookup, n, sealed)
		if err != nil {
			return fmt.Errorf("record idempotency step: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if replayed {
		c.replayed.Store(true)
	} else {
		afterStep()
	}
	return nil
}

func stepAD(n int) string { return fmt.Sprintf("step %d", n) }

func (c *Claim) record(n int, out any) ([]byte, error) {
	var plain []byte
	if out != nil {
		var err error
		if plain, err = encode(out); err != nil {
			return nil, err
		}
	}
	return c.keys.seal(plain, stepAD(n)), nil
}

func (c *Claim) restore(sealed []byte, n int, out any) error {
	plain, err := c.keys.open(sealed, stepAD(n))
	if err != nil {
		return err
	}
	switch {
	case out == nil && len(plain) == 0:
		return nil
	case out == nil || len(plain) == 0:
		return fmt.Errorf("%w: step %d recorded %d bytes for a %s", ErrDiverged, n, len(plain), typeName(out))
	}
	return decode(plain, out)
}
