package eventlog

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/events"
	"carehub/kernel/tick"
	"carehub/storage"
	"carehub/storage/kafka/consume"
)

// durablePoll is how often the writer asks a deferred store how far it is durable while
// batches wait for their commit; flushTimeout bounds flushing the queue when partitions are
// revoked or the writer stops.
const (
	durablePoll  = 10 * time.Millisecond
	flushTimeout = 10 * time.Second
)

// commitWhenDurable commits the offsets of batches a storage.DeferredEventLog stored but has
// not yet made durable, once its durable mark has passed them, in order.
//
// The handler (deferCommit) queues each stored batch with its mark; run commits the queue's
// durable prefix every durablePoll; flush, called when partitions are revoked and when the
// writer stops, waits for the whole queue to be durable and commits it, so the partitions'
// next owner starts after what this member stored. A batch the store may have lost (it
// restarted since the batch was appended: a crash loses commits not yet flushed) is appended
// again, durably, before it is committed; it is kept (its events and the last record of each
// partition) until then. If the store cannot be reached, or the commit fails, nothing more is
// committed: the next owner reads those records again, which the idempotent log ignores.
// Partitions lost without a revoke (the member fell out of the group) are dropped from the
// queue uncommitted for the same reason.
type commitWhenDurable struct {
	store storage.DeferredEventLog
	cl    consume.Committer
	log   *slog.Logger

	mu    sync.Mutex // guards queue
	queue []pendingBatch
	wake  chan struct{}

	commitMu sync.Mutex // one commit at a time, in queue order
}

type pendingBatch struct {
	mark   storage.DurableMark
	events []events.Event // to append again if the store may have lost them
	last   []*kgo.Record  // the batch's last record of each partition: committing it commits the partition
}

func newCommitWhenDurable(store storage.DeferredEventLog, log *slog.Logger) *commitWhenDurable {
	return &commitWhenDurable{store: store, log: log, wake: make(chan struct{}, 1)}
}

// add queues a stored batch: recs are the poll's records, evs the events stored from them with
// mark. A batch durable already (the zero mark: a small one) behind none waiting is committed
// at once, as consume.Commit would.
func (c *commitWhenDurable) add(ctx context.Context, recs []*kgo.Record, evs []events.Event, mark storage.DurableMark) {
	if len(recs) == 0 {
		return
	}
	b := pendingBatch{mark: mark, events: evs}
	type tp struct {
		topic     string
		partition int32
	}
	at := map[tp]int{}
	for _, r := range recs {
		k := tp{r.Topic, r.Partition}
		if i, ok := at[k]; ok {
			if r.Offset > b.last[i].Offset {
				b.last[i] = r
			}
			continue
		}
		at[k] = len(b.last)
		b.last = append(b.last, r)
	}
	c.mu.Lock()
	now := mark == storage.DurableMark{} && len(c.queue) == 0
	c.queue = append(c.queue, b)
	c.mu.Unlock()
	if now {
		c.commit(ctx, storage.DurableMark{})
		return
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run commits durable batches until ctx ends.
func (c *commitWhenDurable) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		}
		for c.pending() > 0 && ctx.Err() == nil {
			if now, err := c.store.Durable(ctx); err != nil {
				if ctx.Err() == nil {
					c.log.Warn("reading how far the event log is durable failed; retrying", "error", err)
				}
			} else {
				c.commit(ctx, now)
			}
			tick.Sleep(ctx, durablePoll)
		}
	}
}

func (c *commitWhenDurable) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// settled is pending after any commit in flight: flush must not return while one is, or a
// revoke would let the partitions go with their commit still on its way.
func (c *commitWhenDurable) settled() int {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	return c.pending()
}

// commit commits the queued batches that are durable when the store is durable as far as now,
// appending again (durably) those it may have lost, and removes them from the queue.
func (c *commitWhenDurable) commit(ctx context.Context, now storage.DurableMark) {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	c.mu.Lock()
	queue := c.queue
	c.mu.Unlock()
	n := 0
	for ; n < len(queue); n++ {
		durable, mayBeLost := queue[n].mark.Within(now)
		if mayBeLost {
			c.log.Warn("the event log restarted since a batch was stored; storing it again before committing it", "events", len(queue[n].events))
			if err := c.store.AppendEvents(ctx, queue[n].events); err != nil {
				c.log.Warn("storing a batch again failed; retrying", "error", err)
				break
			}
			durable = true
		}
		if !durable {
			break
		}
	}
	if n == 0 {
		return
	}
	c.mu.Lock()
	c.queue = c.queue[n:] // only add appends meanwhile
	c.mu.Unlock()
	var recs []*kgo.Record
	for _, b := range queue[:n] {
		recs = append(recs, b.last...)
	}
	if err := c.cl.CommitRecords(ctx, recs...); err != nil && ctx.Err() == nil {
		c.log.Warn("commit after the events were durable failed; the records will be read and stored again", "error", err)
	}
}

// flush waits until every queued batch is durable and commits them all, within flushTimeout
// (the store gets there by itself: Postgres's WAL writer flushes within 3 × wal_writer_delay,
// 600 ms at the default). What it cannot commit is dropped from the queue: the partitions'
// next owner reads it again.
func (c *commitWhenDurable) flush(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, flushTimeout)
	defer cancel()
	for c.settled() > 0 {
		now, err := c.store.Durable(ctx)
		if err == nil {
			c.commit(ctx, now)
			if c.settled() == 0 {
				return
			}
		}
		if ctx.Err() != nil {
			c.drop()
			c.log.Warn("the event log could not be made durable in time; the uncommitted records will be read and stored again", "error", err)
			return
		}
		tick.Sleep(ctx, durablePoll)
	}
}

// deferCommit is the writer's middleware with a deferred store: after its handler stored a
// batch it queues the batch's commit with its events and the mark the store returned (w.stored
// and w.mark, which store sets).
func (w *Writer) deferCommit(next consume.Handler) consume.Handler {
	return func(ctx context.Context, recs []*kgo.Record) error {
		w.mark, w.stored = storage.DurableMark{}, nil
		if err := next(ctx, recs); err != nil {
			return err
		}
		w.durable.add(ctx, recs, w.stored, w.mark)
		return nil
	}
}

// drop forgets every queued batch uncommitted, after any commit in flight (which removes what
// it took from the queue).
func (c *commitWhenDurable) drop() {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	c.mu.Lock()
	c.queue = nil
	c.mu.Unlock()
}

// later is the mark of a batch stored in two appends that returned a and b: durable when both
// are. Marks of two epochs (the store restarted between the appends) make one that is never
// durable by itself: the batch is appended again.
func later(a, b storage.DurableMark) storage.DurableMark {
	switch {
	case a == storage.DurableMark{}:
		return b
	case b == storage.DurableMark{}:
		return a
	case a.Epoch != b.Epoch:
		return storage.DurableMark{Epoch: -1, Pos: max(a.Pos, b.Pos)}
	default:
		return storage.DurableMark{Epoch: a.Epoch, Pos: max(a.Pos, b.Pos)}
	}
}
