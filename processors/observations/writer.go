package observations

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/config"
	"carehub/schemas/kafka/observation"
	"carehub/storage/kafka"
	"carehub/storage/kafka/consume"
)

// DefaultGroup is the consumer group of the observation writer. Intake watches its lag for
// backpressure.
const DefaultGroup = observation.WriterGroup

// Defaults of WriterConfig.
const (
	DefaultMaxBatch = 5000
	// DefaultChunkSize is the most records one Postgres transaction stores.
	DefaultChunkSize = 1000
	// DefaultConcurrency is how many chunks one member stores at once: with DefaultMembers,
	// four COPYs at most, one more than the single member of three that came before.
	DefaultConcurrency = 2
	// DefaultMembers is how many members of the group one writer runs. A member stores a poll,
	// then produces its events and commits its Kafka transaction before it polls again, and
	// Postgres has nothing of its to store meanwhile; with two, one stores while the other
	// commits. Five alternated pairs of minute-long runs (2026-11-30), two members of two
	// chunks against one of three: stored +16.1, +1.2, −1.1, +3.5 and +3.9 %, the machine
	// 94–96 % busy against 89–92 %, accept → stored p50 307–342 ms against 416–427. (Two
	// members of three chunks each, six COPYs, raised Postgres's CPU a row in one pair of
	// three: −10.7 %.)
	DefaultMembers = 2
	// DefaultStoreTimeout bounds one attempt to store a chunk, and producing and committing a
	// poll's events. A poll in hand is finished even when the writer is asked to stop (the
	// runner's Drain), so a clean shutdown redelivers nothing.
	DefaultStoreTimeout = 15 * time.Second
	transactionTimeout  = 10 * time.Second
)

