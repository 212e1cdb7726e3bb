// Package eventlog runs the event log writer: a Kafka consumer group on carehub.events.v1 that
// stores every event in the event log (storage.EventLog: Postgres by default, ClickHouse in
// production), from which GET /v1/events and the events query read.
//
// # Effectively once
//
// Delivery is at least once: the outbox relay may publish an event twice, and a consumer may
// read a record twice after a crash or rebalance. The store is idempotent by event id, and the
// writer commits a partition's offset only after the store has confirmed every record before
// it, so each event ends up in the log exactly once and none is skipped.
//
// # Batches, commits and rebalances
//
// The writer stores what each poll returns at once (at most Config.BatchSize records): there is
// no linger, so at a low rate an event is stored as soon as it is fetched, and under load the
// batches grow by themselves with what arrives while the previous one is being stored. A batch
// is appended in chunks of Config.ChunkSize events, Config.Concurrency chunks at once, so one
// large batch is not one long transaction that every later event waits behind; then the
// batch's offsets are committed synchronously (auto-commit is off). A record that is not a
// valid envelope is logged by topic, partition and offset, counted, and skipped: it is
// committed with its batch and never blocks its partition.
//
// Rebalances use kgo.BlockRebalanceOnPoll: from the poll that returns a batch until the batch
// is stored and committed, the group cannot take partitions away, so the writer never commits a
// partition it no longer owns and hands over partitions with nothing processed-but-uncommitted
// (no re-processing on a clean rebalance). The price is that a rebalance waits for the batch in
// hand, at most one store call. The alternative, flushing from an
// OnPartitionsRevoked callback, runs concurrently with the poll loop and needs a lock around the
// batch plus care for records polled just before the revoke; blocking is simpler to reason
// about. When the store fails the writer does not hold the rebalance: it drops the batch, rewinds
// the partitions to the batch's first offsets (kgo.Client.SetOffsets), allows the rebalance and
// retries with backoff, so the records are read again by whoever owns them next.
package eventlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"carehub/kernel/telemetry"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"carehub/kernel/events"
	"carehub/storage"
	"carehub/storage/kafka"
)

// Defaults of Config.
const (
	DefaultGroup       = "carehub-eventlog"
	DefaultClientID    = "carehub-eventlog"
	DefaultBatchSize   = 5000
	DefaultChunkSize   = 1000
	DefaultConcurrency = 3
	DefaultLagInterval = 15 * time.Second
	// storeTimeout bounds one AppendEvents call.
	storeTimeout = 30 * time.Second
	// shutdownTimeout bounds storing and committing the batch in hand when Run's context ends.
	shutdownTimeout = 15 * time.Second
	maxBackoff      = 30 * time.Second
)

// Config configures a Writer.
type Config struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// ClientID names the Kafka client (and labels its metrics). Default DefaultClientID.
	ClientID string
	// ClientOpts are extra franz-go options, applied after the writer's own.
	ClientOpts []kgo.Opt
	// Group is the consumer group. Default DefaultGroup.
	Group string
	// Topic is the events topic. Default kafka.DefaultTopics().Events.
	Topic string
	// Store receives the events. Required.
	Store storage.EventLog
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Registerer receives the writer's metrics, the Kafka client's and the group's lag gauge
	// when set.
	Registerer prometheus.Registerer
	// BatchSize is the most records taken by one poll and committed together. Default
	// DefaultBatchSize.
	BatchSize int
	// ChunkSize is the most events of one AppendEvents call. Default DefaultChunkSize.
	ChunkSize int
	// Concurrency is how many AppendEvents calls of one batch run at once. Default
	// DefaultConcurrency.
	Concurrency int
	// LagInterval is how often the lag gauge is refreshed (only with a Registerer). Default
	// DefaultLagInterval; negative disables the gauge.
	LagInterval time.Duration
}

// Validate reports whether the config can build a writer (after defaults).
func (c Config) Validate() error {
	switch {
	case len(c.Brokers) == 0:
		return errors.New("eventlog writer: no brokers")
	case c.Store == nil:
		return errors.New("eventlog writer: no store")
	case c.BatchSize < 0 || c.ChunkSize < 0 || c.Concurrency < 0:
		return errors.New("eventlog writer: negative batch size, chunk size or concurrency")
	}
	return nil
}

