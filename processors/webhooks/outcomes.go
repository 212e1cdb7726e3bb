package webhooks

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/ids"
	"carehub/kernel/phi"
	"carehub/storage/postgres"
)

// Outcomes: each lane's writer records what its attempts found, many at a time.

// hookState is a subscription as an outcome left it.
type hookState struct {
	deliverable bool
	url         string
	secrets     []string
	reader      phi.Reader
}

// finished is one attempt's outcome for the deliveries it carried; written is closed once it
// is recorded (or could not be).
type finished struct {
	group    []claimed
	out      outcome
	written  chan struct{}
	recorded func() // called once it is written
}

// outcomeWriter records a lane's outcomes: whatever has finished since its last write, in one
// statement, so a lane with many attempts in flight writes far fewer times than it sends. It
// stops the lane when an outcome leaves the subscription undeliverable, when an ordered lane's
// POST fails, or when a write fails (the leases then run out and the deliveries are sent again:
// at least once).
type outcomeWriter struct {
	d      *Dispatcher
	ctx    context.Context
	l      *lane
	halted atomic.Bool

	mu      sync.Mutex
	pending []finished
	kick    chan struct{}
	quit    chan struct{}
	writers sync.WaitGroup
}

// newOutcomeWriter starts l's writer: two writes at once (one waits for Postgres's commit while
// the other gathers). The order of writes does not matter, an ordered lane's included: a failed
// attempt holds its lane until its outcome is written, so nothing after it is sent meanwhile.
func (d *Dispatcher) newOutcomeWriter(ctx context.Context, l *lane) *outcomeWriter {
	w := &outcomeWriter{d: d, ctx: ctx, l: l, kick: make(chan struct{}, 1), quit: make(chan struct{})}
	for range 2 {
		w.writers.Go(w.run)
	}
	return w
}

func (w *outcomeWriter) stop()         { w.halted.Store(true) }
func (w *outcomeWriter) stopped() bool { return w.halted.Load() }

// add queues an outcome for the next write and returns what is closed once it is written.
func (w *outcomeWriter) add(group []claimed, out outcome, recorded func()) <-chan struct{} {
	f := finished{group, out, make(chan struct{}), recorded}
	w.mu.Lock()
	w.pending = append(w.pending, f)
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	return f.written
}

// close waits for the writer to end; every add has returned.
func (w *outcomeWriter) close() {
	close(w.quit)
	w.writers.Wait()
}

func (w *outcomeWriter) run() {
	for {
		select {
		case <-w.kick:
			w.drain()
		case <-w.quit:
			w.drain()
			return
		}
	}
}

// drain writes what is pending until nothing is.
func (w *outcomeWriter) drain() {
	for {
		// At most maxOutcomeWrite deliveries a write (and always one attempt): the other writer
		// takes the rest, and the lane's sending, bounded by what is unrecorded, goes on.
		w.mu.Lock()
		k, n := 0, 0
		for k < len(w.pending) && (k == 0 || n+len(w.pending[k].group) <= maxOutcomeWrite) {
			n += len(w.pending[k].group)
			k++
		}
		batch := slices.Clone(w.pending[:k])
		w.pending = w.pending[k:]
		w.mu.Unlock()
		if len(batch) == 0 {
			return
		}
		select { // another writer may take what finishes meanwhile
		case w.kick <- struct{}{}:
		default:
		}
		w.write(batch)
		for _, f := range batch {
			close(f.written)
			f.recorded()
		}
	}
}

// maxOutcomeWrite bounds the deliveries one outcome write records (an ordered lane's batch of
// up to 100 counts as its events).
const maxOutcomeWrite = 256

