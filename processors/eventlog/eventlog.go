// Package eventlog runs the event log writer: a Kafka consumer group on carehub.events.v1 that
// stores every event in the event log (storage.EventLog: Postgres by default, ClickHouse in
// production), from which GET /v1/events and the events query read.
//
// # Effectively once
//
// Delivery is at least once: the outbox relay may publish an event twice, and a consumer may
// read a record twice after a crash or rebalance. The store is idempotent by event id, and the
// writer commits a partition's offset only after every record before it is durably stored, so
// each event ends up in the log exactly once and none is skipped.
//
// # Visible first, committed once durable
//
// A store that can defer durability (storage.DeferredEventLog: Postgres, for batches of 1,000
// events or more) makes a batch visible as soon as it is stored, without waiting for its WAL to
// reach disk; the writer goes on to the next batch and commits this one's offsets only once the
// store reports it durable (durable.go: polled every 10 ms while commits wait; waited for and
// committed before partitions are revoked and when the writer stops). A crash of Postgres may
// lose a batch that was visible, but never one whose offsets are committed: the writer stores
// it again (it sees the server's restart) or the partitions' next owner reads it again. Not
// waiting for the flush of a batch of 5,000 (5 MB of WAL) made its append 9 % faster on a
// durable cluster, and the log took 8 % more of the arrays' events a second under load
// (docs/PERFORMANCE.md). Small batches, and other stores (ClickHouse), are durable when the
// append returns, and the batch is committed at once.
//
// # Batches, commits and rebalances
//
// The writer stores what each poll returns at once (at most Config.BatchSize records): there is
// no linger, so at a low rate an event is stored as soon as it is fetched, and under load the
// batches grow by themselves with what arrives while the previous one is being stored. A batch
// is appended in chunks of Config.ChunkSize events, Config.Concurrency chunks at once; then the
// batch's offsets are committed (auto-commit is off). By default a batch is one
// append: on Postgres, concurrent COPYs into event_log wait on each other to extend the table
// and share the cores with the node, and one stream of up to 5,000 rows kept the tail of
// publish → log at 80 % of the arrays' rate at 269–313 ms p99 where three chunks of 1,000 at
// once gave 498–883 (docs/PERFORMANCE.md); on ClickHouse each append is a part (and a lookup of
// the batch's ids), so fewer is better too, and its store asks for batches of up to 20,000
// (storage.BatchedEventLog), which a backlog fills and a steady rate does not wait for. A record that is not a valid envelope is logged by topic, partition and offset,
// counted, and skipped: it is committed with its batch and never blocks its partition
// (consume.Decode).
//
// # Events the store refuses
//
// An event the store refuses as data (storage.ErrUnstorable: a number numeric cannot hold, an
// unpaired surrogate escape) would fail its batch however often it is retried, and the log
// would stop for every tenant behind it. The doors refuse such payloads (jsonwire.Storable);
// whatever gets past them (a record produced to the topic directly, a store with other limits)
// is isolated by consume.DeadLetter: the batch is stored by halves until each refused event is
// alone, and those go to Config.DeadLetterTopic with their source partition, offset and the
// store's error code, counted (carehub_eventlog_dead_lettered_total) and logged as an alert by
// position only; the rest is stored and the batch committed. `carehub deadletter list` shows
// them and `carehub deadletter replay` puts them back on the events topic. Any other store error
// (the store away or slow) rewinds the batch and retries it, as before.
//
// The loop is storage/kafka/consume's runner, whose reasoning this writer was the model for:
// rebalances are blocked from the poll that returns a batch until the batch is stored and
// committed, so the writer never commits a partition it no longer owns and hands over
// partitions with nothing processed-but-uncommitted; when the store fails the batch is dropped,
// its partitions rewound to its first offsets and the rebalance allowed before the backoff, so
// the records are read again by whoever owns them next.
package eventlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"carehub/kernel/config"
	"carehub/kernel/events"
	"carehub/kernel/telemetry"
	"carehub/storage"
	"carehub/storage/kafka"
	"carehub/storage/kafka/consume"
)

// Defaults of Config.
const (
	DefaultGroup       = "carehub-eventlog"
	DefaultClientID    = "carehub-eventlog"
	DefaultBatchSize   = 5000
	DefaultConcurrency = 1
	DefaultLagInterval = 15 * time.Second
	// storeTimeout bounds one AppendEvents call.
	storeTimeout = 30 * time.Second
	// shutdownTimeout bounds storing and committing the batch in hand when Run's context ends.
	shutdownTimeout = 15 * time.Second
)

