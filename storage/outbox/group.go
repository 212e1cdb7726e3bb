package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/config"
	"carehub/kernel/fault"
)

// Defaults of GroupConfig.
const (
	DefaultGroupTransactions = 2
	DefaultGroupMessages     = 5000
	groupTimeout             = 10 * time.Second
)

// GroupConfig configures a Group. The zero value is usable.
type GroupConfig struct {
	// Transactions is how many group transactions are in flight at once. Default
	// DefaultGroupTransactions.
	Transactions int
	// Messages bounds the messages of one group transaction; a call is never split. Default
	// DefaultGroupMessages.
	Messages int
}

func (c *GroupConfig) defaults() {
	config.Default(&c.Transactions, DefaultGroupTransactions)
	config.Default(&c.Messages, DefaultGroupMessages)
}

// Group appends the messages of concurrent callers that have nothing else to write to the
// outbox in shared transactions: group commit. A call's messages are appended by one statement
// with those of the calls waiting at the same time, and commit with them; each call returns
// once its transaction committed. Per call it is Append in a transaction of its own: all of a
// call's messages commit or none does. When a group's statement fails (a message id already in
// the outbox), each of its calls is tried again alone, so one call's failure is its own.
//
// A call waits for at most the transactions in flight (GroupConfig.Transactions): while one
// commits, the calls arriving meanwhile gather for the next. No goroutine runs between calls:
// a waiting caller leads the next transaction.
type Group struct {
	pool *pgxpool.Pool
	cfg  GroupConfig

	mu      sync.Mutex
	queue   []*groupCall
	leaders int // transactions in flight or about to be
}

type groupCall struct {
	msgs []Message
	done chan error    // the call's result, from the transaction that held it
	lead chan struct{} // the call was taken off the queue to lead the next transaction
}

// NewGroup returns a Group appending to pool's outbox.
func NewGroup(pool *pgxpool.Pool, cfg GroupConfig) *Group {
	cfg.defaults()
	return &Group{pool: pool, cfg: cfg}
}

// Append writes msgs to the outbox in a transaction shared with concurrent calls and returns
// when it committed (nil) or failed. A call whose ctx ends before a transaction took it writes
// nothing and returns ctx's error; once taken, the call waits for its transaction's outcome.
func (g *Group) Append(ctx context.Context, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	c := &groupCall{msgs: msgs, done: make(chan error, 1), lead: make(chan struct{}, 1)}
	g.mu.Lock()
	if g.leaders < g.cfg.Transactions {
		g.leaders++
		g.mu.Unlock()
		g.lead(ctx, c)
		return <-c.done
	}
	g.queue = append(g.queue, c)
	g.mu.Unlock()
	select {
	case err := <-c.done:
		return err
	case <-c.lead:
		g.lead(ctx, c)
		return <-c.done
	case <-ctx.Done():
	}
	g.mu.Lock()
	for i, q := range g.queue {
		if q == c {
			g.queue = append(g.queue[:i], g.queue[i+1:]...)
			g.mu.Unlock()
			return ctx.Err()
		}
	}
	g.mu.Unlock()
	select { // taken: by a transaction, or to lead one
	case err := <-c.done:
		return err
	case <-c.lead:
		g.lead(ctx, c)
		return <-c.done
	}
}

// lead runs one group transaction of first and the calls queued behind it, then hands the lead
// to the first call still queued, if any.
func (g *Group) lead(ctx context.Context, first *groupCall) {
	g.mu.Lock()
	calls, n := []*groupCall{first}, len(first.msgs)
	for len(g.queue) > 0 && n+len(g.queue[0].msgs) <= g.cfg.Messages {
		n += len(g.queue[0].msgs)
		calls = append(calls, g.queue[0])
		g.queue = g.queue[1:]
	}
	g.mu.Unlock()

	// The transaction is the calls', not the leader's: it runs to its end when the leader's
	// caller goes away.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), groupTimeout)
	defer cancel()
	g.commit(tctx, calls, n)

	g.mu.Lock()
	if len(g.queue) > 0 {
		next := g.queue[0]
		g.queue = g.queue[1:]
		next.lead <- struct{}{}
	} else {
		g.leaders--
	}
	g.mu.Unlock()
}

// commit appends calls in one transaction (one statement on the pool: its own transaction, one
// round trip) and delivers each call's result. When the statement fails with several calls,
// each is tried alone; a failure after the statement was sent (commit unknown) is every
// call's.
func (g *Group) commit(ctx context.Context, calls []*groupCall, n int) {
	msgs := calls[0].msgs
	if len(calls) > 1 {
		msgs = make([]Message, 0, n)
		for _, c := range calls {
			msgs = append(msgs, c.msgs...)
		}
	}
	err := appendOn(ctx, g.pool, msgs)
	var pg *pgconn.PgError
	if errors.As(err, &pg) && len(calls) > 1 { // Postgres refused the statement: nothing committed
		for _, c := range calls {
			c.done <- appendOn(ctx, g.pool, c.msgs)
		}
		return
	}
	if err != nil && fault.As(err) == nil && fault.Disconnected(err) {
		// The connection broke (the server restarting): the messages may or may not have
		// committed, as with any lost answer; the caller retries, with an Idempotency-Key once.
		err = &fault.Error{Kind: fault.KindUnavailable, Err: err,
			Message: "the database (Postgres) is unavailable; retry later (with an Idempotency-Key, a retry publishes once whatever happened)",
			Details: map[string]any{"dependency": "postgres"}}
	}
	if err != nil {
		err = fmt.Errorf("outbox group of %d messages: %w", n, err)
	}
	for _, c := range calls {
		c.done <- err
	}
}