func (w *outcomeWriter) write(batch []finished) {
	d, l := w.d, w.l
	// An answer that arrived is recorded even while stopping, so it is not sent again.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), 10*time.Second)
	defer cancel()
	d.m.outcomeWrites.Observe(float64(countItems(batch)))
	st, err := d.recordOutcomes(rctx, l, batch)
	for try := 1; err != nil && postgres.Transient(err) && try < 3 && rctx.Err() == nil; try++ {
		time.Sleep(time.Duration(try) * 20 * time.Millisecond)
		st, err = d.recordOutcomes(rctx, l, batch)
	}
	for _, f := range batch {
		for _, it := range f.group {
			d.held.remove(it.id)
		}
	}
	if err != nil {
		if rctx.Err() == nil {
			d.logger.Error("webhook outcomes not recorded", "deliveries", countItems(batch), "webhook_id", l.webhookID, "err", err)
		}
		w.stop()
		return
	}
	l.mu.Lock()
	l.url, l.secrets, l.reader = st.url, st.secrets, st.reader
	l.mu.Unlock()
	if !st.deliverable {
		w.stop()
	}
	for _, f := range batch {
		if l.settings.Ordered && !f.out.Succeeded() {
			w.stop() // the receiver must not see what comes after before this
		}
	}
}

func countItems(batch []finished) int {
	n := 0
	for _, f := range batch {
		n += len(f.group)
	}
	return n
}

// Statements that update several deliveries never deadlock one another: releases lock them in
// id order, lease renewals skip the rows locked by others, and an outcome write touches only its
// lane's attempted deliveries, which nothing else updates but a renewal.

// recordOutcomes writes the attempts, moves each delivery on (succeeded, pending with its next
// attempt time, or failed) and updates the subscription's failure count and status, in one
// statement. A delivery moves only while this dispatcher still holds its lease; the attempt is
// recorded regardless, since it happened. Outcomes are in the order they finished: the failure
// count becomes the failures after the last success (or grows by all of them, with no success).
// Its commit does not wait for the WAL to reach disk: a crash that loses it leaves the
// deliveries delivering under a lease that runs out, and they are sent again with the same
// webhook-id, as after any crash mid-attempt. Claims and refills commit the same way.
func (d *Dispatcher) recordOutcomes(ctx context.Context, l *lane, batch []finished) (hookState, error) {
	n := countItems(batch)
	attemptIDs, deliveryIDs, statuses := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
	delays := make([]int64, 0, n)
	var cols attemptColumns
	var t tally
	for _, f := range batch {
		out := f.out
		t.add(out)
		// A batch moves as one: the same next attempt (one jittered delay), so it is due again
		// whole, from the schedule of its most tried event.
		pos := 0
		for _, it := range f.group {
			pos = max(pos, it.schedulePos)
		}
		status, delay := outcomeStatus(d.cfg.Schedule, pos, out)
		for _, it := range f.group {
			attemptIDs, deliveryIDs, statuses = append(attemptIDs, ids.New(ids.Attempt)), append(deliveryIDs, it.id), append(statuses, status)
			delays = append(delays, delay.Microseconds())
			cols.add(&out)
		}
	}
	var st hookState
	var hookStatus, project, patientMode string
	var patientScopes []string
	var deleted bool
	var stored storedSecrets
	err := pgx.BeginTxFunc(ctx, d.pool, postgres.AsyncCommit, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `
with r as (
	select * from unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::timestamptz[], $6::int[], $7::int[], $8::text[], $9::text[])
		as t(attempt_id, delivery_id, status, delay_us, attempted_at, status_code, latency_ms, error, response_body)
),
att as (
	insert into webhook_attempts (id, delivery_id, webhook_id, org_id, status_code, latency_ms, error, response_body, attempted_at)
	select attempt_id, delivery_id, $10, $16, status_code, latency_ms, error, response_body, attempted_at from r
),
dl as (
	update webhook_deliveries d set
		status = r.status,
		attempt_count = d.attempt_count + 1,
		schedule_pos = d.schedule_pos + 1,
		next_attempt_at = case when r.status = 'pending' then now() + r.delay_us * interval '1 microsecond' else d.next_attempt_at end,
		last_attempt_at = r.attempted_at,
		last_status_code = r.status_code,
		completed_at = case when r.status = 'pending' then null else now() end,
		lease_owner = null, lease_until = null, updated_at = now()
	from r
	where d.id = r.delivery_id and d.status = 'delivering' and d.lease_owner = $17
),
upd as (
	`+hookOutcome(10)+`
	returning status, deleted_at is not null as deleted, url, project_id, patient_scopes, patient_mode, `+secretColumns+`
)
select * from upd
union all
select status, deleted_at is not null, url, project_id, patient_scopes, patient_mode, `+secretColumns+`
from webhooks where id = $10 and not exists (select 1 from upd)`,
			attemptIDs, deliveryIDs, statuses, delays, cols.at, cols.codes, cols.latencies, cols.errs, cols.bodies,
			l.webhookID, t.trailingArg(), t.failures, t.gone, PauseAfter, t.success, l.orgID, d.node,
		).Scan(append([]any{&hookStatus, &deleted, &st.url, &project, &patientScopes, &patientMode}, stored.dest()...)...)
	})
	if err != nil {
		return st, err
	}
	st.secrets = d.secrets(l.webhookID, stored)
	st.reader = phi.ReaderFrom(patientScopes, patientMode)
	st.deliverable = !deleted && (hookStatus == StatusActive || hookStatus == StatusFailing)
	if t.gone || t.failures > 0 && hookStatus != StatusActive {
		// Disabled subscriptions record no deliveries, and only active ones are sent to by the
		// consumer (fast.go): every dispatcher's cache must know.
		if _, err := d.pool.Exec(ctx, `select pg_notify($1, $2)`, NotifyChannel, "sub:"+project); err != nil {
			d.logger.Warn("webhook notify failed", "err", err)
		}
	}
	return st, nil
}

