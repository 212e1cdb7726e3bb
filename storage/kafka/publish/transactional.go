package publish

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

// ErrPoolClosed is returned by Transactional.Acquire after Close.
var ErrPoolClosed = errors.New("transactional producer pool closed")

// TransactionalConfig configures a Transactional.
type TransactionalConfig struct {
	Brokers     []string // required
	Credentials kafka.Credentials
	// Size is the number of clients, and so of transactions open at once. Default 1.
	Size int
	// Prefix prefixes the clients' transactional ids (Prefix-0, Prefix-1, …): stable per
	// instance, so a restarted instance fences what its predecessor left open. Required.
	Prefix   string
	ClientID string
	// TxnTimeout is the broker's timeout of a transaction left open (by a crashed process
	// that has no successor). Default one minute.
	TxnTimeout time.Duration
	Logger     *slog.Logger
}

// Transactional is the all-or-none route: a bounded pool of transactional Kafka clients, of
// which whoever publishes holds one for the whole of its transaction (Acquire, Txn.Add,
// Txn.Commit or Txn.Abort).
//
// Why transactions: the records of one transaction become visible to consumers (which read
// committed) all at once when it commits, and never if it aborts. So an answer of success means
// every record is durable, and any other outcome (a client gone mid-request, a broker that fails,
// a crash) means none will be read: nothing is ever half accepted. Each client is also an
// idempotent producer with acks=all (kafka.NewClient's defaults).
//
// A client that fails to end its transaction is closed and replaced; the replacement reuses the
// transactional id, which makes the broker abort whatever the old one left open (fencing) rather
// than leave it until the transaction timeout.
type Transactional struct {
	cfg  TransactionalConfig
	free chan int // slots not in use

	commits []kafka.CommitWatch // by slot: its client's sign of a commit turned into an abort

	mu      sync.Mutex
	clients []*kgo.Client // by slot; nil until first use or after a failure
	closed  bool
	closing sync.WaitGroup // clients being closed in the background
}

// NewTransactional returns a pool; its clients connect on first use.
func NewTransactional(cfg TransactionalConfig) *Transactional {
	cfg.Size = max(cfg.Size, 1)
	if cfg.TxnTimeout <= 0 {
		cfg.TxnTimeout = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Transactional{cfg: cfg, free: make(chan int, cfg.Size), clients: make([]*kgo.Client, cfg.Size), commits: make([]kafka.CommitWatch, cfg.Size)}
	for i := range cfg.Size {
		p.free <- i
	}
	return p
}

// Acquire waits for a free client (bounded by ctx) and returns a transaction on it; the caller
// ends it with Commit or Abort.
func (p *Transactional) Acquire(ctx context.Context) (*Txn, error) {
	var slot int
	select {
	case slot = <-p.free:
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for a producer: %w", ctx.Err())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		p.free <- slot
		return nil, ErrPoolClosed
	}
	cl, err := p.client(slot)
	if err != nil {
		p.free <- slot
		return nil, err
	}
	return &Txn{p: p, slot: slot, cl: cl}, nil
}

// client returns slot's client, connecting a new one if it has none; p.mu is held.
func (p *Transactional) client(slot int) (*kgo.Client, error) {
	if p.clients[slot] == nil {
		cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: p.cfg.Brokers, Credentials: p.cfg.Credentials, ClientID: p.cfg.ClientID, Logger: p.cfg.Logger,
			Watch: p.commits[slot].Watch},
			kgo.TransactionalID(p.cfg.Prefix+"-"+strconv.Itoa(slot)),
			kgo.TransactionTimeout(p.cfg.TxnTimeout),
		)
		if err != nil {
			return nil, err
		}
		p.clients[slot] = cl
	}
	return p.clients[slot], nil
}

// drop closes slot's client in the background; p.mu is held.
func (p *Transactional) drop(slot int) {
	if cl := p.clients[slot]; cl != nil {
		p.clients[slot] = nil
		p.closing.Add(1)
		go func() { defer p.closing.Done(); cl.Close() }()
	}
}

// replace closes slot's client and connects a new one, which takes the same transactional id
// and so starts from a fresh producer epoch and sequence numbers.
func (p *Transactional) replace(slot int) (*kgo.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drop(slot)
	if p.closed {
		return nil, ErrPoolClosed
	}
	return p.client(slot)
}

// release returns slot to the pool; a broken client is closed and replaced on next use.
func (p *Transactional) release(slot int, broken bool) {
	p.mu.Lock()
	if broken {
		p.drop(slot)
	}
	p.mu.Unlock()
	p.free <- slot
}

// Close closes every client; call it once the transactions in progress have ended.
func (p *Transactional) Close() {
	p.mu.Lock()
	p.closed = true
	clients := p.clients
	p.clients = make([]*kgo.Client, len(clients))
	p.mu.Unlock()
	for _, cl := range clients {
		if cl != nil {
			cl.Close()
		}
	}
	p.closing.Wait()
}

