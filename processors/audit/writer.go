package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/config"
	"carehub/kernel/telemetry"
	"carehub/storage"
	"carehub/storage/kafka"
	"carehub/storage/kafka/consume"
)

// DefaultGroup is the consumer group of the audit writer.
const DefaultGroup = "carehub-audit"

// DefaultMaxBatch is the most records the writer stores in one AppendAudit call.
const DefaultMaxBatch = 5000

// fetchMinBytes is how much the broker gathers for the writer's fetch before answering it
// (within kafka.DefaultFetchMaxWait, 500 ms). Nobody waits on an audit record being stored, so
// the writer takes few large batches rather than one per request: a batch's commit and the
// round trips around it cost the same for 20 records as for 2,000, and at thousands of calls a
// second the many small commits shared Postgres's WAL flushes with the calls being audited.
const fetchMinBytes = 1 << 20

// DefaultStoreTimeout bounds one AppendAudit attempt. The store's client may not bound a call
// whose context has no deadline (clickhouse-go waits up to its 5-minute read timeout for an
// insert's answer), and a call that never returns would stop the writer without a word.
const DefaultStoreTimeout = 30 * time.Second

// WriterConfig configures a Writer.
type WriterConfig struct {
	Brokers     []string          // required
	Credentials kafka.Credentials // authenticate to brokers that require SASL
	Store       storage.AuditLog  // required
	Topic       string            // default kafka.DefaultTopics().Audit
	Group       string            // default DefaultGroup
	ClientID    string            // default "carehub-audit-writer"
	MaxBatch    int               // default DefaultMaxBatch
	// DeadLetterTopic receives the records the store refuses (storage.ErrUnstorable); default
	// kafka.DefaultTopics().AuditDLQ.
	DeadLetterTopic string
	// StoreTimeout bounds one AppendAudit attempt; one that runs out is logged and retried.
	// Default DefaultStoreTimeout.
	StoreTimeout time.Duration
	Logger       *slog.Logger // default: discard
	Registerer   prometheus.Registerer
}

// Writer moves audit records from the audit topic into the audit store. Several writers (one per
// processors node) share the partitions through the consumer group. A batch's offsets are
// committed only after the store has confirmed the whole batch, so a crash redelivers rather than
// loses; the store is idempotent by record id, so a redelivered record is stored once. The loop
// is storage/kafka/consume's runner (a failed batch is rewound and retried with backoff).
//
// A record the store refuses as data (storage.ErrUnstorable: a NUL in a string, a value out of
// a column's range) would fail its batch on every retry and stop the audit trail of every
// organization behind it. consume.DeadLetter isolates it: the batch is stored by halves until
// each refused record is alone, and those go to WriterConfig.DeadLetterTopic, counted
// (carehub_audit_dead_lettered_total) and logged as an alert by position only; the rest is
// stored and committed. `carehub deadletter --topic audit` lists and replays them.
type Writer struct {
	cl           *kgo.Client
	r            *consume.Runner
	store        storage.AuditLog
	storeTimeout time.Duration
	dlqTopic     string
	logger       *slog.Logger
	stored       prometheus.Counter
	skipped      prometheus.Counter
	deadLettered prometheus.Counter
	once         sync.Once
}

func (c *WriterConfig) defaults() {
	config.Default(&c.Topic, kafka.DefaultTopics().Audit)
	config.Default(&c.DeadLetterTopic, kafka.DefaultTopics().AuditDLQ)
	config.Default(&c.Group, DefaultGroup)
	config.Default(&c.ClientID, "carehub-audit-writer")
	config.Default(&c.MaxBatch, DefaultMaxBatch)
	config.Default(&c.StoreTimeout, DefaultStoreTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// NewWriter returns a Writer; Run runs it.
func NewWriter(cfg WriterConfig) (*Writer, error) {
	if cfg.Store == nil {
		return nil, errors.New("audit writer: no store")
	}
	cfg.defaults()
	cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: cfg.Brokers, Credentials: cfg.Credentials, ClientID: cfg.ClientID, Registerer: cfg.Registerer, Logger: cfg.Logger},
		// A new group starts at the beginning: records produced before the first writer joined
		// are audit records too.
		append(consume.GroupOpts(cfg.Group, cfg.Topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMinBytes(fetchMinBytes))...,
	)
	if err != nil {
		return nil, fmt.Errorf("audit writer: %w", err)
	}
	logger := cfg.Logger.With("group", cfg.Group)
	r, err := consume.New(cl, consume.Config{Name: "audit", MaxRecords: cfg.MaxBatch, Logger: logger, Registerer: cfg.Registerer})
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("audit writer: %w", err)
	}
	w := &Writer{cl: cl, r: r, store: cfg.Store, storeTimeout: cfg.StoreTimeout, dlqTopic: cfg.DeadLetterTopic, logger: logger,
		stored: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "audit",
			Name: "records_stored_total", Help: "Audit records the audit writer stored (redeliveries included)."}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "audit",
			Name: "records_skipped_total", Help: "Undecodable or invalid messages on the audit topic, skipped."}),
		deadLettered: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "audit",
			Name: "dead_lettered_total", Help: "Audit records the store refused, set aside on the dead-letter topic (alert on any)."}),
	}
	if cfg.Registerer != nil {
		w.stored = telemetry.Shared(cfg.Registerer, w.stored)
		w.skipped = telemetry.Shared(cfg.Registerer, w.skipped)
		w.deadLettered = telemetry.Shared(cfg.Registerer, w.deadLettered)
	}
	return w, nil
}

// Run consumes until ctx is done, then leaves the group and closes the client. It returns
// ctx's error; a Writer runs once.
func (w *Writer) Run(ctx context.Context) error {
	defer w.Close()
	deadLetter := consume.DeadLetter(consume.DeadLetterConfig{
		Name: "audit", Topic: w.dlqTopic, Producer: w.cl, Logger: w.logger,
		Permanent:    storage.IsUnstorable,
		Reason:       storage.Refusal,
		OnDeadLetter: func(*kgo.Record) { w.deadLettered.Inc() },
	})
	if err := w.r.Run(ctx, consume.Decode(w.skip, decode, w.storeBatch), consume.Commit(w.cl, w.logger), deadLetter); err != nil {
		return err
	}
	return ctx.Err()
}

// skip counts an invalid message; the runner logs it by position (never by content: it may
// carry patient ids).
func (w *Writer) skip(r *kgo.Record, err error) {
	w.skipped.Inc()
	w.r.Skip(r, err)
}

// storeBatch appends batch. The attempt is bounded by the store timeout, so a call the store
// never answers fails and is retried rather than waited on for ever.
func (w *Writer) storeBatch(ctx context.Context, batch []storage.AuditRecord) error {
	attempt, cancel := context.WithTimeout(ctx, w.storeTimeout)
	defer cancel()
	if err := w.store.AppendAudit(attempt, batch); err != nil {
		return fmt.Errorf("audit store: %w", err)
	}
	w.stored.Add(float64(len(batch)))
	return nil
}

// Close leaves the group and closes the client without running; Run calls it on return. It is
// idempotent.
func (w *Writer) Close() { w.once.Do(w.cl.Close) }
