// Package outbox owns carehub's transactional outbox: Append writes messages to the Postgres
// outbox table inside the caller's transaction (the same one as its entity change) and notifies
// Channel; the Relay publishes the rows to Kafka after commit and marks them sent. Events go
// through kernel/events.Append, which validates envelopes and calls Append; workflow run
// commands call Append directly.
//
// # Delivery
//
// A relay claims a batch of unsent rows in seq order with SELECT … FOR UPDATE SKIP LOCKED inside
// a transaction, produces them (topic and key from the row, value = the row's JSON, header
// event-id), waits for the broker's acknowledgement of every record (acks=all, idempotent
// producer), sets sent_at on the acknowledged rows and commits. Because the rows stay locked
// until that commit, several relays (one per carehub instance) never publish the same row
// concurrently: each row is published once, except in one window — a relay that crashes (or
// loses its database connection) after the broker acknowledged a batch and before its commit
// leaves those rows unsent, and they are published again. Consumers therefore deduplicate by
// event id (the event log by primary key, webhooks by delivery key); that is the documented
// at-least-once contract of carehub.events.v1.
//
// Under a backlog a relay keeps Config.Workers batches in flight (claiming, waiting for the
// broker and committing are round trips; one batch at a time left the database and the broker
// idle in turn). Claims are serialized, so within one relay rows enter the producer in seq
// order, and the producer keeps per-partition order, as long as every batch succeeds: a batch
// that fails is produced again after the later ones. seq follows insertion, not commit, order,
// and with several relays two batches may be in flight at once, so consumers must not rely on
// cross-batch order; events carry createdAt.
//
// # Failure
//
// When the broker is unreachable or refuses writes, the produce times out
// (Config.PublishTimeout), the transaction rolls back, and the relay retries with exponential
// backoff. Mutations keep succeeding meanwhile: they only insert outbox rows. When the broker
// returns, the backlog drains in seq order.
//
// One case cannot time out: a broker that accepted a produce request and never answers. The
// idempotent producer may not abandon records it has sent (that would break its sequence
// numbers), so the batch waits for the broker. The claiming transaction meanwhile sits idle
// and Postgres ends it after idle_in_transaction_session_timeout (storage/postgres.Connect: one
// minute), which releases the rows to the next claim; if the stuck records are then delivered
// too, those events are duplicated, which consumers absorb by event id.
//
// # Waking
//
// The relay LISTENs on Channel on a connection of its own taken from the pool (re-established
// after any error) and drains the outbox when notified; Append issues the NOTIFY, which Postgres
// delivers on commit. A poll every Config.PollInterval covers lost notifications and the time
// the listener is reconnecting.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"carehub/kernel/config"
	"carehub/kernel/telemetry"
	"carehub/kernel/tick"
	"carehub/storage/kafka/publish"
)

// Channel is the Postgres notification channel Append notifies and the relay listens on.
const Channel = "carehub_outbox"

// HeaderEventID is the record header that carries the event id, for consumers that deduplicate
// before decoding.
const HeaderEventID = "event-id"

// Defaults of Config.
const (
	DefaultBatchSize       = 2000
	DefaultWorkers         = 3
	DefaultPollInterval    = time.Second
	DefaultRetention       = time.Hour
	DefaultCleanupInterval = time.Minute
	// DefaultPublishTimeout bounds one batch's produce. It must stay below the pool's
	// idle_in_transaction_session_timeout (one minute, storage/postgres.Connect): the claiming
	// transaction is idle while the broker is producing.
	DefaultPublishTimeout = 20 * time.Second
	maxBackoff            = 30 * time.Second
	cleanupChunk          = 5000
)

