package observations

import (
	"carehub/schemas/kafka/observation"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka"
)

// DefaultGroup is the consumer group of the observation writer. Intake watches its lag for
// backpressure.
const DefaultGroup = observation.WriterGroup

// Defaults of WriterConfig.
const (
	DefaultMaxBatch = 5000
	// DefaultChunkSize is the most records one Postgres transaction stores.
	DefaultChunkSize = 1000
	// DefaultConcurrency is how many chunks one writer stores at once.
	DefaultConcurrency = 3
	// DefaultStoreTimeout bounds one attempt to store a batch. An attempt that has begun is
	// finished even when the writer is asked to stop, so a clean shutdown redelivers nothing.
	DefaultStoreTimeout = 15 * time.Second
	transactionTimeout  = 10 * time.Second
)

// WriterConfig configures a Writer.
type WriterConfig struct {
	Brokers []string      // required
	Pool    *pgxpool.Pool // required
	// Topic is consumed; default kafka.DefaultTopics().Observations.
	Topic string
	// Group is the consumer group; default DefaultGroup.
	Group string
	// EventsTopic receives the device.observation_received events; default
	// kafka.DefaultTopics().Events.
	EventsTopic string
	// DisableEvents stores observations without producing their events.
	DisableEvents bool
	ClientID      string // default "carehub-observation-writer"
	// TransactionalID is the id of the writer's Kafka transactions. Stable per instance, a
	// restarted writer fences (aborts) what its killed predecessor left open at once instead of
	// after the transaction timeout; default: random per process.
	TransactionalID string
	MaxBatch        int // most records one poll returns; default DefaultMaxBatch
	// ChunkSize is the most records of one Postgres transaction: a poll's records are stored
	// poll is split into chunks of at most ChunkSize (and into Concurrency chunks when it is large enough); default DefaultChunkSize.
	ChunkSize int
	// Concurrency is how many chunks are stored at once, each in a transaction of its own;
	// default DefaultConcurrency. It needs as many pool connections.
	Concurrency  int
	StoreTimeout time.Duration
	// SessionTimeout is how long the group waits for a member that stopped heartbeating (a
	// killed process) before its partitions move; default franz-go's 45 s. Brokers refuse
	// values under their group.min.session.timeout.ms (6 s by default).
	SessionTimeout time.Duration
	Logger         *slog.Logger // default: discard
	Registerer     prometheus.Registerer
}

// Writer moves observations from carehub.observations.v1 into Postgres and produces a
// device.observation_received event for each one. Writers on several processors nodes share
// the partitions through the consumer group.
//
// Per poll: the records, in chunks of at most ChunkSize, are Postgres transactions (a COPY
// into observations; on a conflict, a staged INSERT … ON CONFLICT (id) DO NOTHING), up to
// Concurrency at once; then one Kafka transaction produces the events of every stored record
// of the poll, new or stored before, and commits the poll's offsets (kgo.GroupTransactSession).
// A crash before that commit redelivers the poll, which stores nothing twice and produces the
// same events again under the same ids in a new transaction; the aborted one is never read
// (consumers read committed).
type Writer struct {
	cfg   WriterConfig
	opts  []kgo.Opt
	store *store

	sess   *kgo.GroupTransactSession
	logger *slog.Logger
	m      *writerMetrics
	once   sync.Once
}

// NewWriter returns a Writer; Run runs it.
func NewWriter(cfg WriterConfig) (*Writer, error) {
	if cfg.Pool == nil {
		return nil, errors.New("observation writer: no database pool")
	}
	topics := kafka.DefaultTopics()
	if cfg.Topic == "" {
		cfg.Topic = topics.Observations
	}
	if cfg.Group == "" {
		cfg.Group = DefaultGroup
	}
	if cfg.EventsTopic == "" {
		cfg.EventsTopic = topics.Events
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "carehub-observation-writer"
	}
	if cfg.TransactionalID == "" {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		cfg.TransactionalID = "carehub-observation-writer-" + hex.EncodeToString(b)
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.ChunkSize <= 0 {
		cfg.ChunkSize = DefaultChunkSize
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	logger := cfg.Logger.With("component", "observation_writer", "group", cfg.Group)
	m, err := newWriterMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("observation writer: %w", err)
	}
	opts := []kgo.Opt{
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topic),
		kgo.TransactionalID(cfg.TransactionalID),
		// A transaction only produces a poll's events and commits its offsets. A killed writer's
		// open one holds back readers of the events topic (read committed) until it is fenced
		// or times out; keep that short.
		kgo.TransactionTimeout(transactionTimeout),
		// Intake produces each request in a Kafka transaction and kafka.NewClient reads
		// committed: an aborted request (413, client gone, broker failure) is never stored.
		// A new group starts at the beginning: every observation on the topic was answered 202.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// A batch in hand is finished before its partitions move, so a rebalance aborts
		// nothing that is in progress.
		kgo.BlockRebalanceOnPoll(),
	}
	if cfg.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(cfg.SessionTimeout), kgo.HeartbeatInterval(min(3*time.Second, cfg.SessionTimeout/3)))
	}
	w := &Writer{cfg: cfg, opts: opts, store: newStore(cfg.Pool), logger: logger, m: m}
	if w.sess, err = w.newSession(); err != nil {
		m.unregister(cfg.Registerer)
		return nil, fmt.Errorf("observation writer: %w", err)
	}
	return w, nil
}

