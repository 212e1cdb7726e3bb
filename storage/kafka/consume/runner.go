package consume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Defaults of Config.
const (
	DefaultMaxRecords = 1000
	maxBackoff        = 30 * time.Second
	// idleWait is the pause after a poll that returned only fetch errors (the broker is away):
	// polling again at once would spin on it and flood the log.
	idleWait = time.Second
)

// Source is what the runner polls: a *kgo.Client, or a *kgo.GroupTransactSession, built with
// GroupOpts' options (rebalances blocked while a poll is in hand).
type Source interface {
	PollRecords(ctx context.Context, maxPollRecords int) kgo.Fetches
	AllowRebalance()
}

// rewinder is a Source that can move its fetch positions back (*kgo.Client). A transactional
// session rewinds itself when its handler aborts the transaction.
type rewinder interface {
	SetOffsets(map[string]map[int32]kgo.EpochOffset)
}

// renewer is a Source that can fail beyond retrying (Transact): after a failed batch the runner
// has it replace itself, if it failed, before polling again.
type renewer interface {
	Renew() (renewed bool, err error)
}

// Config configures a Runner.
type Config struct {
	// Name is the consumer's label on the carehub_consumer_* metrics and in logs
	// ("eventlog", "audit"). Required.
	Name string
	// MaxRecords is the most records one poll (one handler call) takes. Default
	// DefaultMaxRecords.
	MaxRecords int
	// Records, when set, is asked before each poll for the most records it takes, up to
	// MaxRecords: for a consumer that sizes its polls by how long the last ones took.
	Records func() int
	// Backoff is the wait before a failed batch is polled again, by consecutive failure
	// (1, 2, …). Default Backoff.
	Backoff func(attempt int) time.Duration
	// Drain is how long the batch in hand may still take when Run's context ends: the handler's
	// context is cancelled only Drain after Run's, so a batch being handled (or polled just as
	// Run's context ended) is finished and committed, and the partitions' next owner need not
	// redo it. Zero cancels the handler with Run's context and drops the batch uncommitted: it
	// is read again by the next owner.
	Drain time.Duration
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Registerer receives the carehub_consumer_* metrics when set.
	Registerer prometheus.Registerer
}

// defaults fills the unset fields. (storage sits below kernel, so it does not use
// kernel/config.Default; the rule is the same.)
func (c *Config) defaults() {
	if c.MaxRecords <= 0 {
		c.MaxRecords = DefaultMaxRecords
	}
	if c.Backoff == nil {
		c.Backoff = Backoff
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Runner runs one member of a consumer group. Create it with New, run it with Run.
type Runner struct {
	src Source
	cfg Config
	log *slog.Logger
	m   *metrics
}

// New returns a runner polling src. It never closes src: its owner does, after Run returns.
func New(src Source, cfg Config) (*Runner, error) {
	if src == nil || cfg.Name == "" {
		return nil, errors.New("consume: a runner needs a source and a name")
	}
	cfg.defaults()
	return &Runner{src: src, cfg: cfg, log: cfg.Logger.With("consumer", cfg.Name), m: newMetrics(cfg.Registerer, cfg.Name)}, nil
}

// Skip logs a poison record by topic, partition and offset (never its value: it may hold
// patient data) and counts it in carehub_consumer_poison_records_total. Decode calls it.
func (r *Runner) Skip(rec *kgo.Record, err error) {
	r.m.poison.Inc()
	r.log.Error("skipping a record that cannot be decoded", "topic", rec.Topic, "partition", rec.Partition,
		"offset", rec.Offset, "error", reason(err))
}

// reason is err for the log without the bits of the value encoding/json quotes: a syntax
// error names the character it stopped at, a type error the field and types only.
func reason(err error) string {
	if se, ok := errors.AsType[*json.SyntaxError](err); ok {
		return fmt.Sprintf("invalid JSON at byte %d", se.Offset)
	}
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		return fmt.Sprintf("JSON field %q: %s where %s was expected", te.Field, te.Value, te.Type)
	}
	return err.Error()
}

// pollSize is the most records the next poll takes.
func (r *Runner) pollSize() int {
	if r.cfg.Records == nil {
		return r.cfg.MaxRecords
	}
	return min(max(r.cfg.Records(), 1), r.cfg.MaxRecords)
}

// Run polls until ctx ends or the client is closed and hands every poll's records to h wrapped
// in mw (the first is outermost) and in the metrics middleware. A batch h fails is rewound and
// handed over again after Config.Backoff (by a Transact source that failed beyond retrying, a
// new session); errors never end Run. Run returns nil, after letting
// the last poll's rebalance through (leaving the group waits for it). Call it once.
func (r *Runner) Run(ctx context.Context, h Handler, mw ...Middleware) error {
	h = r.wrap(h, mw)
	defer r.src.AllowRebalance()
	failures := 0
	for ctx.Err() == nil {
		recs, fetchFailed, closed := r.poll(ctx)
		if closed {
			return nil
		}
		switch {
		case len(recs) == 0:
			// A poll that returned only errors still blocks rebalances; nothing is in hand.
			r.src.AllowRebalance()
			if fetchFailed {
				sleep(ctx, idleWait)
			}
		case ctx.Err() != nil && r.cfg.Drain <= 0:
			// Stopping: the batch is left uncommitted for the next owner.
		default:
			if err := r.handle(ctx, h, recs); err != nil {
				if r.stopped(ctx, err, len(recs)) {
					return nil
				}
				failures = r.retry(ctx, err, recs, failures+1)
				continue
			}
			failures = 0
			r.src.AllowRebalance()
		}
	}
	return nil
}

// wrap wraps h in mw (the first outermost) and in the metrics middleware.
func (r *Runner) wrap(h Handler, mw []Middleware) Handler {
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return r.m.measure(h)
}

// poll polls once. It returns the records, whether a fetch failed (logged; a cancelled poll's
// errors are not failures), and whether the client is closed.
func (r *Runner) poll(ctx context.Context) (recs []*kgo.Record, fetchFailed, closed bool) {
	fetches := r.src.PollRecords(ctx, r.pollSize())
	if fetches.IsClientClosed() {
		return nil, false, true
	}
	fetches.EachError(func(topic string, partition int32, err error) {
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			fetchFailed = true
			r.log.Warn("fetch failed", "topic", topic, "partition", partition, "error", err)
		}
	})
	return fetches.Records(), fetchFailed, false
}