// Config configures a Relay. The zero value is usable.
type Config struct {
	Logger *slog.Logger // default: discard
	// BatchSize is the number of rows claimed and produced together. Default DefaultBatchSize.
	BatchSize int
	// Workers is how many batches are in flight at once while there is a backlog. Default
	// DefaultWorkers.
	Workers int
	// PollInterval is the fallback wake-up when no notification arrives. Default 1 s.
	PollInterval time.Duration
	// Retention is how long sent rows are kept (for inspection and replays) before cleanup
	// deletes them. Default 1 h.
	Retention time.Duration
	// CleanupInterval is how often sent rows past Retention are deleted. Default 1 min.
	CleanupInterval time.Duration
	// PublishTimeout bounds the wait for the broker to acknowledge one batch. Default 20 s.
	PublishTimeout time.Duration
	// Registerer receives the relay's metrics when set. Relays sharing a Registerer share
	// their metrics.
	Registerer prometheus.Registerer
}

func (c *Config) defaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	config.Default(&c.BatchSize, DefaultBatchSize)
	config.Default(&c.Workers, DefaultWorkers)
	config.Default(&c.PollInterval, DefaultPollInterval)
	config.Default(&c.Retention, DefaultRetention)
	config.Default(&c.CleanupInterval, DefaultCleanupInterval)
	config.Default(&c.PublishTimeout, DefaultPublishTimeout)
}

// Relay publishes outbox rows to Kafka. Create it with New and run it with Run.
type Relay struct {
	pool     *pgxpool.Pool
	producer *publish.Acked
	cfg      Config
	log      *slog.Logger
	m        metrics
	claimMu  sync.Mutex // see claim
}

// New returns a relay that reads pool's outbox table and produces with producer, which should
// be built by storage/kafka.NewClient (idempotent, acks=all), on its route publish.Acked. The
// relay does not close either.
func New(pool *pgxpool.Pool, producer *kgo.Client, cfg Config) *Relay {
	cfg.defaults()
	return &Relay{
		pool:     pool,
		producer: publish.NewAcked(producer),
		cfg:      cfg,
		log:      cfg.Logger.With("component", "outbox_relay"),
		m:        newMetrics(cfg.Registerer),
	}
}

// Run publishes outbox rows until ctx is done, then waits for its goroutines (listener,
// cleanup) and returns nil. Errors of the database or the broker are logged and retried; they
// never end Run. Run must not be called twice at once on one Relay.
func (r *Relay) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	wake := make(chan struct{}, 1)
	wg.Go(func() { r.listen(ctx, wake) })
	wg.Go(func() { r.cleanupLoop(ctx) })

	poll := time.NewTicker(r.cfg.PollInterval)
	defer poll.Stop()
	var failures int
	for {
		err := r.drain(ctx)
		r.refreshBacklog(ctx)
		if ctx.Err() != nil {
			return nil
		}
		wait := time.Duration(0)
		if err != nil {
			failures++
			wait = backoff(failures)
			r.log.Warn("publish outbox batch failed; retrying", "error", err, "attempt", failures, "retry_in", wait)
		} else {
			failures = 0
		}
		if wait > 0 {
			if !tick.Sleep(ctx, wait) {
				return nil
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-poll.C:
		}
	}
}