// Txn is one transaction of a Transactional's client. It is used by one goroutine.
type Txn struct {
	p     *Transactional
	slot  int
	cl    *kgo.Client
	begun bool
	done  bool

	recs []*kgo.Record // every record added, to publish again (see Commit)

	mu       sync.Mutex
	firstErr error
	last     map[int32]int64 // the highest offset acknowledged per partition
}

// Add begins the transaction if needed and queues recs; their outcome is collected for Commit.
// Records not yet sent when ctx ends fail, and the transaction then aborts. It returns the
// first failure of a record added so far, so a caller adding in parts can stop early.
func (t *Txn) Add(ctx context.Context, recs ...*kgo.Record) error {
	if !t.begun {
		if err := t.cl.BeginTransaction(); err != nil {
			return fmt.Errorf("begin transaction: %w", err)
		}
		t.begun = true
	}
	t.recs = append(t.recs, recs...)
	for _, r := range recs {
		t.cl.Produce(ctx, r, t.promise)
	}
	return t.err()
}

func (t *Txn) promise(r *kgo.Record, err error) {
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

func (t *Txn) err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.firstErr
}

// Offsets returns the highest offset acknowledged per partition; read it after Commit.
func (t *Txn) Offsets() map[int32]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.last
}

// Commit waits for every record's acknowledgement and commits. On any failure it aborts and
// returns the error: the transaction's records will never be read.
//
// A commit whose outcome is unknown (the broker went away during EndTxn) is reported as a
// failure although it may have committed; that is the one case where a retry can deliver the
// records twice, unless their ids are derived from what the retry repeats.
//
// franz-go can end a transaction whose records were all acknowledged with an abort although it
// was asked to commit, and report success (kafka.CommitWatch). When its client gives that sign,
// Commit publishes the records again in a new transaction of a new client, up to commitAttempts
// times, and fails after that. Publishing again is safe: the first attempt's records were
// aborted and will never be read.
func (t *Txn) Commit(ctx context.Context) error {
	if t.done {
		return errors.New("transaction already ended")
	}
	for attempt := 1; ; attempt++ {
		if err := t.cl.Flush(ctx); err != nil {
			t.Abort()
			return fmt.Errorf("produce: %w", err)
		}
		if err := t.err(); err != nil {
			t.Abort()
			return fmt.Errorf("produce: %w", err)
		}
		// Every record is acknowledged: see the commit through even if ctx ends now (a caller
		// gone at this moment gets no answer either way), because an EndTxn cut off half way
		// leaves its outcome unknown.
		commits := &t.p.commits[t.slot]
		commits.Reset()
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := t.cl.EndTransaction(ectx, kgo.TryCommit)
		cancel()
		if err != nil {
			t.Abort()
			return fmt.Errorf("commit: %w", err)
		}
		if !commits.Swallowed() {
			break
		}
		t.p.cfg.Logger.Warn("the Kafka client aborted a transaction it was asked to commit; publishing its records again",
			"client", t.p.cfg.ClientID, "slot", t.slot, "attempt", attempt)
		if attempt == commitAttempts {
			t.done = true
			t.p.release(t.slot, true)
			return errors.New("commit: the Kafka client aborted the transaction instead of committing it")
		}
		t.mu.Lock()
		t.last, t.firstErr = nil, nil
		t.mu.Unlock()
		// A new client, not the same one: after its swallowed commit franz-go's sequence
		// numbers and the broker's can disagree (OUT_OF_ORDER_SEQUENCE_NUMBER on the next
		// produce was seen with kfake), and a new client starts both afresh.
		cl, err := t.p.replace(t.slot)
		if err == nil {
			t.cl = cl
			err = cl.BeginTransaction()
		}
		if err != nil {
			t.done = true
			t.p.release(t.slot, true)
			return fmt.Errorf("begin transaction: %w", err)
		}
		for _, r := range t.recs {
			t.cl.Produce(ctx, r, t.promise)
		}
	}
	t.done = true
	t.p.release(t.slot, false)
	return nil
}

// commitAttempts bounds how often Commit publishes again after franz-go swallowed a commit.
const commitAttempts = 3

// Abort ends the transaction without committing and releases the client. It is idempotent.
func (t *Txn) Abort() {
	if t.done {
		return
	}
	t.done = true
	broken := false
	if t.begun {
		// Not the caller's context, which may be over: aborting needs a few round trips.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := t.cl.AbortBufferedRecords(ctx); err != nil {
			broken = true
		} else if err := t.cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
			broken = true
		}
		if broken {
			t.p.cfg.Logger.Warn("transactional producer could not abort its transaction; replacing it", "client", t.p.cfg.ClientID, "slot", t.slot)
		}
	}
	t.p.release(t.slot, broken)
}