// WriterConfig configures a Writer.
type WriterConfig struct {
	Brokers     []string          // required
	Credentials kafka.Credentials // authenticate to brokers that require SASL
	Pool        *pgxpool.Pool     // required
	// Topic is consumed; default kafka.DefaultTopics().Observations.
	Topic string
	// Group is the consumer group; default DefaultGroup.
	Group string
	// EventsTopic receives the device.observation_received events; default
	// kafka.DefaultTopics().Events.
	EventsTopic string
	// DisableEvents stores observations without producing their events.
	DisableEvents bool
	// DeadLetterTopic receives the records whose values Postgres refuses, in the poll's Kafka
	// transaction; default kafka.DefaultTopics().ObservationsDLQ.
	DeadLetterTopic string
	ClientID        string // default "carehub-observation-writer"
	// TransactionalID is the id of the writer's Kafka transactions (its first member's; the
	// others' add -1, -2, …). Stable per instance, a restarted writer fences (aborts) what its
	// killed predecessor left open at once instead of after the transaction timeout; default:
	// random per process.
	TransactionalID string
	MaxBatch        int // most records one poll returns; default DefaultMaxBatch
	// ChunkSize is the most records of one Postgres transaction: a poll is split into chunks of
	// at most ChunkSize (and into Concurrency chunks when it is large enough); default
	// DefaultChunkSize.
	ChunkSize int
	// Concurrency is how many chunks a member stores at once, each in a transaction of its
	// own; default DefaultConcurrency. It needs as many pool connections.
	Concurrency int
	// Members is how many members of the group the writer runs, each a Kafka transaction of
	// its own on a share of the partitions; default DefaultMembers. It needs Members ×
	// Concurrency pool connections (the node's pool has max(8, 4 × GOMAXPROCS)).
	Members int
	// StoreTimeout: default DefaultStoreTimeout.
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
// Its loop is storage/kafka/consume's runner on a transactional source (consume.Transact). Per
// poll, in one Kafka transaction (the runner's Transaction middleware begins and ends it): the
// records, in chunks of at most ChunkSize, are Postgres transactions (a COPY into observations;
// on a conflict, a staged INSERT … ON CONFLICT (id) DO NOTHING), up to Concurrency at once;
// then the transaction produces the events of every stored record of the poll, new or stored
// before, and commits the poll's offsets. A failed poll aborts the transaction and is read
// again after a backoff; a crash before the commit redelivers the poll, which stores nothing
// twice and produces the same events again under the same ids in a new transaction; the
// aborted one is never read (consumers read committed). A session whose transaction failed
// beyond retrying is replaced by a new one with the same transactional id.
type Writer struct {
	cfg     WriterConfig
	members []*member
	store   *store

	logger *slog.Logger
	m      *writerMetrics
}

func (c *WriterConfig) defaults() {
	topics := kafka.DefaultTopics()
	config.Default(&c.Topic, topics.Observations)
	config.Default(&c.Group, DefaultGroup)
	config.Default(&c.EventsTopic, topics.Events)
	config.Default(&c.DeadLetterTopic, topics.ObservationsDLQ)
	config.Default(&c.ClientID, "carehub-observation-writer")
	if c.TransactionalID == "" {
		c.TransactionalID = kafka.TransactionalID("carehub-observation-writer-")
	}
	config.Default(&c.MaxBatch, DefaultMaxBatch)
	config.Default(&c.ChunkSize, DefaultChunkSize)
	config.Default(&c.Concurrency, DefaultConcurrency)
	config.Default(&c.Members, DefaultMembers)
	config.Default(&c.StoreTimeout, DefaultStoreTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// NewWriter returns a Writer; Run runs it.
func NewWriter(cfg WriterConfig) (*Writer, error) {
	if cfg.Pool == nil {
		return nil, errors.New("observation writer: no database pool")
	}
	cfg.defaults()
	logger := cfg.Logger.With("component", "observation_writer", "group", cfg.Group)
	m, err := newWriterMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("observation writer: %w", err)
	}
	opts := append(consume.GroupOpts(cfg.Group, cfg.Topic),
		// A transaction only produces a poll's events and commits its offsets. A killed writer's
		// open one holds back readers of the events topic (read committed) until it is fenced
		// or times out; keep that short.
		kgo.TransactionTimeout(transactionTimeout),
		// Intake produces each request in a Kafka transaction and kafka.NewClient reads
		// committed: an aborted request (413, client gone, broker failure) is never stored.
		// A new group starts at the beginning: every observation on the topic was answered 202.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if cfg.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(cfg.SessionTimeout), kgo.HeartbeatInterval(min(3*time.Second, cfg.SessionTimeout/3)))
	}
	w := &Writer{cfg: cfg, store: newStore(cfg.Pool), logger: logger, m: m}
	for i := range cfg.Members {
		mb, err := w.newMember(i, opts)
		if err != nil {
			w.Close()
			m.unregister(cfg.Registerer)
			return nil, fmt.Errorf("observation writer: %w", err)
		}
		w.members = append(w.members, mb)
	}
	return w, nil
}

// member is one member of the writer's group: a transactional session and the runner that
// polls it.
type member struct {
	src *consume.Transact
	r   *consume.Runner
	// assigned is set once the group has assigned the member partitions (awaitJoined).
	assigned atomic.Bool
}

// newMember makes the writer's i-th member; opts are the group's client options.
func (w *Writer) newMember(i int, opts []kgo.Opt) (*member, error) {
	cfg := w.cfg
	clientID, txnID := cfg.ClientID, cfg.TransactionalID
	if i > 0 { // distinct ids: its own transactions, and its own client metrics
		clientID, txnID = fmt.Sprintf("%s-%d", clientID, i), fmt.Sprintf("%s-%d", txnID, i)
	}
	mb := &member{}
	opts = append(slices.Clip(opts), kgo.TransactionalID(txnID),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
			for _, ps := range assigned {
				if len(ps) > 0 { // the balancer's first step may assign nothing
					mb.assigned.Store(true)
				}
			}
		}))
	src, err := consume.NewTransact(func(watch func(kgo.LogLevel, string)) (*kgo.GroupTransactSession, error) {
		return kafka.NewGroupTransactSession(kafka.ClientConfig{Brokers: cfg.Brokers, Credentials: cfg.Credentials, ClientID: clientID,
			Registerer: cfg.Registerer, Logger: cfg.Logger, Watch: watch}, opts...)
	}, cfg.StoreTimeout)
	if err != nil {
		return nil, err
	}
	// Drain: a poll in hand at shutdown is stored and committed (each store attempt and the
	// transaction's end are bounded by StoreTimeout), so a clean stop redelivers nothing.
	// Members share the runner's metrics (one consumer name).
	r, err := consume.New(src, consume.Config{Name: "observations", MaxRecords: cfg.MaxBatch, Drain: cfg.StoreTimeout,
		Logger: w.logger, Registerer: cfg.Registerer})
	if err != nil {
		src.Close()
		return nil, err
	}
	mb.src, mb.r = src, r
	return mb, nil
}