// drain publishes batches until one comes back short, with Config.Workers batches in flight
// while a backlog lasts: claiming rows, waiting for the broker and committing are round trips,
// and one batch at a time leaves the database and the broker idle in turn.
func (r *Relay) drain(ctx context.Context) error {
	n, err := r.publishBatch(ctx)
	if err != nil || n < r.cfg.BatchSize || r.cfg.Workers == 1 {
		for err == nil && n == r.cfg.BatchSize {
			n, err = r.publishBatch(ctx)
		}
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	for range r.cfg.Workers {
		g.Go(func() error {
			for {
				n, err := r.publishBatch(gctx)
				if err != nil || n < r.cfg.BatchSize {
					return err
				}
			}
		})
	}
	return g.Wait()
}

type outboxRow struct {
	seq       int64
	eventID   string
	topic     string
	key       string
	value     string
	createdAt time.Time
}

// publishBatch claims, produces and marks one batch; it returns how many rows it claimed.
func (r *Relay) publishBatch(ctx context.Context) (int, error) {
	tx, batch, wait, err := r.claim(ctx)
	if err != nil || len(batch) == 0 {
		return 0, err
	}
	// Not ctx: on shutdown the rollback of an unfinished batch must still reach the server.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	results := wait()
	acked := time.Now()

	// Mark what the broker acknowledged even if other records failed: those need no resend.
	sent := make([]int64, 0, len(batch))
	var produceErr error
	for i, err := range results {
		if err != nil {
			if produceErr == nil {
				produceErr = fmt.Errorf("produce event %s to %s: %w", batch[i].eventID, batch[i].topic, err)
			}
			continue
		}
		sent = append(sent, batch[i].seq)
	}
	if len(sent) > 0 {
		// The broker has the records now; finishing the bookkeeping must not be cut short by
		// shutdown, or they would be sent again after restart.
		markCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		// A batch that cannot be marked sent is produced again: it counts as failed.
		if _, err := tx.Exec(markCtx, "update outbox set sent_at = now() where seq = any($1)", sent); err != nil {
			r.m.errors.Inc()
			return len(batch), errors.Join(produceErr, fmt.Errorf("mark sent: %w", err))
		}
		if err := tx.Commit(markCtx); err != nil {
			r.m.errors.Inc()
			return len(batch), errors.Join(produceErr, fmt.Errorf("commit sent: %w", err))
		}
		r.m.published.Add(float64(len(sent)))
		for i, err := range results {
			if err == nil {
				r.m.latency.Observe(acked.Sub(batch[i].createdAt).Seconds())
			}
		}
	}
	if produceErr != nil {
		r.m.errors.Inc()
		return len(batch), produceErr
	}
	return len(batch), nil
}

// claim begins a transaction, locks the next batch of unsent rows in it and hands their records
// to the producer; wait returns each record's produce error once the broker has answered for
// all of them. Claims are serialized (claimMu), so the batches a relay has in flight enter the
// producer in seq order, which keeps each partition's records in that order while every batch
// succeeds. A claim that finds no row returns no transaction.
func (r *Relay) claim(ctx context.Context) (_ pgx.Tx, _ []outboxRow, wait func() []error, err error) {
	r.claimMu.Lock()
	defer r.claimMu.Unlock()
	// The claim's commit (marking the rows sent) does not wait for its WAL flush: if a crash of
	// Postgres loses it, the rows are unsent again and published twice, which every consumer
	// already takes (at least once, idempotent by event id); waiting held a worker per batch.
	tx, err := r.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: "begin; set local synchronous_commit = off"})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("begin: %w", err)
	}
	rows, err := tx.Query(ctx, `
select seq, event_id, topic, key, value::text, created_at
from outbox
where sent_at is null
order by seq
limit $1
for update skip locked`, r.cfg.BatchSize)
	var batch []outboxRow
	if err == nil {
		batch, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (outboxRow, error) {
			var x outboxRow
			err := row.Scan(&x.seq, &x.eventID, &x.topic, &x.key, &x.value, &x.createdAt)
			return x, err
		})
	}
	if err != nil || len(batch) == 0 {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		if err != nil {
			return nil, nil, nil, fmt.Errorf("claim rows: %w", err)
		}
		return nil, nil, nil, nil
	}

	recs := make([]*kgo.Record, len(batch))
	for i, x := range batch {
		recs[i] = Message{ID: x.eventID, Topic: x.topic, Key: x.key, Value: []byte(x.value)}.Record()
	}
	produceCtx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
	each := r.producer.Each(produceCtx, recs)
	return tx, batch, func() []error {
		errs := each()
		cancel()
		return errs
	}, nil
}

func (r *Relay) refreshBacklog(ctx context.Context) {
	var n int64
	// Counts the partial index outbox_unsent: cheap however many sent rows are retained.
	if err := r.pool.QueryRow(ctx, "select count(*) from outbox where sent_at is null").Scan(&n); err != nil {
		if ctx.Err() == nil {
			r.log.Warn("count outbox backlog", "error", err)
		}
		return
	}
	r.m.backlog.Set(float64(n))
}

