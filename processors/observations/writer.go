package observations

import (
	"context"
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
const DefaultGroup = "carehub-observations"

// Defaults of WriterConfig.
const (
	DefaultMaxBatch = 5000
	// DefaultConcurrency is how many partitions' batches one writer stores at once.
	DefaultConcurrency = 3
	// DefaultStoreTimeout bounds one attempt to store a batch. An attempt that has begun is
	// finished even when the writer is asked to stop, so a clean shutdown redelivers nothing.
	DefaultStoreTimeout = 15 * time.Second
)

// WriterConfig configures a Writer.
type WriterConfig struct {
	Brokers []string      // required
	Pool    *pgxpool.Pool // required
	// Topic is consumed; default kafka.DefaultTopics().Observations.
	Topic string
	// Group is the consumer group; default DefaultGroup.
	Group string
	// EventsTopic is the topic device.observation_received events are queued for (outbox);
	// default kafka.DefaultTopics().Events.
	EventsTopic string
	// DisableEvents stores observations without queuing their events.
	DisableEvents bool
	ClientID      string // default "carehub-observation-writer"
	MaxBatch      int    // most records one poll returns; default DefaultMaxBatch
	// Concurrency is how many partitions' records are stored at once, each in a transaction
	// of its own; default DefaultConcurrency. It needs as many pool connections.
	Concurrency  int
	StoreTimeout time.Duration
	// SessionTimeout is how long the group waits for a member that stopped heartbeating (a
	// killed process) before its partitions move; default franz-go's 45 s. Brokers refuse
	// values under their group.min.session.timeout.ms (6 s by default).
	SessionTimeout time.Duration
	Logger         *slog.Logger // default: discard
	Registerer     prometheus.Registerer
}

// Writer moves observations from carehub.observations.v1 into Postgres and queues a
// device.observation_received event for each one it stores. Writers on several processors
// nodes share the partitions through the consumer group.
//
// Each partition's records of a poll are one Postgres transaction: COPY into a temporary table,
// INSERT … ON CONFLICT (id) DO NOTHING RETURNING id into observations, and events.Append of the
// events of exactly the returned (newly stored) ids. Offsets are committed only after that transaction commits, so a
// crash redelivers and never loses; a redelivered observation conflicts, returns nothing and
// queues no second event. Rebalances wait for the batch in hand (BlockRebalanceOnPoll), and a
// revoked partition's stored offsets are committed before it moves.
type Writer struct {
	cl          *kgo.Client
	store       *store
	maxBatch    int
	concurrency int
	timeout     time.Duration
	logger      *slog.Logger
	m           *writerMetrics
	once        sync.Once
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
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
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
		// Intake produces each request in a Kafka transaction; an aborted request (413, client
		// gone, broker failure) must never be stored.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// A new group starts at the beginning: every observation on the topic was answered 202.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Only offsets of stored records are ever committed: marked after the store commits,
		// committed then, and by the autocommit and the revoke below.
		kgo.AutoCommitMarks(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, _ map[string][]int32) {
			// Runs between batches (BlockRebalanceOnPoll): everything marked is stored.
			if err := cl.CommitMarkedOffsets(ctx); err != nil {
				logger.Warn("commit on revoke failed; the next owner re-reads the batch and stores nothing twice", "err", err)
			}
		}),
	}
	if cfg.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(cfg.SessionTimeout), kgo.HeartbeatInterval(min(3*time.Second, cfg.SessionTimeout/3)))
	}
	cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: cfg.Brokers, ClientID: cfg.ClientID, Registerer: cfg.Registerer, Logger: cfg.Logger}, opts...)
	if err != nil {
		m.unregister(cfg.Registerer)
		return nil, fmt.Errorf("observation writer: %w", err)
	}
	w := &Writer{
		cl:          cl,
		store:       newStore(cfg.Pool, cfg.EventsTopic, !cfg.DisableEvents),
		maxBatch:    cfg.MaxBatch,
		concurrency: cfg.Concurrency,
		timeout:     cfg.StoreTimeout,
		logger:      logger,
		m:           m,
	}
	return w, nil
}

// Run consumes until ctx is done, then leaves the group and closes the client. It returns
// ctx's error, or an error when the client was closed under it; a Writer runs once.
func (w *Writer) Run(ctx context.Context) error {
	defer w.Close()
	for {
		fetches := w.cl.PollRecords(ctx, w.maxBatch)
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
				w.cl.AllowRebalance()
				return err
			}
		}
		w.cl.AllowRebalance()
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// handle stores one poll's records and commits their offsets. The records of each partition
// are one transaction; up to Concurrency partitions are stored at once (the poll holds several
// when the writer is behind). It returns only when every group is stored or ctx is done; then
// only the stored groups are committed and the rest is redelivered.
func (w *Writer) handle(ctx context.Context, recs []*kgo.Record) error {
	groups := byPartition(recs)
	errs := make([]error, len(groups))
	if len(groups) == 1 || w.concurrency == 1 {
		for i, g := range groups {
			if errs[i] = w.handleGroup(ctx, g); errs[i] != nil {
				break
			}
		}
	} else {
		sem := make(chan struct{}, w.concurrency)
		var wg sync.WaitGroup
		for i, g := range groups {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				errs[i] = w.handleGroup(ctx, g)
			})
		}
		wg.Wait()
	}
	var firstErr error
	for i, g := range groups {
		if errs[i] == nil {
			w.cl.MarkCommitRecords(g...)
		} else if firstErr == nil {
			firstErr = errs[i]
		}
	}
	// Not ctx: a stored batch's offsets are worth committing during shutdown too. A failed
	// commit only means redelivery, which stores nothing twice.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := w.cl.CommitMarkedOffsets(cctx); err != nil {
		w.logger.Warn("observation offset commit failed; will retry with the next batch", "err", err)
	}
	return firstErr
}

// byPartition splits recs by topic partition, keeping each partition's order.
func byPartition(recs []*kgo.Record) [][]*kgo.Record {
	type tp struct {
		topic     string
		partition int32
	}
	index := map[tp]int{}
	var out [][]*kgo.Record
	for _, r := range recs {
		k := tp{r.Topic, r.Partition}
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], r)
	}
	return out
}

// handleGroup decodes and stores one partition's records.
func (w *Writer) handleGroup(ctx context.Context, recs []*kgo.Record) error {
	msgs := make([]Message, 0, len(recs))
	for _, r := range recs {
		m, err := DecodeMessage(r.Value)
		if err != nil {
			// Never storable; logged by position, never by content (it carries patient data).
			w.m.skipped.WithLabelValues("invalid_message").Inc()
			w.logger.Error("invalid observation message skipped", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", errors.Unwrap(err))
			continue
		}
		msgs = append(msgs, m)
	}
	if len(msgs) == 0 {
		return nil
	}
	res, err := w.storeWithRetry(ctx, msgs)
	if err != nil {
		return err
	}
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
	return nil
}

// storeWithRetry stores msgs, retrying with backoff until Postgres confirms or ctx is done:
// the offsets must not move past records that are not stored.
func (w *Writer) storeWithRetry(ctx context.Context, msgs []Message) (storeResult, error) {
	backoff := 100 * time.Millisecond
	for {
		start := time.Now()
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.timeout)
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
func (w *Writer) Close() { w.once.Do(w.cl.Close) }