// stopped reports whether err is Run's context ending in the middle of a batch: nothing is
// wrong, and nothing was committed.
func (r *Runner) stopped(ctx context.Context, err error, records int) bool {
	if ctx.Err() == nil || !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	r.log.Info("stopped while handling a batch; left uncommitted for the next owner", "records", records)
	return true
}

// retry follows the failure (the failures-th in a row) of the batch recs: it rewinds recs, lets
// a rebalance through, waits Config.Backoff and has a renewable source renew itself. It returns
// the consecutive failures, those of renewing included.
func (r *Runner) retry(ctx context.Context, err error, recs []*kgo.Record, failures int) int {
	var wait time.Duration
	if failures == 1 && errors.Is(err, ErrNotCommitted) {
		// The group rebalanced under the batch (a member joined or left): routine in a
		// group, and the batch is read again at once. A commit refused again backs off.
		r.log.Info("the group rebalanced during a batch; it is read again", "records", len(recs))
	} else {
		wait = r.cfg.Backoff(failures)
		r.log.Error("handling a batch failed; rewound to retry", "error", err, "records", len(recs),
			"attempt", failures, "retry_in", wait)
	}
	r.rewind(recs)
	r.src.AllowRebalance()
	sleep(ctx, wait)
	return r.renew(ctx, failures)
}

// handle calls h with a context that ends Config.Drain after ctx (at once without a Drain).
func (r *Runner) handle(ctx context.Context, h Handler, recs []*kgo.Record) error {
	hctx, stop := r.drainContext(ctx)
	defer stop()
	return h(hctx, recs)
}

// drainContext is the handlers' context: it ends Config.Drain after ctx (with ctx without a
// Drain). stop releases it.
func (r *Runner) drainContext(ctx context.Context) (hctx context.Context, stop func()) {
	if r.cfg.Drain <= 0 {
		return ctx, func() {}
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	after := context.AfterFunc(ctx, func() { time.AfterFunc(r.cfg.Drain, cancel) })
	return hctx, func() { after(); cancel() }
}

// rewind moves the fetch position of every partition in recs back to its first record there,
// so the dropped batch is read again (by this member, or by the partition's next owner, which
// starts from the last commit anyway).
func (r *Runner) rewind(recs []*kgo.Record) {
	rw, ok := r.src.(rewinder)
	if !ok {
		return
	}
	first := map[string]map[int32]kgo.EpochOffset{}
	for _, rec := range recs {
		ps := first[rec.Topic]
		if ps == nil {
			ps = map[int32]kgo.EpochOffset{}
			first[rec.Topic] = ps
		}
		if at, ok := ps[rec.Partition]; !ok || rec.Offset < at.Offset {
			ps[rec.Partition] = kgo.EpochOffset{Epoch: rec.LeaderEpoch, Offset: rec.Offset}
		}
	}
	rw.SetOffsets(first)
}

// renew has a renewable source replace itself if it failed, retrying with Config.Backoff until
// it succeeds or ctx ends. It returns the consecutive failures, those of renewing included.
func (r *Runner) renew(ctx context.Context, failures int) int {
	rn, ok := r.src.(renewer)
	if !ok {
		return failures
	}
	for ctx.Err() == nil {
		renewed, err := rn.Renew()
		if err == nil {
			if renewed {
				r.log.Warn("replaced a source that failed beyond retrying")
			}
			return failures
		}
		failures++
		wait := r.cfg.Backoff(failures)
		r.log.Error("replacing a failed source failed; retrying", "error", err, "attempt", failures, "retry_in", wait)
		sleep(ctx, wait)
	}
	return failures
}

// Backoff is the default Config.Backoff: 100 ms doubling to 30 s, ±20 % jitter.
func Backoff(attempt int) time.Duration {
	d := min(100*time.Millisecond<<min(max(attempt, 1)-1, 16), maxBackoff)
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