func (w *Writer) newSession() (*kgo.GroupTransactSession, error) {
	return kafka.NewGroupTransactSession(kafka.ClientConfig{Brokers: w.cfg.Brokers, ClientID: w.cfg.ClientID,
		Registerer: w.cfg.Registerer, Logger: w.cfg.Logger}, w.opts...)
}

// Run consumes until ctx is done, then leaves the group and closes the client; it returns
// ctx's error. A Kafka transaction that fails beyond retrying closes the session and starts a
// new one (same transactional id, which fences the old one) after a pause. A Writer runs once.
func (w *Writer) Run(ctx context.Context) error {
	defer w.Close()
	for failures := 0; ; failures++ {
		err := w.runSession(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := min(time.Second<<min(failures, 5), 30*time.Second)
		w.logger.Error("observation writer session failed; starting a new one", "err", err, "retry_in", wait.String())
		w.Close()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		sess, err := w.newSession()
		if err != nil {
			w.logger.Error("observation writer: new session", "err", err)
			continue
		}
		w.sess, w.once = sess, sync.Once{}
	}
}

func (w *Writer) runSession(ctx context.Context) error {
	for {
		fetches := w.sess.PollRecords(ctx, w.cfg.MaxBatch)
		if fetches.IsClientClosed() {
			return errors.New("observation writer: client closed")
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) {
				w.logger.Warn("observation fetch failed", "topic", topic, "partition", partition, "err", err)
			}
		})
		if recs := fetches.Records(); len(recs) > 0 {
			if err := w.handle(ctx, recs); err != nil {
				w.sess.AllowRebalance()
				return err
			}
		}
		w.sess.AllowRebalance()
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// handle stores one poll's records, then produces their events and commits their offsets in
// one Kafka transaction. The records, in chunks of at most ChunkSize, are
// Postgres transactions, up to Concurrency at once. When storing is cut short (ctx done) the Kafka transaction is aborted and the whole
// poll is redelivered, which stores nothing twice.
func (w *Writer) handle(ctx context.Context, recs []*kgo.Record) error {
	groups := chunks(recs, w.cfg.ChunkSize, w.cfg.Concurrency)
	results := make([]storeResult, len(groups))
	errs := make([]error, len(groups))
	if len(groups) == 1 || w.cfg.Concurrency == 1 {
		for i, g := range groups {
			if results[i], errs[i] = w.handleGroup(ctx, g); errs[i] != nil {
				break
			}
		}
	} else {
		sem := make(chan struct{}, w.cfg.Concurrency)
		var wg sync.WaitGroup
		for i, g := range groups {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				results[i], errs[i] = w.handleGroup(ctx, g)
			})
		}
		wg.Wait()
	}
	var present []observation.Message
	for i := range groups {
		if errs[i] != nil {
			return errs[i] // offsets stay where they were: the poll is read again
		}
		present = append(present, results[i].present...)
	}
	// Not ctx: a stored batch's events and offsets are worth committing during shutdown too.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.StoreTimeout)
	defer cancel()
	committed, err := w.emit(ectx, present)
	if err != nil {
		return err
	}
	if !committed {
		// A rebalance or a failed produce: the offsets were reset to the last commit and the
		// records come again.
		w.logger.Warn("observation batch not committed; it is read again", "records", len(recs))
		return nil
	}
	return nil
}