func (c *Config) defaults() {
	if c.ClientID == "" {
		c.ClientID = DefaultClientID
	}
	if c.Group == "" {
		c.Group = DefaultGroup
	}
	if c.Topic == "" {
		c.Topic = kafka.DefaultTopics().Events
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.ChunkSize == 0 {
		c.ChunkSize = DefaultChunkSize
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.LagInterval == 0 {
		c.LagInterval = DefaultLagInterval
	}
}

// Writer is the event log writer: one member of the consumer group. Create it with New, run it
// with Run.
type Writer struct {
	cfg       Config
	cl        *kgo.Client
	log       *slog.Logger
	m         writerMetrics
	lag       *LagMonitor // nil without a Registerer or with LagInterval < 0
	closeOnce sync.Once
}

// New builds a writer and its Kafka client (joining the group happens in Run).
func New(cfg Config) (*Writer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	opts := []kgo.Opt{
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topic),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		// A new group starts at the beginning: the log should hold every retained event.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}
	cl, err := kafka.NewClient(kafka.ClientConfig{
		Brokers:    cfg.Brokers,
		ClientID:   cfg.ClientID,
		Registerer: cfg.Registerer,
		Logger:     cfg.Logger,
	}, append(opts, cfg.ClientOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("eventlog writer: %w", err)
	}
	w := &Writer{
		cfg: cfg,
		cl:  cl,
		log: cfg.Logger.With("component", "eventlog_writer", "group", cfg.Group, "topic", cfg.Topic),
		m:   newWriterMetrics(cfg.Registerer),
	}
	if cfg.Registerer != nil && cfg.LagInterval > 0 {
		w.lag = NewLagMonitor(kadm.NewClient(cl), cfg.Group, []string{cfg.Topic}, LagOptions{
			Interval: cfg.LagInterval, Registerer: cfg.Registerer, Logger: cfg.Logger,
		})
	}
	return w, nil
}

// Close leaves the group and closes the Kafka client. Run calls it on return; it is idempotent.
func (w *Writer) Close() {
	w.closeOnce.Do(w.cl.Close)
}

// batch is what the writer has polled and not yet stored: every record (for the commit) and
// the events decoded from the valid ones.
type batch struct {
	records []*kgo.Record
	events  []storage.Event
}

func (b *batch) reset() {
	clear(b.records) // drop references to record buffers
	b.records, b.events = b.records[:0], b.events[:0]
}

// Run consumes until ctx is done, then stores and commits the batch in hand (bounded by a
// short timeout), leaves the group and returns nil. Store and broker errors are logged and
// retried; they do not end Run. Run may be called once.
func (w *Writer) Run(ctx context.Context) error {
	defer w.Close()
	var wg sync.WaitGroup
	lagCtx, stopLag := context.WithCancel(ctx)
	defer func() {
		stopLag()
		wg.Wait()
	}()
	if w.lag != nil {
		wg.Go(func() { _ = w.lag.Run(lagCtx) })
	}

	b := &batch{}
	failures := 0
	for ctx.Err() == nil {
		fetches := w.cl.PollRecords(ctx, w.cfg.BatchSize)
		if fetches.IsClientClosed() {
			return nil
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				w.log.Warn("fetch failed", "topic", topic, "partition", partition, "error", err)
			}
		})
		fetches.EachRecord(func(r *kgo.Record) {
			b.records = append(b.records, r)
			ev, err := events.Decode(r.Value)
			if err != nil {
				w.m.malformed.Inc()
				w.log.Error("skipping malformed event record", "topic", r.Topic, "partition", r.Partition,
					"offset", r.Offset, "error", err)
				return
			}
			b.events = append(b.events, ev)
		})
		if len(b.records) == 0 {
			// A poll that returned only errors (its context ended) still counts as a poll
			// that blocks rebalances; nothing is in hand, so release it.
			w.cl.AllowRebalance()
			continue
		}
		if ctx.Err() != nil {
			break
		}
		if err := w.flush(ctx, b); err != nil {
			failures++
			wait := backoff(failures)
			w.log.Error("storing events failed; rewound to retry", "error", err, "records", len(b.records),
				"attempt", failures, "retry_in", wait)
			w.rewind(b)
			b.reset()
			w.cl.AllowRebalance()
			sleep(ctx, wait)
			continue
		}
		failures = 0
		b.reset()
		w.cl.AllowRebalance()
	}

	// Shutting down: store and commit what is in hand so the next owner need not redo it.
	if len(b.records) > 0 {
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		if err := w.flush(flushCtx, b); err != nil {
			w.log.Warn("storing the last batch at shutdown failed; its records will be read again", "error", err)
		}
		cancel()
	}
	// Leaving the group (Close) waits for every poll to be released, including the last one,
	// which returned the context's error.
	w.cl.AllowRebalance()
	return nil
}

// flush stores b's events, in chunks of ChunkSize with up to Concurrency at once, and then
// commits all of b's records. It returns an error only when the store failed (some chunks may
// be stored: the retry stores them again, which the store ignores by id); a failed commit is
// logged, since the events are stored and reading them again is harmless.
func (w *Writer) flush(ctx context.Context, b *batch) error {
	if len(b.events) > 0 {
		storeCtx, cancel := context.WithTimeout(ctx, storeTimeout)
		g, gctx := errgroup.WithContext(storeCtx)
		g.SetLimit(w.cfg.Concurrency)
		for chunk := range slices.Chunk(b.events, w.cfg.ChunkSize) {
			g.Go(func() error { return w.cfg.Store.AppendEvents(gctx, chunk) })
		}
		err := g.Wait()
		cancel()
		if err != nil {
			w.m.storeErrors.Inc()
			return err
		}
		stored := time.Now()
		w.m.written.Add(float64(len(b.events)))
		for _, ev := range b.events {
			w.m.latency.Observe(stored.Sub(ev.CreatedAt).Seconds())
		}
	}
	if err := w.cl.CommitRecords(ctx, b.records...); err != nil {
		w.m.commitErrors.Inc()
		w.log.Warn("commit after storing failed; the records will be read and stored again", "error", err)
	}
	return nil
}

// rewind moves the fetch position of every partition in b back to b's first record there, so
// the dropped batch is read again.
func (w *Writer) rewind(b *batch) {
	first := map[string]map[int32]kgo.EpochOffset{}
	for _, r := range b.records {
		ps := first[r.Topic]
		if ps == nil {
			ps = map[int32]kgo.EpochOffset{}
			first[r.Topic] = ps
		}
		if at, ok := ps[r.Partition]; !ok || r.Offset < at.Offset {
			ps[r.Partition] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset}
		}
	}
	w.cl.SetOffsets(first)
}

