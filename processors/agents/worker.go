package agents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/config"
	"carehub/kernel/events"
	"carehub/kernel/fault"
	"carehub/storage/outbox"
)

// Defaults of WorkerConfig.
const (
	DefaultWorkers      = 2
	DefaultLease        = 30 * time.Second
	DefaultPollInterval = 500 * time.Millisecond
	DefaultMaxAttempts  = 3
)

// WorkerConfig configures a Worker. The zero value is usable.
type WorkerConfig struct {
	// Workers is how many sessions one node runs at once. Default DefaultWorkers.
	Workers int
	// Lease is how long a claimed session may stay RUNNING before another worker may take it
	// over (its worker is presumed dead). A run takes milliseconds; the lease only bounds how
	// long a crash delays the session. Default DefaultLease.
	Lease time.Duration
	// PollInterval is how often an idle worker looks for QUEUED sessions queued on other nodes
	// and for expired leases. Default DefaultPollInterval.
	PollInterval time.Duration
	// MaxAttempts is how many claims a session gets; a session whose lease expires after the
	// last one is FAILED. Default DefaultMaxAttempts.
	MaxAttempts int
	Logger      *slog.Logger
}

func (c *WorkerConfig) defaults() {
	config.Default(&c.Workers, DefaultWorkers)
	config.Default(&c.Lease, DefaultLease)
	config.Default(&c.PollInterval, DefaultPollInterval)
	config.Default(&c.MaxAttempts, DefaultMaxAttempts)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Worker runs async sessions: a bounded pool (Workers goroutines) that claims them from
// Postgres. Several nodes' workers share the queue safely (FOR UPDATE SKIP LOCKED).
type Worker struct {
	s   *Service
	cfg WorkerConfig
	log *slog.Logger
}

// Worker returns a worker for the service's async sessions; Run runs it.
func (s *Service) Worker(cfg WorkerConfig) *Worker {
	cfg.defaults()
	return &Worker{s: s, cfg: cfg, log: cfg.Logger.With("component", "agent_worker")}
}

// wakeWorkers tells this node's idle workers that a session was queued.
func (s *Service) wakeWorkers() {
	select {
	case s.wake() <- struct{}{}:
	default:
	}
}

func (s *Service) wake() chan struct{} { return s.wakeCh }

// Run claims and runs sessions until ctx ends, then waits for the sessions in hand to be written
// (a run takes milliseconds) and returns nil. The first claim pass of each goroutine is the
// start-up sweep: QUEUED sessions of a node that died and RUNNING ones whose lease ran out are
// taken at once.
func (w *Worker) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range w.cfg.Workers {
		wg.Go(func() { w.loop(ctx) })
	}
	wg.Wait()
	return nil
}

func (w *Worker) loop(ctx context.Context) {
	t := time.NewTicker(w.cfg.PollInterval)
	defer t.Stop()
	failures := 0
	for ctx.Err() == nil {
		claimed, err := w.runOne(ctx)
		if err != nil && ctx.Err() == nil {
			failures++
			w.log.Warn("agent worker: claim failed", "error", err, "failures", failures)
		} else {
			failures = 0
		}
		if claimed {
			// Others may be waiting on the same wake-up: pass it on, then look again at once.
			w.s.wakeWorkers()
			continue
		}
		select {
		case <-ctx.Done():
		case <-w.s.wake():
		case <-t.C:
		}
	}
}

// claimed is a session a worker holds.
type claimed struct {
	Session
	attempts int
}

// runOne claims one session and runs it. It reports whether it claimed one.
func (w *Worker) runOne(ctx context.Context) (bool, error) {
	c, took, err := w.claim(ctx)
	if err != nil || c == nil {
		return took, err
	}
	// The session is run and written under a context that outlives ctx by a little, so a
	// shutdown does not abandon a run that takes milliseconds; a crash leaves it to the lease.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.Lease)
	defer cancel()
	if err := w.execute(rctx, c); err != nil {
		w.log.Error("agent session left to its lease", "session_id", c.ID, "attempt", c.attempts, "error", err)
	}
	return true, nil
}

