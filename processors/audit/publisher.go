// Package audit is carehub's HIPAA audit log (DECISIONS §2) and the one owner of its record: what
// a call's record holds (Call.Record), the Publisher that puts one record per live-key call on
// carehub.audit.v1, the Writer (consumer group "carehub-audit") that moves
// records from the topic into the audit store, and the Service that answers audit log reads.
//
// File map:
//
//	call.go       Call, Who, Record, Outcome: a call's record, whichever transport observed it
//	publisher.go  Publisher: Publish (asynchronous) and PublishSync (waits for the broker's ack)
//	writer.go     Writer: batches records into storage.AuditLog, commits offsets after the store
//	service.go    Service: tenant-scoped, admin:org audit log queries
//
// Records are idempotent by id (the request id), so at-least-once delivery from the topic gives
// exactly one stored record per call.
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
	"carehub/storage/kafka/publish"
)

// DefaultMaxBuffered bounds the records a Publisher holds while the broker is slow or away. Past
// it, Publish drops (and counts) records and PublishSync fails at once, rather than letting
// requests queue behind an outage.
const DefaultMaxBuffered = 50_000

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	Brokers     []string              // required
	Credentials kafka.Credentials     // authenticate to brokers that require SASL
	Topic       string                // default kafka.DefaultTopics().Audit
	ClientID    string                // default "carehub-audit"
	MaxBuffered int                   // default DefaultMaxBuffered
	Logger      *slog.Logger          // default: discard
	Registerer  prometheus.Registerer // optional: client and publisher metrics
}

// Publisher produces audit records to the audit topic, keyed by organization id, on a Kafka
// client of its own: an outage that fills the buffers of other producers (the outbox relay)
// cannot stall audit records, and the other way round. Safe for concurrent use.
type Publisher struct {
	cl      *kgo.Client
	out     *publish.Acked // on cl
	topic   string
	logger  *slog.Logger
	dropped prometheus.Counter
	failed  prometheus.Counter
	once    sync.Once
}

func (c *PublisherConfig) defaults() {
	config.Default(&c.Topic, kafka.DefaultTopics().Audit)
	config.Default(&c.ClientID, "carehub-audit")
	config.Default(&c.MaxBuffered, DefaultMaxBuffered)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// NewPublisher returns a Publisher; Close releases it.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg.defaults()
	cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: cfg.Brokers, Credentials: cfg.Credentials, ClientID: cfg.ClientID, Registerer: cfg.Registerer, Logger: cfg.Logger},
		kgo.DefaultProduceTopic(cfg.Topic), kgo.MaxBufferedRecords(cfg.MaxBuffered))
	if err != nil {
		return nil, fmt.Errorf("audit publisher: %w", err)
	}
	p := &Publisher{cl: cl, out: publish.NewAcked(cl), topic: cfg.Topic, logger: cfg.Logger,
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "audit",
			Name: "records_dropped_total", Help: "Audit records of non-patient calls dropped because the audit producer's buffer was full."}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "audit",
			Name: "records_failed_total", Help: "Audit records the broker did not accept."}),
	}
	if cfg.Registerer != nil {
		p.dropped = telemetry.Shared(cfg.Registerer, p.dropped)
		p.failed = telemetry.Shared(cfg.Registerer, p.failed)
	}
	return p, nil
}

// ErrNotAcknowledged is returned by PublishSync when the broker did not acknowledge the record in
// time. The record may still be delivered later; the audit log then shows a call whose response
// was withheld, which over-reports access and never under-reports it.
var ErrNotAcknowledged = errors.New("audit record not acknowledged by the broker")

func (p *Publisher) record(rec storage.AuditRecord) (*kgo.Record, error) {
	b, err := encode(rec)
	if err != nil {
		return nil, fmt.Errorf("encode audit record: %w", err)
	}
	return &kgo.Record{Key: []byte(rec.OrgID), Value: b, Topic: p.topic, Timestamp: rec.Time}, nil
}

// Publish produces rec without waiting for the broker. A record that cannot be buffered (the
// broker has been away long enough to fill the buffer) is dropped, counted and logged by id.
//
// Records are produced under a background context on purpose (publish.Acked.Go): in franz-go,
// cancelling the context of the first record of a batch fails the whole batch, so a request's
// context must never reach the producer.
func (p *Publisher) Publish(rec storage.AuditRecord) {
	r, err := p.record(rec)
	if err != nil {
		p.logger.Error("audit record dropped", "request_id", rec.ID, "err", err)
		p.dropped.Inc()
		return
	}
	p.out.Go(r, func(_ *kgo.Record, err error) {
		if err == nil {
			return
		}
		if errors.Is(err, kgo.ErrMaxBuffered) {
			p.dropped.Inc()
		} else {
			p.failed.Inc()
		}
		p.logger.Error("audit record not delivered", "request_id", rec.ID, "err", err)
	})
}

// PublishSync produces rec and returns once the broker has acknowledged it (acks=all), or
// ErrNotAcknowledged (wrapping the cause) if that does not happen before ctx is done or the
// producer fails it. The record stays queued after a timeout (see ErrNotAcknowledged). ctx only
// bounds the wait: like Publish's, the record is produced under no request's context.
func (p *Publisher) PublishSync(ctx context.Context, rec storage.AuditRecord) error {
	r, err := p.record(rec)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	p.out.Go(r, func(_ *kgo.Record, err error) { done <- err })
	select {
	case err := <-done:
		if err != nil {
			p.failed.Inc()
			return fmt.Errorf("%w: %w", ErrNotAcknowledged, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrNotAcknowledged, ctx.Err())
	}
}

// Close waits up to timeout for buffered records to be delivered, then closes the client.
// It is idempotent.
func (p *Publisher) Close(timeout time.Duration) {
	p.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := p.cl.Flush(ctx); err != nil {
			p.logger.Error("audit records still buffered at shutdown", "count", p.cl.BufferedProduceRecords())
		}
		p.cl.Close()
	})
}