// backoff returns the wait before retry number attempt: 100 ms doubling to 30 s, ±20 % jitter.
func backoff(attempt int) time.Duration {
	d := min(100*time.Millisecond<<min(attempt-1, 16), maxBackoff)
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

type writerMetrics struct {
	written      prometheus.Counter
	malformed    prometheus.Counter
	storeErrors  prometheus.Counter
	commitErrors prometheus.Counter
	latency      prometheus.Histogram
}

func newWriterMetrics(reg prometheus.Registerer) writerMetrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "eventlog", Name: name, Help: help})
	}
	m := writerMetrics{
		written:      counter("events_written_total", "Events appended to the event log (re-deliveries included)."),
		malformed:    counter("malformed_records_total", "Records on the events topic that were not valid envelopes and were skipped."),
		storeErrors:  counter("store_errors_total", "Batches the event log store failed to append (retried)."),
		commitErrors: counter("commit_errors_total", "Offset commits that failed after a batch was stored."),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "carehub", Subsystem: "eventlog", Name: "latency_seconds",
			Help:    "Time from an event's createdAt to its storage in the event log.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14), // 1 ms … ~150 s
		}),
	}
	if reg != nil {
		m.written = telemetry.Shared(reg, m.written)
		m.malformed = telemetry.Shared(reg, m.malformed)
		m.storeErrors = telemetry.Shared(reg, m.storeErrors)
		m.commitErrors = telemetry.Shared(reg, m.commitErrors)
		m.latency = telemetry.Shared(reg, m.latency)
	}
	return m
}
