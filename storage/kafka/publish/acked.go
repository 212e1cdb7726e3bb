package publish

import (
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Acked is the route of single records: each is its own unit, durable once acknowledged. It
// wraps a client of kafka.NewClient, an idempotent producer with acks=all, so an acknowledged
// record is on every in-sync replica and a retried batch is never written twice; records of
// one key keep their order within their partition. There is no all-or-none across records:
// of several, some may be delivered and others fail.
//
// Its methods differ only in how the caller waits: All for every ack, Each for each record's
// outcome, Within for at most a bound, Go not at all. Safe for concurrent use.
type Acked struct {
	cl *kgo.Client
}

// NewAcked returns the route over cl, which the caller built (kafka.NewClient) and closes.
func NewAcked(cl *kgo.Client) *Acked { return &Acked{cl: cl} }

// All produces recs and returns once the broker has acknowledged every one, or with the first
// failure. A record not yet sent when ctx ends fails; one already sent is waited for (the
// idempotent producer cannot abandon it).
func (a *Acked) All(ctx context.Context, recs ...*kgo.Record) error {
	return a.cl.ProduceSync(ctx, recs...).FirstErr()
}

// Each hands recs to the producer in order, now, and returns wait, which blocks until every
// record has an outcome and returns them by index (nil: acknowledged). Splitting the two lets a
// caller keep the hand-over in its own order (the outbox relay claims under a lock) and wait
// outside it. ctx bounds the records not yet sent, as in All; the caller keeps it alive until
// wait returns.
func (a *Acked) Each(ctx context.Context, recs []*kgo.Record) (wait func() []error) {
	errs := make([]error, len(recs))
	var acked sync.WaitGroup
	acked.Add(len(recs))
	for i, r := range recs {
		a.cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			errs[i] = err
			acked.Done()
		})
	}
	return func() []error {
		acked.Wait()
		return errs
	}
}

// Within produces rec and returns its acknowledgement, or the context's error once wait has
// passed (or ctx ended), whichever comes first. Not All: a record waiting for a broker that
// cannot be reached is failed when the producer next looks at it, not when its context ends,
// so All can outlast its context; Within does not, and the record may still be delivered
// after it returned.
func (a *Acked) Within(ctx context.Context, wait time.Duration, rec *kgo.Record) error {
	pctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	acked := make(chan error, 1)
	a.cl.Produce(pctx, rec, func(_ *kgo.Record, err error) { acked <- err })
	select {
	case err := <-acked:
		return err
	case <-pctx.Done():
		return pctx.Err()
	}
}

// Go hands rec to the producer without waiting and calls promise with its outcome. When the
// producer's buffer is full (kgo.MaxBufferedRecords: the broker has been away long enough to
// fill it) rec is not queued and promise gets kgo.ErrMaxBuffered at once: a caller that must
// not queue behind an outage drops it. No context reaches the producer: in franz-go, cancelling
// the context of the first record of a batch fails the whole batch, so a request's context
// must never be the producer's. promise runs on the producer's goroutine: it must not block.
func (a *Acked) Go(rec *kgo.Record, promise func(*kgo.Record, error)) {
	a.cl.TryProduce(context.Background(), rec, promise)
}
