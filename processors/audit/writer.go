package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/telemetry"
	"carehub/storage"
	"carehub/storage/kafka"
)

// DefaultGroup is the consumer group of the audit writer.
const DefaultGroup = "carehub-audit"

// DefaultMaxBatch is the most records the writer stores in one AppendAudit call.
const DefaultMaxBatch = 5000

// DefaultStoreTimeout bounds one AppendAudit attempt. The store's client may not bound a call
// whose context has no deadline (clickhouse-go waits up to its 5-minute read timeout for an
// insert's answer), and a call that never returns would stop the writer without a word.
const DefaultStoreTimeout = 30 * time.Second

// WriterConfig configures a Writer.
type WriterConfig struct {
	Brokers  []string         // required
	Store    storage.AuditLog // required
	Topic    string           // default kafka.DefaultTopics().Audit
	Group    string           // default DefaultGroup
	ClientID string           // default "carehub-audit-writer"
	MaxBatch int              // default DefaultMaxBatch
	// StoreTimeout bounds one AppendAudit attempt; one that runs out is logged and retried.
	// Default DefaultStoreTimeout.
	StoreTimeout time.Duration
	Logger       *slog.Logger // default: discard
	Registerer   prometheus.Registerer
}

// Writer moves audit records from the audit topic into the audit store. Several writers (one per
// processors node) share the partitions through the consumer group. A batch's offsets are
// committed only after the store has confirmed the whole batch, so a crash redelivers rather than
// loses; the store is idempotent by record id, so a redelivered record is stored once.
type Writer struct {
	cl           *kgo.Client
	store        storage.AuditLog
	maxBatch     int
	storeTimeout time.Duration
	logger       *slog.Logger
	stored       prometheus.Counter
	skipped      prometheus.Counter
	once         sync.Once
}

// NewWriter returns a Writer; Run runs it.
func NewWriter(cfg WriterConfig) (*Writer, error) {
	if cfg.Store == nil {
		return nil, errors.New("audit writer: no store")
	}
	if cfg.Topic == "" {
		cfg.Topic = kafka.DefaultTopics().Audit
	}
	if cfg.Group == "" {
		cfg.Group = DefaultGroup
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "carehub-audit-writer"
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: cfg.Brokers, ClientID: cfg.ClientID, Registerer: cfg.Registerer, Logger: cfg.Logger},
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topic),
		kgo.DisableAutoCommit(),
		// A new group starts at the beginning: records produced before the first writer joined
		// are audit records too.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if err != nil {
		return nil, fmt.Errorf("audit writer: %w", err)
	}
	w := &Writer{cl: cl, store: cfg.Store, maxBatch: cfg.MaxBatch, storeTimeout: cfg.StoreTimeout, logger: cfg.Logger.With("group", cfg.Group),
		stored: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "audit",
			Name: "records_stored_total", Help: "Audit records the audit writer stored (redeliveries included)."}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "audit",
			Name: "records_skipped_total", Help: "Undecodable or invalid messages on the audit topic, skipped."}),
	}
	if cfg.Registerer != nil {
		w.stored = telemetry.Shared(cfg.Registerer, w.stored)
		w.skipped = telemetry.Shared(cfg.Registerer, w.skipped)
	}
	return w, nil
}

// Run consumes until ctx is done, then leaves the group and closes the client. It returns
// ctx's error; a Writer runs once.
func (w *Writer) Run(ctx context.Context) error {
	defer w.Close()
	for {
		fetches := w.cl.PollRecords(ctx, w.maxBatch)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if fetches.IsClientClosed() {
			return errors.New("audit writer: client closed")
		}
		failed := false
		fetches.EachError(func(topic string, partition int32, err error) {
			failed = true
			w.logger.Warn("audit fetch failed", "topic", topic, "partition", partition, "err", err)
		})
		recs := fetches.Records()
		if len(recs) == 0 {
			if failed { // the broker is away: do not spin on it, nor flood the log
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Second):
				}
			}
			continue
		}
		if err := w.storeBatch(ctx, w.decode(recs)); err != nil {
			return err
		}
		if err := w.cl.CommitRecords(ctx, recs...); err != nil && ctx.Err() == nil {
			// Harmless beyond redelivery: the batch is stored and storing is idempotent.
			w.logger.Warn("audit offset commit failed", "err", err)
		}
	}
}

// decode returns the valid records of recs. An invalid message can never be stored, so it is
// logged by position (never by content: it may carry patient ids) and skipped.
func (w *Writer) decode(recs []*kgo.Record) []storage.AuditRecord {
	out := make([]storage.AuditRecord, 0, len(recs))
	for _, r := range recs {
		var a storage.AuditRecord
		if err := json.Unmarshal(r.Value, &a); err != nil || a.ID == "" || a.Operation == "" || a.Time.IsZero() {
			w.skipped.Inc()
			w.logger.Error("invalid audit message skipped", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset)
			continue
		}
		out = append(out, a)
	}
	return out
}

// storeBatch appends batch, retrying with backoff until the store confirms or ctx is done: the
// offsets must not move past records that are not stored. Each attempt is bounded by the store
// timeout, so a call the store never answers is retried rather than waited on for ever.
func (w *Writer) storeBatch(ctx context.Context, batch []storage.AuditRecord) error {
	backoff := 100 * time.Millisecond
	for {
		attempt, cancel := context.WithTimeout(ctx, w.storeTimeout)
		err := w.store.AppendAudit(attempt, batch)
		cancel()
		if err == nil {
			w.stored.Add(float64(len(batch)))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		w.logger.Error("audit store failed; retrying", "records", len(batch), "retry_in", backoff.String(), "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// Close leaves the group and closes the client without running; Run calls it on return. It is
// idempotent.
func (w *Writer) Close() { w.once.Do(w.cl.Close) }