// claim takes the oldest QUEUED session, or RUNNING one whose lease ran out, moves it to
// RUNNING with a new lease and writes agent.session.updated, in one transaction. A session out of
// attempts is FAILED instead: then it returns nil and took true.
func (w *Worker) claim(ctx context.Context) (_ *claimed, took bool, _ error) {
	var out *claimed
	err := pgx.BeginFunc(ctx, w.s.pool, func(tx pgx.Tx) error {
		var c claimed
		err := tx.QueryRow(ctx, `with next as (
	select id from agent_sessions
	where status = 'QUEUED' or (status = 'RUNNING' and lease_until < now())
	order by started_at, id limit 1
	for update skip locked
)
update agent_sessions s set status = 'RUNNING', attempts = s.attempts + 1,
	lease_until = now() + make_interval(secs => $1), updated_at = now()
from next where s.id = next.id
returning s.id, s.org_id, s.project_id, s.agent_id, s.patient_id, s.input, s.started_at, s.attempts`, w.cfg.Lease.Seconds()).Scan(
			&c.ID, &c.OrgID, &c.ProjectID, &c.AgentID, &c.PatientID, &c.Input, &c.StartedAt, &c.attempts)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("claim agent session: %w", err)
		}
		c.Status, took = StatusRunning, true
		if c.attempts > w.cfg.MaxAttempts {
			msg := fmt.Sprintf("the agent run was interrupted %d times (its worker stopped before it finished); not retried",
				w.cfg.MaxAttempts)
			now := events.Now()
			c.Status, c.Error, c.CompletedAt = StatusFailed, &msg, &now
			if _, err := tx.Exec(ctx, `update agent_sessions set status = 'FAILED', error = $2, completed_at = $3, lease_until = null,
updated_at = now() where id = $1`, c.ID, msg, now); err != nil {
				return fmt.Errorf("fail agent session: %w", err)
			}
			w.log.Warn("agent session failed after repeated interruptions", "session_id", c.ID, "attempts", w.cfg.MaxAttempts)
			return w.s.writeEnd(ctx, tx, &c.Session, nil)
		}
		evs, err := sessionEvents(&c.Session, nil)
		if err != nil {
			return err
		}
		out = &c
		return outbox.AppendEvents(ctx, tx, w.s.eventsTopic, evs...)
	})
	if err != nil {
		return nil, false, err
	}
	return out, took, nil
}

// execute runs a claimed session and writes its end state, unless its lease was lost meanwhile
// (another worker took it over, or it was changed): then the result is dropped.
func (w *Worker) execute(ctx context.Context, c *claimed) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("agent run panicked: %v", r)
		}
	}()
	rows, _ := w.s.pool.Query(ctx, `select `+agentColumns+` from agents where id = $1`, c.AgentID)
	a, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Agent])
	if err != nil {
		return fmt.Errorf("agent %s: %w", c.AgentID, err)
	}
	ses := &c.Session
	var rep *Report
	_, pl, err := planRun(a, ses.Input)
	if err == nil {
		var as Assessment
		if as, err = w.s.assess(ctx, w.s.pool, a, ses.PatientID, pl); err == nil {
			rep, err = finish(ses, as)
		}
	}
	if fault.KindOf(err) == fault.KindValidation || fault.KindOf(err) == fault.KindConflict {
		// Checked when the session was queued; the agent or the stored input changed since.
		msg := fault.As(err).Message
		now := events.Now()
		zero := int32(0)
		ses.Status, ses.Error, ses.CompletedAt, ses.LatencyMs, ses.TokensUsed = StatusFailed, &msg, &now, &zero, &zero
	} else if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, w.s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `update agent_sessions set status = $2, output = $3, error = $4, latency_ms = $5, tokens_used = $6,
completed_at = $7, lease_until = null, updated_at = now() where id = $1 and status = 'RUNNING' and attempts = $8`,
			ses.ID, ses.Status, ses.Output, ses.Error, ses.LatencyMs, ses.TokensUsed, ses.CompletedAt, c.attempts)
		if err != nil {
			return fmt.Errorf("save agent session: %w", err)
		}
		if tag.RowsAffected() == 0 {
			w.log.Warn("agent session lease lost; result dropped", "session_id", ses.ID, "attempt", c.attempts)
			return nil
		}
		return w.s.writeEnd(ctx, tx, ses, rep)
	})
}