// attemptColumns are attempts as a statement's array parameters, one element each.
type attemptColumns struct {
	at           []time.Time
	codes        []*int32
	latencies    []int32
	errs, bodies []*string
}

// add appends out's attempt: no status code or body when nothing answered, no error text when
// it succeeded.
func (c *attemptColumns) add(out *outcome) {
	var code *int32
	var errText, body *string
	if out.StatusCode != 0 {
		status := int32(out.StatusCode)
		code, body = &status, &out.ResponseBody
	}
	if out.Err != "" {
		errText = &out.Err
	}
	c.at, c.codes, c.latencies = append(c.at, out.AttemptedAt), append(c.codes, code), append(c.latencies, int32(out.Latency.Milliseconds()))
	c.errs, c.bodies = append(c.errs, errText), append(c.bodies, body)
}

// tally is a subscription's outcomes, in the order they finished, as hookOutcome takes them.
type tally struct {
	trailing, failures int // failures after the last success, and in all
	success, gone      bool
}

func (t *tally) add(out outcome) {
	if out.Succeeded() {
		t.success, t.trailing = true, 0
	} else {
		t.trailing++
		t.failures++
	}
	t.gone = t.gone || out.Gone()
}

// trailingArg is hookOutcome's trailing failures: -1 when none succeeded, so the count grows by
// the failures.
func (t tally) trailingArg() int {
	if !t.success {
		return -1
	}
	return t.trailing
}

// hookOutcome is the update of a subscription by outcomes, its parameters numbered from first:
// the subscription's id, the failures after the last success (or -1: none succeeded), the
// failures, whether one was a 410, PauseAfter, and whether one succeeded. It sets the failure
// count and the status (active, failing, paused at PauseAfter failures in a row, disabled by a
// 410) and the last delivery time. It is skipped when nothing would change: successes to an
// active subscription whose last delivery time was set within the second, so concurrent writes
// never wait on the subscription's row.
func hookOutcome(first int) string {
	id, trailing, failures, gone, pauseAfter, success := first, first+1, first+2, first+3, first+4, first+5
	count := fmt.Sprintf("(case when $%d::int >= 0 then $%d::int else failure_count + $%d::int end)", trailing, trailing, failures)
	return fmt.Sprintf(`update webhooks set
		failure_count = %[1]s,
		status = case
			when $%[4]d then 'disabled'
			when status not in ('active', 'failing') then status
			when %[1]s = 0 then 'active'
			when %[1]s >= $%[5]d then 'paused'
			else 'failing' end,
		last_delivered_at = case when $%[6]d then now() else last_delivered_at end,
		updated_at = now()
	where id = $%[2]d and not ($%[3]d::int = 0 and failure_count = 0 and status = 'active' and not $%[4]d
		and coalesce(last_delivered_at >= now() - interval '1 second', false))`, count, id, trailing, gone, pauseAfter, success)
}