// listen holds a LISTEN connection and signals wake on every notification, reconnecting with
// backoff after errors, until ctx is done.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	for failures := 0; ctx.Err() == nil; failures++ {
		err := r.listenOnce(ctx, wake, func() { failures = 0 })
		if ctx.Err() != nil {
			return
		}
		wait := backoff(failures + 1)
		r.log.Warn("outbox listener lost its connection; polling until it is back", "error", err, "retry_in", wait)
		if !tick.Sleep(ctx, wait) {
			return
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context, wake chan<- struct{}, listening func()) error {
	c, err := r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// Hijacked: the pool forgets the connection, so a listening session never serves another
	// caller, and closing it below ends the LISTEN.
	conn := c.Hijack()
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, "listen "+pgx.Identifier{Channel}.Sanitize()); err != nil {
		return err
	}
	listening()
	// Rows committed while nobody listened would otherwise wait for the next poll.
	notify(wake)
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		notify(wake)
	}
}

func notify(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default: // a wake-up is already pending; the drain it triggers covers this one too
	}
}

// cleanupLoop deletes sent rows older than Retention every CleanupInterval.
func (r *Relay) cleanupLoop(ctx context.Context) {
	tick.Every(ctx, r.cfg.CleanupInterval, func(ctx context.Context) {
		if n, err := r.Cleanup(ctx); err != nil {
			if ctx.Err() == nil {
				r.log.Warn("clean up outbox", "error", err)
			}
		} else if n > 0 {
			r.log.Debug("cleaned up outbox", "deleted", n)
		}
	})
}

// Cleanup deletes the rows sent more than Retention ago, in chunks, and returns how many. Run
// calls it every CleanupInterval; several relays may run it at once.
func (r *Relay) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for {
		// Rows are deleted oldest seq first. The seq bound (the first row created inside the
		// retention window) keeps each pass to the old head of the table instead of scanning
		// every retained row for sent_at, which has no index.
		tag, err := r.pool.Exec(ctx, `
delete from outbox where seq in (
	select seq from outbox
	where seq < coalesce((select seq from outbox where created_at >= now() - $1::interval order by seq limit 1),
	                     9223372036854775807)
	  and sent_at < now() - $1::interval
	order by seq
	limit $2
	for update skip locked)`, r.cfg.Retention, cleanupChunk)
		if err != nil {
			return total, fmt.Errorf("delete sent outbox rows: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < cleanupChunk {
			return total, nil
		}
	}
}

// backoff returns the wait before retry number attempt (1, 2, …): 100 ms doubling to 30 s,
// with ±20 % jitter so relays that failed together do not retry together.
func backoff(attempt int) time.Duration {
	d := 100 * time.Millisecond << min(attempt-1, 16)
	d = min(d, maxBackoff)
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

type metrics struct {
	backlog   prometheus.Gauge
	published prometheus.Counter
	errors    prometheus.Counter
	latency   prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		backlog: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "carehub", Subsystem: "outbox", Name: "backlog",
			Help: "Outbox rows not yet published to Kafka.",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "carehub", Subsystem: "outbox", Name: "published_total",
			Help: "Outbox rows published to Kafka and marked sent.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "carehub", Subsystem: "outbox", Name: "publish_errors_total",
			Help: "Outbox batches that failed to publish (retried with backoff).",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "carehub", Subsystem: "outbox", Name: "publish_latency_seconds",
			Help:    "Time from an outbox row's creation to the broker's acknowledgement of its record.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14), // 1 ms … ~150 s
		}),
	}
	if reg != nil {
		m.backlog = telemetry.Shared(reg, m.backlog)
		m.published = telemetry.Shared(reg, m.published)
		m.errors = telemetry.Shared(reg, m.errors)
		m.latency = telemetry.Shared(reg, m.latency)
	}
	return m
}