// Config configures a Writer.
type Config struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// Credentials authenticate to brokers that require SASL.
	Credentials kafka.Credentials
	// ClientID names the Kafka client (and labels its metrics). Default DefaultClientID.
	ClientID string
	// ClientOpts are extra franz-go options, applied after the writer's own.
	ClientOpts []kgo.Opt
	// Group is the consumer group. Default DefaultGroup.
	Group string
	// Topic is the events topic. Default kafka.DefaultTopics().Events.
	Topic string
	// DeadLetterTopic receives the events the store refuses. Default
	// kafka.DefaultTopics().EventsDLQ.
	DeadLetterTopic string
	// Store receives the events. Required.
	Store storage.EventLog
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Registerer receives the writer's metrics, the Kafka client's and the group's lag gauge
	// when set.
	Registerer prometheus.Registerer
	// BatchSize is the most records taken by one poll and committed together. Default: the
	// store's AppendBatch when it is a storage.BatchedEventLog (ClickHouse), else
	// DefaultBatchSize.
	BatchSize int
	// ChunkSize is the most events of one AppendEvents call. Default: BatchSize, one append
	// per batch.
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
	config.Default(&c.ClientID, DefaultClientID)
	config.Default(&c.Group, DefaultGroup)
	config.Default(&c.Topic, kafka.DefaultTopics().Events)
	config.Default(&c.DeadLetterTopic, kafka.DefaultTopics().EventsDLQ)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if b, ok := c.Store.(storage.BatchedEventLog); ok {
		config.Default(&c.BatchSize, b.AppendBatch())
	}
	config.Default(&c.BatchSize, DefaultBatchSize)
	config.Default(&c.ChunkSize, c.BatchSize)
	config.Default(&c.Concurrency, DefaultConcurrency)
	if c.LagInterval == 0 { // negative disables the gauge
		c.LagInterval = DefaultLagInterval
	}
}

// Writer is the event log writer: one member of the consumer group. Create it with New, run it
// with Run.
type Writer struct {
	cfg       Config
	cl        *kgo.Client
	r         *consume.Runner
	log       *slog.Logger
	m         writerMetrics
	lag       *LagMonitor // nil without a Registerer or with LagInterval < 0
	closeOnce sync.Once
	// durable is set when the store is a storage.DeferredEventLog: batches are committed once
	// durable rather than when stored. mark and stored are the store's mark for the batch in
	// hand and its events, which store sets and deferCommit reads (the runner calls them from
	// one goroutine).
	durable *commitWhenDurable
	mark    storage.DurableMark
	stored  []events.Event
}

