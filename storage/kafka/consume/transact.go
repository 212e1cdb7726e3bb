package consume

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka"
	"carehub/storage/kafka/publish"
)

// ErrNotCommitted is the error of a batch whose transaction ended without committing although
// its handler succeeded (the group rebalanced, or the offset commit was refused): the session
// rewound to the last commit, so the batch is read again.
var ErrNotCommitted = errors.New("consume: the transaction was aborted; the batch is read again")

// Transact is the Source of a consumer that commits its offsets inside Kafka transactions
// (produce what a batch derives and commit the batch in one step): a kgo.GroupTransactSession
// that the runner replaces when a transaction fails beyond retrying. Its Transaction middleware
// begins and ends each batch's transaction; the handler produces through Publisher.
type Transact struct {
	build      func(watch func(kgo.LogLevel, string)) (*kgo.GroupTransactSession, error)
	endTimeout time.Duration
	commits    kafka.CommitWatch // the session's sign of a commit turned into an abort

	mu     sync.Mutex
	sess   *kgo.GroupTransactSession
	failed bool // sess failed beyond retrying and is closed
	closed bool
}

// NewTransact builds a session with build and returns the source over it. build must make the
// session with GroupOpts' options, a stable kgo.TransactionalID and watch as its
// kafka.ClientConfig.Watch: Renew calls it again to replace a failed session, and the new one,
// with the same id, fences what the failed one left open. endTimeout bounds ending one
// transaction (committing or aborting); ending is not cut short by the handler's context, so a
// batch finished at shutdown is still committed.
func NewTransact(build func(watch func(kgo.LogLevel, string)) (*kgo.GroupTransactSession, error), endTimeout time.Duration) (*Transact, error) {
	t := &Transact{build: build, endTimeout: endTimeout}
	sess, err := build(t.commits.Watch)
	if err != nil {
		return nil, err
	}
	t.sess = sess
	return t, nil
}

// Session is the session in use (Publisher produces into its transaction). It changes only
// between batches.
func (t *Transact) Session() *kgo.GroupTransactSession {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sess
}

// Publisher is the route into the transaction of the session in use (publish.GroupTxn): the
// handler produces what a batch derives through it, and the Transaction middleware commits it
// with the batch's offsets. Take it per batch: the session changes only between batches.
func (t *Transact) Publisher() publish.GroupTxn { return publish.NewGroupTxn(t.Session()) }

// PollRecords polls the session.
func (t *Transact) PollRecords(ctx context.Context, maxPollRecords int) kgo.Fetches {
	return t.Session().PollRecords(ctx, maxPollRecords)
}

// AllowRebalance lets a rebalance blocked by the last poll through.
func (t *Transact) AllowRebalance() { t.Session().AllowRebalance() }

// Transaction is the middleware of a Transact consumer, in place of Commit: it begins a
// transaction before next handles a batch and ends it after, committing the batch's offsets
// with what next produced when next returns nil, aborting otherwise. An aborted transaction
// rewinds the session to the last commit, so a failed batch is read again, and whatever it
// produced is never read (consumers read committed). A batch whose transaction aborted although
// next succeeded fails with ErrNotCommitted. A session that cannot begin or end a transaction
// (franz-go: no error of End is retryable) is closed, and the runner replaces it (Renew) before
// it polls again.
func (t *Transact) Transaction(next Handler) Handler {
	return func(ctx context.Context, recs []*kgo.Record) error {
		sess := t.Session()
		t.commits.Reset() // one transaction at a time: a sign from now on is this one's
		if err := sess.Begin(); err != nil {
			t.fail(sess)
			return fmt.Errorf("consume: begin transaction: %w", err)
		}
		err := next(ctx, recs)
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.endTimeout)
		defer cancel()
		committed, endErr := sess.End(ectx, kgo.TransactionEndTry(err == nil))
		switch {
		case committed && t.commits.Swallowed():
			// franz-go aborted what it reports committed (kafka.CommitWatch): the session
			// believes its position committed, so only a new one rewinds to what was.
			t.fail(sess)
			return ErrNotCommitted
		case endErr != nil:
			t.fail(sess)
			return errors.Join(err, fmt.Errorf("consume: end transaction: %w", endErr))
		case err != nil:
			return err
		case !committed:
			return ErrNotCommitted
		}
		return nil
	}
}

// fail closes sess, which failed beyond retrying; Renew replaces it.
func (t *Transact) fail(sess *kgo.GroupTransactSession) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sess == sess && !t.failed {
		t.failed = true
		sess.CloseAllowingRebalance() // the batch in hand is dropped: Close would wait on it
	}
}

// Renew replaces a session that failed with a new one from build and reports whether it did;
// it does nothing while the session is healthy or after Close. The runner calls it after a
// failed batch.
func (t *Transact) Renew() (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.failed || t.closed {
		return false, nil
	}
	sess, err := t.build(t.commits.Watch)
	if err != nil {
		return false, err
	}
	t.sess, t.failed = sess, false
	return true, nil
}

// Close leaves the group and closes the session; a Transact closed is not renewed. It is
// idempotent.
func (t *Transact) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.closed = true
	if !t.failed {
		t.sess.CloseAllowingRebalance()
	}
}