// Run consumes until ctx is done, then leaves the group and closes the clients; it returns
// ctx's error. A Writer runs once. (A member's runner never ends on a failed batch: it reads the
// batch again, with a new session when its own failed.)
func (w *Writer) Run(ctx context.Context) error {
	defer w.Close()
	w.awaitJoined(ctx)
	var wg sync.WaitGroup
	for _, mb := range w.members {
		wg.Go(func() {
			handle := func(ctx context.Context, recs []*kgo.Record) error { return w.handle(ctx, mb, recs) }
			_ = mb.r.Run(ctx, handle, mb.src.Transaction)
		})
	}
	wg.Wait()
	return ctx.Err()
}

// joinWait bounds awaitJoined: past it the members poll anyway, and a late one's join costs a
// rebalance, not correctness.
const joinWait = 20 * time.Second

// awaitJoined waits, before any member polls, until every member has been assigned partitions
// and all are in one generation of the group. Each member's client joins as it starts; a member
// that joined after another had polled would rebalance the poll in hand, which is aborted and
// read again (its records counted as duplicates, its skipped records skipped twice). The group's
// cooperative balancer moves partitions in two generations (revoked from one member, then
// assigned to the other), hence both conditions. Members that have not polled block no
// rebalance, so the group settles at once, or once the members of a killed writer have timed
// out.
func (w *Writer) awaitJoined(ctx context.Context) {
	if len(w.members) < 2 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, joinWait)
	defer cancel()
	joined := func() bool {
		gen := int32(-1)
		for i, mb := range w.members {
			id, g := mb.src.Session().Client().GroupMetadata()
			if id == "" || g < 0 || (i > 0 && g != gen) || !mb.assigned.Load() {
				return false
			}
			gen = g
		}
		return true
	}
	for !joined() {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				w.logger.Warn("the writer's members did not join one generation of the group in time; polling anyway", "wait", joinWait)
			}
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	// A session aborts its next transaction after any revocation, even one before its first
	// poll (the balancer's first step revoked the partitions the second member then got):
	// end an empty one, which clears that.
	for _, mb := range w.members {
		_, _ = mb.src.Session().End(ctx, kgo.TryAbort)
	}
}

// handle stores one poll's records, then produces their events in the poll's Kafka transaction
// (the Transaction middleware commits it with the poll's offsets when handle returns nil). The
// records, in chunks of at most ChunkSize, are Postgres transactions, up to Concurrency at
// once. A chunk that fails fails the poll: the transaction aborts and the whole poll is read
// again, which stores nothing twice. The records whose values Postgres refuses (the store
// leaves them out one by one) go to the dead-letter topic in the same transaction.
//
// consume.DeadLetter is not used here: it produces outside the transaction and isolates a
// refused record by handling the batch again by halves, while the store already isolates it
// row by row in its Postgres transaction; producing the record in the poll's transaction sets
// it aside exactly when its offsets are committed, as the events are.
func (w *Writer) handle(ctx context.Context, mb *member, recs []*kgo.Record) error {
	groups := chunks(recs, w.cfg.ChunkSize, w.cfg.Concurrency)
	results := make([]storeResult, len(groups))
	decoded := make([][]*kgo.Record, len(groups)) // in step with each group's messages
	errs := make([]error, len(groups))
	// skip counts a record that is not an observation message; the runner logs it by
	// position, with the reason only (never the value, nor the decoder's detail: they carry
	// patient data).
	skip := func(r *kgo.Record, err error) {
		w.m.skipped.WithLabelValues("invalid_message").Inc()
		mb.r.Skip(r, errors.Unwrap(err))
	}
	storeGroup := func(i int) {
		var msgs []observation.Message
		if decoded[i], msgs = decodeKept(groups[i], skip); len(msgs) > 0 {
			results[i], errs[i] = w.storeChunk(ctx, msgs)
		}
	}
	if len(groups) == 1 || w.cfg.Concurrency == 1 {
		for i := range groups {
			if storeGroup(i); errs[i] != nil {
				break
			}
		}
	} else {
		sem := make(chan struct{}, w.cfg.Concurrency)
		var wg sync.WaitGroup
		for i := range groups {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				storeGroup(i)
			})
		}
		wg.Wait()
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	out := w.deadLetters(decoded, results)
	var present []observation.Message
	for _, res := range results {
		present = append(present, res.present...)
	}
	if err := w.emit(ctx, mb, present, out); err != nil {
		return err
	}
	for _, r := range out { // by position and reason, never by value (patient data)
		d, _ := consume.ReadDeadLettered(r)
		w.logger.Error("ALERT: an observation record the store refused was set aside on the dead-letter topic; replay it once its cause is mended",
			"dlq_topic", r.Topic, "topic", d.SourceTopic, "partition", d.SourcePartition, "offset", d.SourceOffset, "error", d.Error)
	}
	return nil
}