// New builds a writer and its Kafka client (joining the group happens in Run).
func New(cfg Config) (*Writer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	log := cfg.Logger.With("component", "eventlog_writer", "group", cfg.Group, "topic", cfg.Topic)
	// A new group starts at the beginning: the log should hold every retained event.
	opts := append(consume.GroupOpts(cfg.Group, cfg.Topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var durable *commitWhenDurable
	if d, ok := cfg.Store.(storage.DeferredEventLog); ok {
		// Before partitions go to another member, what was stored of them is committed once
		// durable; partitions lost outright keep their records for the next owner.
		durable = newCommitWhenDurable(d, log)
		opts = append(opts,
			kgo.OnPartitionsRevoked(func(ctx context.Context, _ *kgo.Client, _ map[string][]int32) { durable.flush(ctx) }),
			kgo.OnPartitionsLost(func(context.Context, *kgo.Client, map[string][]int32) { durable.drop() }))
	}
	cl, err := kafka.NewClient(kafka.ClientConfig{
		Brokers:     cfg.Brokers,
		Credentials: cfg.Credentials,
		ClientID:    cfg.ClientID,
		Registerer:  cfg.Registerer,
		Logger:      cfg.Logger,
	}, append(opts, cfg.ClientOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("eventlog writer: %w", err)
	}
	r, err := consume.New(cl, consume.Config{Name: "eventlog", MaxRecords: cfg.BatchSize, Drain: shutdownTimeout,
		Logger: log, Registerer: cfg.Registerer})
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("eventlog writer: %w", err)
	}
	w := &Writer{cfg: cfg, cl: cl, r: r, log: log, m: newWriterMetrics(cfg.Registerer), durable: durable}
	if durable != nil {
		durable.cl = committer{cl, w.m.commitErrors}
	}
	if cfg.Registerer != nil && cfg.LagInterval > 0 {
		w.lag = NewLagMonitor(kadm.NewClient(cl), cfg.Group, []string{cfg.Topic}, LagConfig{
			Interval: cfg.LagInterval, Registerer: cfg.Registerer, Logger: cfg.Logger,
		})
	}
	return w, nil
}

// Close leaves the group and closes the Kafka client. Run calls it on return; it is idempotent.
func (w *Writer) Close() {
	w.closeOnce.Do(w.cl.Close)
}

// Run consumes until ctx is done, then stores and commits the batch in hand (bounded by a
// short timeout), leaves the group and returns nil. Store and broker errors are logged and
// retried; they do not end Run. Run may be called once.
func (w *Writer) Run(ctx context.Context) error {
	defer w.Close()
	var wg sync.WaitGroup
	bgCtx, stopBg := context.WithCancel(ctx) // the lag gauge's and the deferred commits' goroutines
	defer func() {
		stopBg()
		wg.Wait()
	}()
	if w.lag != nil {
		wg.Go(func() { _ = w.lag.Run(bgCtx) })
	}
	h := consume.Decode(w.skip, events.Decode, w.store)
	deadLetter := consume.DeadLetter(consume.DeadLetterConfig{
		Name: "eventlog", Topic: w.cfg.DeadLetterTopic, Producer: w.cl, Logger: w.log,
		Permanent:    storage.IsUnstorable,
		Reason:       storage.Refusal,
		OnDeadLetter: func(*kgo.Record) { w.m.deadLettered.Inc() },
	})
	if w.durable == nil {
		return w.r.Run(ctx, h, consume.Commit(committer{w.cl, w.m.commitErrors}, w.log), deadLetter)
	}
	wg.Go(func() { w.durable.run(bgCtx) })
	err := w.r.Run(ctx, h, w.deferCommit, deadLetter)
	// Commit what was stored before leaving the group (whose revoke finds nothing left then).
	w.durable.flush(context.WithoutCancel(ctx))
	return err
}

// skip counts a record that is not a valid envelope; the runner logs it by position.
func (w *Writer) skip(r *kgo.Record, err error) {
	w.m.malformed.Inc()
	w.r.Skip(r, err)
}

// store appends evs, in chunks of ChunkSize with up to Concurrency at once. When it fails some
// chunks may be stored: the retry stores them again, which the store ignores by id. A batch
// with a refused event is stored by parts (consume.DeadLetter): each part's events add to
// w.stored.
func (w *Writer) store(ctx context.Context, evs []events.Event) error {
	storeCtx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	g, gctx := errgroup.WithContext(storeCtx)
	g.SetLimit(w.cfg.Concurrency)
	var mu sync.Mutex
	for chunk := range slices.Chunk(evs, w.cfg.ChunkSize) {
		g.Go(func() error {
			if w.durable == nil {
				return w.cfg.Store.AppendEvents(gctx, chunk)
			}
			mark, err := w.durable.store.AppendEventsDeferred(gctx, chunk)
			mu.Lock()
			w.mark = later(w.mark, mark)
			mu.Unlock()
			return err
		})
	}
	if err := g.Wait(); err != nil {
		w.m.storeErrors.Inc()
		return err
	}
	if w.durable != nil { // deferCommit takes and resets it
		w.stored = append(w.stored, evs...)
	}
	stored := time.Now()
	w.m.written.Add(float64(len(evs)))
	for _, ev := range evs {
		w.m.latency.Observe(stored.Sub(ev.CreatedAt).Seconds())
	}
	return nil
}

// committer counts failed commits (carehub_eventlog_commit_errors_total); consume.Commit logs
// them.
type committer struct {
	*kgo.Client
	errors prometheus.Counter
}

func (c committer) CommitRecords(ctx context.Context, rs ...*kgo.Record) error {
	err := c.Client.CommitRecords(ctx, rs...)
	if err != nil {
		c.errors.Inc()
	}
	return err
}

type writerMetrics struct {
	written      prometheus.Counter
	malformed    prometheus.Counter
	storeErrors  prometheus.Counter
	commitErrors prometheus.Counter
	deadLettered prometheus.Counter
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
		deadLettered: counter("dead_lettered_total", "Events the store refused, set aside on the dead-letter topic (alert on any)."),
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
		m.deadLettered = telemetry.Shared(reg, m.deadLettered)
		m.latency = telemetry.Shared(reg, m.latency)
	}
	return m
}
