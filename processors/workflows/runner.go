package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/config"
	"carehub/kernel/ids"
	"carehub/kernel/telemetry"
	"carehub/kernel/tick"
	"carehub/processors/agents"
	"carehub/storage/kafka"
)

// Defaults of RunnerConfig.
const (
	DefaultRunnerGroup    = "carehub-workflow-runner"
	DefaultRunnerClientID = "carehub-workflow-runner"
	DefaultConcurrency    = 8
	DefaultLease          = 30 * time.Second
	DefaultSweepInterval  = 10 * time.Second
	DefaultRequeueAfter   = 2 * time.Minute
	DefaultMaxAttempts    = 3
	// releaseTimeout bounds re-queueing the runs in hand when Run's context ends.
	releaseTimeout = 5 * time.Second
)

// RunnerConfig configures a Runner.
type RunnerConfig struct {
	Brokers     []string          // required
	Credentials kafka.Credentials // authenticate to brokers that require SASL
	ClientID    string            // default DefaultRunnerClientID
	ClientOpts  []kgo.Opt
	Group       string // default DefaultRunnerGroup
	// Service is the workflow service whose runs are executed (its pool and topics). Required.
	Service *Service
	// Agents runs run_agent steps; default agents.New on the service's pool and events topic.
	Agents *agents.Service
	// Concurrency is how many runs one runner executes at once. Default DefaultConcurrency.
	Concurrency int
	// Lease is how long a run stays this runner's without renewal; leases are renewed every
	// Lease/3 while a run executes. A dead runner's runs are resumed after it. Default
	// DefaultLease.
	Lease time.Duration
	// SweepInterval is how often expired leases and lost commands are looked for (also once at
	// start). Default DefaultSweepInterval.
	SweepInterval time.Duration
	// RequeueAfter is how long a run may stay QUEUED before its command is sent again. Default
	// DefaultRequeueAfter.
	RequeueAfter time.Duration
	// MaxAttempts is how many claims a run gets before an expired lease fails it. Default
	// DefaultMaxAttempts.
	MaxAttempts int
	Logger      *slog.Logger
	Registerer  prometheus.Registerer
}

func (c *RunnerConfig) defaults() {
	config.Default(&c.ClientID, DefaultRunnerClientID)
	config.Default(&c.Group, DefaultRunnerGroup)
	config.Default(&c.Concurrency, DefaultConcurrency)
	config.Default(&c.Lease, DefaultLease)
	config.Default(&c.SweepInterval, DefaultSweepInterval)
	config.Default(&c.RequeueAfter, DefaultRequeueAfter)
	config.Default(&c.MaxAttempts, DefaultMaxAttempts)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Agents == nil && c.Service != nil {
		c.Agents = agents.New(c.Service.pool, agents.Config{EventsTopic: c.Service.eventsTopic, Logger: c.Logger})
	}
}

// Runner is one member of the workflow runner consumer group: it consumes run commands, executes
// runs (up to Concurrency at once) and sweeps expired leases and lost commands.
//
// Offsets: records are processed concurrently, and a partition's offset advances only over a
// prefix of records whose runs have ended (or were skipped or handed back), so a committed
// offset never passes a run whose state is not durable. Commits are those marks, every second
// and when partitions are revoked. Runs of a revoked partition keep executing under their lease;
// the partition's new owner skips their redelivered commands (the lease is live).
type Runner struct {
	cfg RunnerConfig
	cl  *kgo.Client
	e   *engine
	log *slog.Logger
	t   tracker

	closeOnce sync.Once
}

