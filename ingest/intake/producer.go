package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka"
)

// errProducerClosed is returned by acquire after Close.
var errProducerClosed = errors.New("observation producer closed")

// producers is a bounded pool of transactional Kafka clients; each request that produces holds
// one for its whole transaction.
//
// Why transactions: a request's records become visible to the writer (which reads
// read-committed) all at once when the transaction commits, and never if it aborts. So 202 means
// every record of the request is durable, and any other answer (413 after 10,000 NDJSON lines, a
// client that goes away mid-stream, a broker that fails) means none will be stored: nothing is
// ever half accepted, while NDJSON is still produced in chunks as it is read. Each client is also
// an idempotent producer with acks=all (kafka.NewClient's defaults).
//
// A client that fails to end its transaction is closed and replaced; the replacement reuses the
// transactional id, which makes the broker abort whatever the old one left open (fencing) rather
// than leave it until the transaction timeout.
type producers struct {
	brokers    []string
	prefix     string
	txnTimeout time.Duration
	logger     *slog.Logger

	free chan int // slots not in use

	mu      sync.Mutex
	clients []*kgo.Client // by slot; nil until first use or after a failure
	closed  bool
	closing sync.WaitGroup // clients being closed in the background
}

func newProducers(brokers []string, size int, prefix string, txnTimeout time.Duration, logger *slog.Logger) *producers {
	ps := &producers{brokers: brokers, prefix: prefix, txnTimeout: txnTimeout, logger: logger,
		free: make(chan int, size), clients: make([]*kgo.Client, size)}
	for i := range size {
		ps.free <- i
	}
	return ps
}

// acquire waits for a free client (bounded by ctx) and returns a transaction on it; the caller
// ends it with commit or abort.
func (ps *producers) acquire(ctx context.Context) (*txn, error) {
	var slot int
	select {
	case slot = <-ps.free:
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for a producer: %w", ctx.Err())
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		ps.free <- slot
		return nil, errProducerClosed
	}
	if ps.clients[slot] == nil {
		cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: ps.brokers, ClientID: "carehub-ingest", Logger: ps.logger},
			kgo.TransactionalID(ps.prefix+"-"+strconv.Itoa(slot)),
			kgo.TransactionTimeout(ps.txnTimeout),
		)
		if err != nil {
			ps.free <- slot
			return nil, err
		}
		ps.clients[slot] = cl
	}
	t := &txn{ps: ps, slot: slot, cl: ps.clients[slot]}
	return t, nil
}

// release returns slot to the pool; a broken client is closed and replaced on next use.
func (ps *producers) release(slot int, broken bool) {
	ps.mu.Lock()
	if broken && ps.clients[slot] != nil {
		cl := ps.clients[slot]
		ps.clients[slot] = nil
		ps.closing.Add(1)
		go func() { defer ps.closing.Done(); cl.Close() }()
	}
	ps.mu.Unlock()
	ps.free <- slot
}

// close closes every client once the transactions in progress have ended (the HTTP server is
// drained before Close is called, so none should be).
func (ps *producers) close() {
	ps.mu.Lock()
	ps.closed = true
	clients := ps.clients
	ps.clients = make([]*kgo.Client, len(clients))
	ps.mu.Unlock()
	for _, cl := range clients {
		if cl != nil {
			cl.Close()
		}
	}
	ps.closing.Wait()
}

// txn is one request's Kafka transaction. It is used by one goroutine.
type txn struct {
	ps    *producers
	slot  int
	cl    *kgo.Client
	begun bool
	done  bool

	mu       sync.Mutex
	firstErr error
	last     map[int32]int64 // the highest offset acknowledged per partition
}

// produce begins the transaction if needed and queues recs; their outcome is collected for
// commit. ctx is the request's: records not yet sent when it ends fail, and the transaction
// then aborts.
func (t *txn) produce(ctx context.Context, recs []*kgo.Record) error {
	if !t.begun {
		if err := t.cl.BeginTransaction(); err != nil {
			return fmt.Errorf("begin transaction: %w", err)
		}
		t.begun = true
	}
	for _, r := range recs {
		t.cl.Produce(ctx, r, t.promise)
	}
	return t.err()
}

func (t *txn) promise(r *kgo.Record, err error) {
	t.mu.Lock()
	if err == nil {
		if t.last == nil {
			t.last = map[int32]int64{}
		}
		t.last[r.Partition] = max(t.last[r.Partition], r.Offset)
	} else if t.firstErr == nil {
		t.firstErr = err
	}
	t.mu.Unlock()
}

func (t *txn) err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.firstErr
}

// commit waits for every record's acknowledgement and commits. On any failure it aborts and
// returns the error: the request's records will never be read.
//
// A commit whose outcome is unknown (the broker went away during EndTxn) is reported as a
// failure although it may have committed; that is the one case where a retry can store a
// request twice, unless the retry carries the same client ids or Idempotency-Key (ids are then
// derived from them, and the writer stores each id once).
func (t *txn) commit(ctx context.Context) error {
	if t.done {
		return errors.New("transaction already ended")
	}
	if err := t.cl.Flush(ctx); err != nil {
		t.abort()
		return fmt.Errorf("produce observations: %w", err)
	}
	if err := t.err(); err != nil {
		t.abort()
		return fmt.Errorf("produce observations: %w", err)
	}
	// Every record is acknowledged: see the commit through even if the request's context ends
	// now (a client gone at this moment gets no answer either way), because an EndTxn cut off
	// half way leaves its outcome unknown.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := t.cl.EndTransaction(ectx, kgo.TryCommit); err != nil {
		t.abort()
		return fmt.Errorf("commit observations: %w", err)
	}
	t.done = true
	t.ps.release(t.slot, false)
	return nil
}

// abort ends the transaction without committing and releases the client. It is idempotent.
func (t *txn) abort() {
	if t.done {
		return
	}
	t.done = true
	broken := false
	if t.begun {
		// Not the request's context, which may be over: aborting needs a few round trips.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := t.cl.AbortBufferedRecords(ctx); err != nil {
			broken = true
		} else if err := t.cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
			broken = true
		}
		if broken {
			t.ps.logger.Warn("observation producer could not abort its transaction; replacing it", "slot", t.slot)
		}
	}
	t.ps.release(t.slot, broken)
}