// decodeKept decodes recs as consume.Decode does (a record that is not a message goes to skip)
// and returns the records decoded in step with their messages, so that a message the store
// refuses can be set aside as the record it came from.
func decodeKept(recs []*kgo.Record, skip func(*kgo.Record, error)) ([]*kgo.Record, []observation.Message) {
	kept := make([]*kgo.Record, 0, len(recs))
	msgs := make([]observation.Message, 0, len(recs))
	for _, r := range recs {
		m, err := observation.DecodeMessage(r.Value)
		if err != nil {
			skip(r, err)
			continue
		}
		kept, msgs = append(kept, r), append(msgs, m)
	}
	return kept, msgs
}

// deadLetters returns the dead-letter records of the messages the store refused: decoded[i] are
// the records of results[i]'s messages.
func (w *Writer) deadLetters(decoded [][]*kgo.Record, results []storeResult) []*kgo.Record {
	var out []*kgo.Record
	for i, res := range results {
		for _, rj := range res.rejected {
			out = append(out, consume.DeadLetterRecord(decoded[i][rj.index], w.cfg.DeadLetterTopic, "observations", rj.reason))
		}
	}
	return out
}

// emit produces the events of present, unless DisableEvents, and the dead-letter records dead
// in the poll's transaction.
func (w *Writer) emit(ctx context.Context, mb *member, present []observation.Message, dead []*kgo.Record) error {
	if w.cfg.DisableEvents {
		present = nil
	}
	if len(present) == 0 && len(dead) == 0 {
		return nil
	}
	// Not ctx alone: a stored batch's events are worth committing during shutdown too.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.StoreTimeout)
	defer cancel()
	recs := dead
	if len(present) > 0 {
		projects, err := w.store.projects.resolve(ctx, w.cfg.Pool, present)
		if err != nil {
			return err
		}
		recs = append(recs, receivedRecords(w.cfg.EventsTopic, present, projects)...)
	}
	if err := mb.src.Publisher().All(ctx, recs...); err != nil {
		return fmt.Errorf("observation writer: producing events: %w", err)
	}
	return nil
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

// storeChunk stores one chunk's messages in one attempt bounded by StoreTimeout; a failure
// fails the poll, which the runner reads again after a backoff.
func (w *Writer) storeChunk(ctx context.Context, msgs []observation.Message) (storeResult, error) {
	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, w.cfg.StoreTimeout)
	res, err := w.store.write(actx, msgs)
	cancel()
	if err != nil {
		return storeResult{}, fmt.Errorf("storing %d observations: %w", len(msgs), err)
	}
	w.m.batchSeconds.Observe(time.Since(start).Seconds())
	w.m.batchSize.Observe(float64(len(msgs)))
	// Counted as Postgres commits them: a batch whose Kafka transaction then aborts is read
	// again and finds them stored (duplicates).
	now := time.Now()
	for _, m := range res.stored {
		w.m.acceptToStored.Observe(now.Sub(m.ReceivedAt).Seconds())
	}
	w.m.stored.Add(float64(len(res.stored)))
	w.m.duplicates.Add(float64(res.duplicates))
	if res.unknownPatient > 0 { // set aside with the rejected ones
		w.m.skipped.WithLabelValues("unknown_patient").Add(float64(res.unknownPatient))
	}
	if n := len(res.rejected) - res.unknownPatient; n > 0 { // handle sets them aside (the dead-letter topic) and alerts
		w.m.skipped.WithLabelValues("rejected_by_database").Add(float64(n))
	}
	return res, nil
}

// Close leaves the group and closes the client without running; Run calls it on return. It is
// idempotent.
func (w *Writer) Close() {
	for _, mb := range w.members {
		mb.src.Close()
	}
}