// NewRunner builds a runner and its Kafka client; Run joins the group.
func NewRunner(cfg RunnerConfig) (*Runner, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("workflow runner: no brokers")
	}
	if cfg.Service == nil {
		return nil, errors.New("workflow runner: no workflow service")
	}
	cfg.defaults()
	r := &Runner{cfg: cfg, log: cfg.Logger.With("component", "workflow_runner")}
	r.t.parts = map[partitionKey]*partitionTrack{}
	r.e = &engine{s: cfg.Service, agents: cfg.Agents, owner: ids.New("rnr_"), lease: cfg.Lease, maxAttempts: cfg.MaxAttempts,
		log: r.log, m: newRunnerMetrics(cfg.Registerer)}
	opts := []kgo.Opt{
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Service.runsTopic),
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(time.Second),
		// A new group reads every retained command: finished runs are skipped cheaply.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsRevoked(r.revoked),
		kgo.OnPartitionsLost(r.lost),
	}
	cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: cfg.Brokers, Credentials: cfg.Credentials, ClientID: cfg.ClientID, Registerer: cfg.Registerer,
		Logger: cfg.Logger}, append(opts, cfg.ClientOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("workflow runner: %w", err)
	}
	r.cl = cl
	return r, nil
}

// Close leaves the group and closes the Kafka client. Run calls it on return; it is idempotent.
func (r *Runner) Close() { r.closeOnce.Do(r.cl.Close) }

// Run consumes commands and executes runs until ctx ends. Then it stops the runs in hand at
// their next step boundary (a wait ends at once), re-queues them so another runner resumes them,
// commits what is done, leaves the group and returns nil.
func (r *Runner) Run(ctx context.Context) error {
	defer r.Close()
	var wg sync.WaitGroup
	wg.Go(func() { r.sweepLoop(ctx) })
	slots := make(chan struct{}, r.cfg.Concurrency)
	for ctx.Err() == nil {
		// Take one slot (waiting for a run to end if all are busy), then as many more as are
		// free, and poll at most that many records.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			continue
		}
		n := 1
	more:
		for n < r.cfg.Concurrency {
			select {
			case slots <- struct{}{}:
				n++
			default:
				break more
			}
		}
		fetches := r.cl.PollRecords(ctx, n)
		if fetches.IsClientClosed() {
			break
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) {
				r.log.Warn("fetch failed", "topic", topic, "partition", partition, "error", err)
			}
		})
		used := 0
		fetches.EachRecord(func(rec *kgo.Record) {
			used++
			p := r.t.add(rec)
			wg.Go(func() {
				defer func() { <-slots }()
				r.process(ctx, rec)
				r.t.done(r.cl, p, rec)
			})
		})
		for range n - used {
			<-slots
		}
	}
	wg.Wait()
	cctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := r.cl.CommitMarkedOffsets(cctx); err != nil {
		r.log.Warn("commit on shutdown failed; the commands will be redelivered and skipped", "error", err)
	}
	return nil
}

// process handles one command: claim, execute, end. It never returns an error: whatever goes
// wrong leaves the run in a state the sweeper or a redelivery resolves.
func (r *Runner) process(ctx context.Context, rec *kgo.Record) {
	var cmd Command
	if err := json.Unmarshal(rec.Value, &cmd); err != nil || !ids.Valid(ids.Run, cmd.RunID) {
		r.log.Error("skipping malformed run command", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset)
		return
	}
	log := r.log.With("run_id", cmd.RunID)
	defer func() {
		if v := recover(); v != nil {
			log.Error("workflow run panicked; left to its lease", "panic", fmt.Sprint(v))
		}
	}()
	st, err := r.e.claim(ctx, cmd.RunID)
	if err != nil {
		if ctx.Err() == nil {
			log.Error("claim workflow run failed; the sweeper will retry it", "error", err)
		}
		return
	}
	if st == nil {
		r.e.m.skipped.Inc()
		log.Debug("run command skipped: run finished or held elsewhere", "attempt", cmd.Attempt)
		return
	}
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := r.heartbeat(rctx, cancel, st)
	err = r.e.execute(rctx, st)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, errLost) || errors.Is(context.Cause(rctx), errLost):
		log.Info("workflow run stopped: cancelled or taken over")
	case ctx.Err() != nil:
		// Stopping: hand the run back at once rather than after its lease.
		rel, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if _, err := r.e.requeue(rel, st.run.ID, st, "runner stopping"); err != nil {
			log.Warn("re-queue on stop failed; the run resumes after its lease", "error", err)
		}
	default:
		log.Error("workflow run interrupted by an error; it resumes after its lease", "error", err)
	}
}

