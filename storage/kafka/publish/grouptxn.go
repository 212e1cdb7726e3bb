package publish

import (
	"cmp"
	"context"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// GroupTxn is the route of a consumer that publishes what it derives from its input inside its
// group's transaction (consume-transform-produce, exactly once from topic to topic): the records
// commit together with the consumer's offsets, or abort with them and are never read (consumers
// read committed). Whoever owns the session begins and ends the transaction
// (consume.Transact's Transaction middleware); GroupTxn only produces into it.
//
// A GroupTxn is a value over one session, cheap to make per batch (consume.Transact.Publisher).
type GroupTxn struct {
	sess *kgo.GroupTransactSession
}

// NewGroupTxn returns the route into sess's transaction.
func NewGroupTxn(sess *kgo.GroupTransactSession) GroupTxn { return GroupTxn{sess: sess} }

// All produces recs into the open transaction, flushes, and returns the first record's failure.
// Success is not yet durability: the records are durable, and read, only once the transaction
// that holds them commits.
func (g GroupTxn) All(ctx context.Context, recs ...*kgo.Record) error {
	var (
		mu       sync.Mutex
		firstErr error
	)
	promise := func(_ *kgo.Record, err error) {
		if err != nil {
			mu.Lock()
			firstErr = cmp.Or(firstErr, err)
			mu.Unlock()
		}
	}
	for _, r := range recs {
		g.sess.Produce(ctx, r, promise)
	}
	_ = g.sess.Client().Flush(ctx) // a failure shows in the promises
	mu.Lock()
	defer mu.Unlock()
	return firstErr
}