// emit produces the events of present in a transaction that also commits the poll's offsets,
// and reports whether it committed.
func (w *Writer) emit(ctx context.Context, present []observation.Message) (bool, error) {
	var recs []*kgo.Record
	if !w.cfg.DisableEvents && len(present) > 0 {
		projects, err := w.store.projects.resolve(ctx, w.cfg.Pool, present)
		if err != nil {
			return false, err
		}
		if recs, err = receivedRecords(w.cfg.EventsTopic, present, projects); err != nil {
			return false, err
		}
	}
	if err := w.sess.Begin(); err != nil {
		return false, fmt.Errorf("observation writer: begin transaction: %w", err)
	}
	var (
		mu         sync.Mutex
		produceErr error
	)
	for _, r := range recs {
		w.sess.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				produceErr = cmp.Or(produceErr, err)
				mu.Unlock()
			}
		})
	}
	_ = w.sess.Client().Flush(ctx) // a failure shows in the promises
	mu.Lock()
	try := kgo.TransactionEndTry(produceErr == nil)
	mu.Unlock()
	if produceErr != nil {
		w.logger.Warn("producing observation events failed; aborting the batch", "err", produceErr)
	}
	committed, err := w.sess.End(ctx, try)
	if err != nil {
		return false, fmt.Errorf("observation writer: end transaction: %w", err)
	}
	return committed, nil
}

// minChunk is the fewest records worth a Postgres transaction of their own when a poll is
// split: under it, a transaction's fixed cost outweighs storing on one more connection.
const minChunk = 200

// chunks splits a poll into pieces of equal size, at most size records each, and into
// concurrency pieces when it holds enough records (minChunk each), whatever partitions they
// come from: each piece is idempotent by id, and the offsets move only when all are stored.
// Splitting by partition made a poll of 100 records spread over six partitions six
// transactions of 17 rows, the writer's slowest case exactly when the backlog is short.
func chunks(recs []*kgo.Record, size, concurrency int) [][]*kgo.Record {
	n := len(recs)
	k := max((n+size-1)/size, min(concurrency, n/minChunk), 1)
	each := (n + k - 1) / k
	out := make([][]*kgo.Record, 0, k)
	for len(recs) > each {
		out = append(out, recs[:each:each])
		recs = recs[each:]
	}
	return append(out, recs)
}

// handleGroup decodes and stores one chunk of a poll.
func (w *Writer) handleGroup(ctx context.Context, recs []*kgo.Record) (storeResult, error) {
	msgs := make([]observation.Message, 0, len(recs))
	for _, r := range recs {
		m, err := observation.DecodeMessage(r.Value)
		if err != nil {
			// Never storable; logged by position, never by content (it carries patient data).
			w.m.skipped.WithLabelValues("invalid_message").Inc()
			w.logger.Error("invalid observation message skipped", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", errors.Unwrap(err))
			continue
		}
		msgs = append(msgs, m)
	}
	if len(msgs) == 0 {
		return storeResult{}, nil
	}
	res, err := w.storeWithRetry(ctx, msgs)
	if err != nil {
		return storeResult{}, err
	}
	// Counted as Postgres commits them: a batch whose Kafka transaction then aborts is read
	// again and finds them stored (duplicates).
	now := time.Now()
	for _, m := range res.stored {
		w.m.acceptToStored.Observe(now.Sub(m.ReceivedAt).Seconds())
	}
	w.m.stored.Add(float64(len(res.stored)))
	w.m.duplicates.Add(float64(res.duplicates))
	if res.unknownPatient > 0 {
		w.m.skipped.WithLabelValues("unknown_patient").Add(float64(res.unknownPatient))
		w.logger.Error("observations of a patient not in their organization skipped", "count", res.unknownPatient)
	}
	if res.rejected > 0 {
		w.m.skipped.WithLabelValues("rejected_by_database").Add(float64(res.rejected))
	}
	return res, nil
}

// storeWithRetry stores msgs, retrying with backoff until Postgres confirms or ctx is done:
// the offsets must not move past records that are not stored.
func (w *Writer) storeWithRetry(ctx context.Context, msgs []observation.Message) (storeResult, error) {
	backoff := 100 * time.Millisecond
	for {
		start := time.Now()
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.StoreTimeout)
		res, err := w.store.write(actx, msgs)
		cancel()
		if err == nil {
			w.m.batchSeconds.Observe(time.Since(start).Seconds())
			w.m.batchSize.Observe(float64(len(msgs)))
			return res, nil
		}
		if ctx.Err() != nil {
			return storeResult{}, ctx.Err()
		}
		w.logger.Error("storing observations failed; retrying", "records", len(msgs), "retry_in", backoff.String(), "err", err)
		select {
		case <-ctx.Done():
			return storeResult{}, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// Close leaves the group (committing what is marked) and closes the client without running;
// Run calls it on return. It is idempotent.
func (w *Writer) Close() { w.once.Do(w.sess.Close) }