// heartbeat renews st's lease every Lease/3 until stopped; when the run is no longer this
// runner's (cancelled, taken over) it cancels the run with errLost.
func (r *Runner) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, st *runState) (stop func()) {
	hctx, hcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(r.cfg.Lease / 3)
		defer t.Stop()
		for {
			select {
			case <-hctx.Done():
				return
			case <-t.C:
			}
			tag, err := r.e.s.pool.Exec(hctx, `update workflow_runs set lease_until = now() + make_interval(secs => $4)
where id = $1 and status = 'RUNNING' and lease_owner = $2 and attempts = $3`, st.run.ID, r.e.owner, st.attempts, r.cfg.Lease.Seconds())
			switch {
			case err != nil:
				if hctx.Err() == nil {
					r.log.Warn("lease renewal failed", "run_id", st.run.ID, "error", err)
				}
			case tag.RowsAffected() == 0:
				cancel(errLost)
				return
			}
		}
	}()
	return func() { hcancel(); <-done }
}

// sweepLoop sweeps at start and every SweepInterval until ctx ends.
func (r *Runner) sweepLoop(ctx context.Context) {
	tick.NowAndEvery(ctx, r.cfg.SweepInterval, func(ctx context.Context) {
		if n, err := r.Sweep(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("sweep failed", "error", err)
		} else if n > 0 {
			r.log.Info("swept workflow runs", "count", n)
		}
	})
}

// Sweep re-queues RUNNING runs whose lease ran out (or FAILs those claimed MaxAttempts times) and
// re-sends the command of runs QUEUED for longer than RequeueAfter. Several runners may sweep at
// once: rows are taken with SKIP LOCKED. It returns how many runs it changed.
func (r *Runner) Sweep(ctx context.Context) (int, error) {
	n := 0
	rows, _ := r.e.s.pool.Query(ctx, `select id, attempts from workflow_runs where status = 'RUNNING' and lease_until < now()
order by lease_until limit 100`)
	type expired struct {
		id       string
		attempts int
	}
	var list []expired
	var x expired
	if _, err := pgx.ForEachRow(rows, []any{&x.id, &x.attempts}, func() error { list = append(list, x); return nil }); err != nil {
		return 0, fmt.Errorf("expired runs: %w", err)
	}
	for _, x := range list {
		if x.attempts >= r.cfg.MaxAttempts {
			// Claim it for the failure: claim sees attempts > MaxAttempts and ends it FAILED.
			if _, err := r.e.claim(ctx, x.id); err != nil {
				return n, err
			}
			n++
			continue
		}
		ok, err := r.e.requeue(ctx, x.id, nil, "lease expired")
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	// Lost commands: bump updated_at so one run is re-sent once per RequeueAfter.
	err := pgx.BeginFunc(ctx, r.e.s.pool, func(tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, `update workflow_runs w set updated_at = now() from (
	select id from workflow_runs where status = 'QUEUED' and updated_at < now() - make_interval(secs => $1)
	order by updated_at limit 100 for update skip locked
) q where w.id = q.id returning `+prefixed("w.", runColumns)+`, w.attempts`, r.cfg.RequeueAfter.Seconds())
		type queued struct {
			run      Run
			attempts int
		}
		var qs []queued
		var q queued
		if _, err := pgx.ForEachRow(rows, []any{&q.run.ID, &q.run.OrgID, &q.run.ProjectID, &q.run.WorkflowID, &q.run.Status,
			&q.run.Trigger, &q.run.Input, &q.run.Output, &q.run.Error, &q.run.DurationMs, &q.run.StartedAt, &q.run.CompletedAt,
			&q.attempts}, func() error {
			qs = append(qs, q)
			return nil
		}); err != nil {
			return fmt.Errorf("queued runs: %w", err)
		}
		for i := range qs {
			if err := r.e.s.enqueue(ctx, tx, &qs[i].run, qs[i].attempts+1, true); err != nil {
				return err
			}
		}
		n += len(qs)
		if len(qs) > 0 {
			r.log.Warn("re-sent commands of runs queued too long", "count", len(qs))
		}
		return nil
	})
	return n, err
}

// partitionKey names a partition.
type partitionKey struct {
	topic     string
	partition int32
}

// partitionTrack follows one assigned partition's records in offset order.
type partitionTrack struct {
	key     partitionKey
	revoked bool
	pending []pendingRecord
}

type pendingRecord struct {
	offset int64
	epoch  int32
	done   bool
}

// tracker marks offsets for commit only over a prefix of finished records per partition.
type tracker struct {
	mu    sync.Mutex
	parts map[partitionKey]*partitionTrack
}

func (t *tracker) add(rec *kgo.Record) *partitionTrack {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := partitionKey{rec.Topic, rec.Partition}
	p := t.parts[k]
	if p == nil {
		p = &partitionTrack{key: k}
		t.parts[k] = p
	}
	p.pending = append(p.pending, pendingRecord{offset: rec.Offset, epoch: rec.LeaderEpoch})
	return p
}

func (t *tracker) done(cl *kgo.Client, p *partitionTrack, rec *kgo.Record) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range p.pending {
		if p.pending[i].offset == rec.Offset {
			p.pending[i].done = true
			break
		}
	}
	var last *pendingRecord
	for len(p.pending) > 0 && p.pending[0].done {
		r := p.pending[0]
		last = &r
		p.pending = p.pending[1:]
	}
	if last == nil || p.revoked {
		return
	}
	cl.MarkCommitOffsets(map[string]map[int32]kgo.EpochOffset{p.key.topic: {p.key.partition: {Epoch: last.epoch, Offset: last.offset + 1}}})
}

// forget stops tracking partitions this member no longer owns: their records still in flight
// finish, but mark nothing.
func (t *tracker) forget(lost map[string][]int32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for topic, ps := range lost {
		for _, p := range ps {
			k := partitionKey{topic, p}
			if pt := t.parts[k]; pt != nil {
				pt.revoked = true
				delete(t.parts, k)
			}
		}
	}
}

func (r *Runner) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	r.t.forget(revoked)
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		r.log.Warn("commit on revoke failed; the commands will be redelivered and skipped", "error", err)
	}
}

func (r *Runner) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) { r.t.forget(lost) }

// runnerMetrics count what the runner does.
type runnerMetrics struct {
	runs     *prometheus.CounterVec
	steps    *prometheus.CounterVec
	skipped  prometheus.Counter
	requeued prometheus.Counter
}

func newRunnerMetrics(reg prometheus.Registerer) *runnerMetrics {
	m := &runnerMetrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "workflow_runner",
			Name: "runs_total", Help: "Workflow runs this runner ended, by end status."}, []string{"status"}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "workflow_runner",
			Name: "steps_total", Help: "Workflow steps executed, by step kind and outcome."}, []string{"step", "outcome"}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "workflow_runner",
			Name: "commands_skipped_total", Help: "Run commands skipped: the run had ended or was held by another runner."}),
		requeued: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "workflow_runner",
			Name: "runs_requeued_total", Help: "Runs handed back to the queue: by a stopping runner or after an expired lease."}),
	}
	if reg != nil {
		m.runs, m.steps = telemetry.Shared(reg, m.runs), telemetry.Shared(reg, m.steps)
		m.skipped, m.requeued = telemetry.Shared(reg, m.skipped), telemetry.Shared(reg, m.requeued)
	}
	return m
}

// prefixed qualifies every column of a comma-separated list with prefix.
func prefixed(prefix, columns string) string {
	parts := strings.Split(columns, ",")
	for i, c := range parts {
		parts[i] = prefix + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}
