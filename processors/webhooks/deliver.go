package webhooks

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/ids"
	"carehub/kernel/phi"
	"carehub/kernel/tick"
)

// The worker pool. Deliveries are claimed a subscription at a time: a lane is up to LaneBatch of
// one subscription's due deliveries in seq order, marked delivering under this dispatcher's
// lease. A subscription has at most one lane in the whole cluster (a claim skips subscriptions
// with delivering rows, and claims are serialized by an advisory lock), so its deliveries are
// attempted in order, PerSubscription at a time, by one dispatcher. A lane stops as soon as an
// outcome leaves its subscription paused, disabled or deleted, handing its unattempted rows back.

// claimLock is the pg_advisory_xact_lock key that serializes claims ("whclaim!").
const claimLock int64 = 0x7768636c61696d21

// claimed is one delivery of a lane.
type claimed struct {
	id, eventID    string
	body           []byte
	schedulePos    int
	attemptCount   int
	eventCreatedAt time.Time
}

// lane is one subscription's claimed deliveries and how to reach it.
type lane struct {
	webhookID, orgID string
	items            []claimed

	mu      sync.Mutex
	url     string
	secrets []string   // current first, then the rotated-out one while it still signs
	reader  phi.Reader // the patient data the subscription may carry (phi.go)
}

func (l *lane) target() (string, []string, phi.Reader) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.url, l.secrets, l.reader
}

func (d *Dispatcher) claimLoop(ctx context.Context, lanes *sync.WaitGroup) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-d.wake:
		case <-timer.C:
		}
		for ctx.Err() == nil {
			free := d.cfg.MaxInFlight - int(d.active.Load())
			if free <= 0 {
				break // a finishing lane nudges
			}
			claimedLanes, err := d.claim(ctx, free)
			d.claimPasses.Add(1)
			if err != nil {
				if ctx.Err() == nil {
					d.logger.Warn("webhook claim failed", "err", err)
				}
				break
			}
			for _, l := range claimedLanes {
				d.active.Add(1)
				d.m.lanes.Inc()
				lanes.Go(func() {
					defer func() {
						d.active.Add(-1)
						d.m.lanes.Dec()
						d.nudge() // its subscription may have more due
					}()
					d.serve(ctx, l)
				})
			}
			if len(claimedLanes) < free {
				break
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(d.cfg.PollInterval)
	}
}

// claim returns up to n lanes. It first hands back deliveries whose lease expired (their
// dispatcher died mid-attempt), so they are claimed again in order.
func (d *Dispatcher) claim(ctx context.Context, n int) ([]*lane, error) {
	var lanes []*lane
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `select pg_advisory_xact_lock($1)`, claimLock); err != nil {
			return err
		}
		// statement_timestamp(), not now(): the transaction may have waited for the lock, and
		// due times written by transactions that committed meanwhile must count as due.
		tag, err := tx.Exec(ctx, `update webhook_deliveries set status = 'pending', lease_owner = null,
	lease_until = null, updated_at = statement_timestamp()
where status = 'delivering' and lease_until < statement_timestamp()`)
		if err != nil {
			return err
		}
		if k := tag.RowsAffected(); k > 0 {
			d.m.reclaimed.Add(float64(k))
			d.logger.Warn("webhook deliveries reclaimed from an expired lease", "deliveries", k)
		}
		rows, err := tx.Query(ctx, `
with lanes as (
	select w.id from webhooks w
	where w.deleted_at is null and w.status in ('active', 'failing')
		and exists (select 1 from webhook_deliveries d where d.webhook_id = w.id and d.status = 'pending'
			and d.next_attempt_at <= statement_timestamp())
		and not exists (select 1 from webhook_deliveries d where d.webhook_id = w.id and d.status = 'delivering')
	order by (select min(d.next_attempt_at) from webhook_deliveries d where d.webhook_id = w.id and d.status = 'pending'), w.id
	limit $1
),
picked as (
	select p.id from lanes l cross join lateral (
		select d.id from webhook_deliveries d
		where d.webhook_id = l.id and d.status = 'pending' and d.next_attempt_at <= statement_timestamp()
		order by d.seq limit $2
		for update skip locked
	) p
)
update webhook_deliveries d set status = 'delivering', lease_owner = $3,
	lease_until = statement_timestamp() + $4 * interval '1 millisecond', updated_at = statement_timestamp()
from picked p, webhooks w
where d.id = p.id and w.id = d.webhook_id
returning d.webhook_id, d.seq, d.id, d.event_id, d.body, d.schedule_pos, d.attempt_count, d.event_created_at,
	w.org_id, w.url, w.patient_scopes, w.patient_mode, `+secretColumns,
			n, d.cfg.LaneBatch, d.node, d.cfg.Lease.Milliseconds())
		if err != nil {
			return err
		}
		defer rows.Close()
		byHook := map[string]*lane{}
		seqs := map[string]int64{}
		for rows.Next() {
			var c claimed
			var webhookID, orgID, url, patientMode string
			var seq int64
			var patientScopes []string
			var stored storedSecrets
			if err := rows.Scan(append([]any{&webhookID, &seq, &c.id, &c.eventID, &c.body, &c.schedulePos, &c.attemptCount,
				&c.eventCreatedAt, &orgID, &url, &patientScopes, &patientMode}, stored.dest()...)...); err != nil {
				return err
			}
			l := byHook[webhookID]
			if l == nil {
				l = &lane{webhookID: webhookID, orgID: orgID, url: url, secrets: d.secrets(webhookID, stored),
					reader: phi.ReaderFrom(patientScopes, patientMode)}
				byHook[webhookID] = l
				lanes = append(lanes, l)
			}
			l.items = append(l.items, c)
			seqs[c.id] = seq
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, l := range lanes { // RETURNING has no order
			sortBySeq(l.items, seqs)
			for _, it := range l.items {
				d.held.add(it.id)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return lanes, nil
}

// secrets opens a subscription's signing secrets, or gives none when they do not open: its
// attempts then fail unsent (Sign refuses to sign with no secret) and are recorded as failures.
func (d *Dispatcher) secrets(webhookID string, st storedSecrets) []string {
	secrets, err := d.box.secrets(webhookID, st)
	if err != nil {
		d.logger.Error("webhook signing secret unreadable: is this node's sealing key the deployment's?",
			"webhook_id", webhookID, "err", err)
	}
	return secrets
}

func sortBySeq(items []claimed, seqs map[string]int64) {
	for i := 1; i < len(items); i++ {
		for j := i; j > 0 && seqs[items[j].id] < seqs[items[j-1].id]; j-- {
			items[j], items[j-1] = items[j-1], items[j]
		}
	}
}

// serve attempts a lane's deliveries in order, PerSubscription at a time.
func (d *Dispatcher) serve(ctx context.Context, l *lane) {
	inLane := make(chan struct{}, d.cfg.PerSubscription)
	var wg sync.WaitGroup
	var stop atomic.Bool
	for i, it := range l.items {
		if !d.acquire(ctx, inLane) {
			d.release(l.items[i:])
			break
		}
		if stop.Load() || !d.acquire(ctx, d.sem) {
			<-inLane
			d.release(l.items[i:])
			break
		}
		wg.Go(func() {
			defer func() { <-d.sem; <-inLane }()
			if !d.attempt(ctx, l, it) {
				stop.Store(true)
			}
		})
	}
	wg.Wait()
}

func (d *Dispatcher) acquire(ctx context.Context, sem chan struct{}) bool {
	if ctx.Err() != nil {
		return false
	}
	select {
	case sem <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// attempt sends one delivery and records the outcome. It reports whether the lane may go on.
func (d *Dispatcher) attempt(ctx context.Context, l *lane, it claimed) bool {
	url, secrets, reader := l.target()
	body, err := servedBody(ctx, d.guard, reader, it.body)
	if err != nil {
		// What the subscription may receive is unknown (Postgres unreachable): send nothing, and
		// hand the delivery back uncounted to be sent when it is known.
		d.logger.Warn("webhook delivery held back: its patient data cannot be checked", "delivery_id", it.id, "webhook_id", l.webhookID, "err", err)
		d.release([]claimed{it})
		return false
	}
	if it.attemptCount == 0 {
		d.m.firstAttemptLag.Observe(time.Since(it.eventCreatedAt).Seconds())
	}
	out := d.sender.send(ctx, url, it.eventID, body, secrets)
	if ctx.Err() != nil && out.StatusCode == 0 {
		// Stopping cut the attempt short: the outcome is unknown, and not the receiver's fault.
		// Hand the delivery back uncounted; it is sent again, with the same webhook-id.
		d.release([]claimed{it})
		return false
	}
	d.m.observe(out)
	// An answer that arrived is recorded even while stopping, so it is not sent again.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	st, err := d.recordOutcome(rctx, l, it, out)
	d.held.remove(it.id)
	if err != nil {
		// The lease runs out and the delivery is sent again: at least once.
		if rctx.Err() == nil {
			d.logger.Error("webhook outcome not recorded", "delivery_id", it.id, "webhook_id", l.webhookID, "err", err)
		}
		return false
	}
	l.mu.Lock()
	l.url, l.secrets, l.reader = st.url, st.secrets, st.reader
	l.mu.Unlock()
	return st.deliverable
}

// hookState is a subscription as an outcome left it.
type hookState struct {
	deliverable bool
	url         string
	secrets     []string
	reader      phi.Reader
}

// recordOutcome writes the attempt, moves the delivery on (succeeded, pending with its next
// attempt time, or failed) and updates the subscription's status and failure count, in one
// statement. The delivery moves only while this dispatcher still holds its lease; the attempt is
// recorded regardless, since it happened.
func (d *Dispatcher) recordOutcome(ctx context.Context, l *lane, it claimed, out outcome) (hookState, error) {
	status := DeliverySucceeded
	var delay time.Duration
	if !out.Succeeded() {
		next, ok := retryDelay(d.cfg.Schedule, it.schedulePos+1, out.RetryAfter)
		if ok {
			status, delay = DeliveryPending, next
		} else {
			status = DeliveryFailed
		}
	}
	var code *int
	if out.StatusCode != 0 {
		code = &out.StatusCode
	}
	var errText, respBody *string
	if out.Err != "" {
		errText = &out.Err
	}
	if out.StatusCode != 0 {
		respBody = &out.ResponseBody
	}
	var st hookState
	var hookStatus, project, patientMode string
	var patientScopes []string
	var deleted bool
	var stored storedSecrets
	err := d.pool.QueryRow(ctx, `
with att as (
	insert into webhook_attempts (id, delivery_id, webhook_id, org_id, status_code, latency_ms, error, response_body, attempted_at)
	values ($1, $2, $3, $4, $5, $6, $7, $8, $9)
),
dl as (
	update webhook_deliveries set
		status = $10,
		attempt_count = attempt_count + 1,
		schedule_pos = schedule_pos + 1,
		next_attempt_at = case when $10 = 'pending' then now() + $11 * interval '1 microsecond' else next_attempt_at end,
		last_attempt_at = $9,
		last_status_code = $5,
		completed_at = case when $10 = 'pending' then null else now() end,
		lease_owner = null, lease_until = null, updated_at = now()
	where id = $2 and status = 'delivering' and lease_owner = $12
)
update webhooks set
	failure_count = case when $13 then 0 else failure_count + 1 end,
	status = case
		when $14 then 'disabled'
		when status not in ('active', 'failing') then status
		when $13 then 'active'
		when failure_count + 1 >= $15 then 'paused'
		else 'failing' end,
	last_delivered_at = case when $13 then now() else last_delivered_at end,
	updated_at = now()
where id = $3
returning status, deleted_at is not null, url, project_id, patient_scopes, patient_mode, `+secretColumns,
		ids.New(ids.Attempt), it.id, l.webhookID, l.orgID, code, int(out.Latency.Milliseconds()), errText, respBody,
		out.AttemptedAt, status, delay.Microseconds(), d.node, out.Succeeded(), out.Gone(), PauseAfter,
	).Scan(append([]any{&hookStatus, &deleted, &st.url, &project, &patientScopes, &patientMode}, stored.dest()...)...)
	if err != nil {
		return st, err
	}
	st.secrets = d.secrets(l.webhookID, stored)
	st.reader = phi.ReaderFrom(patientScopes, patientMode)
	st.deliverable = !deleted && (hookStatus == StatusActive || hookStatus == StatusFailing)
	if out.Gone() {
		// Disabled subscriptions record no deliveries: every dispatcher's cache must know.
		if _, err := d.pool.Exec(ctx, `select pg_notify($1, $2)`, NotifyChannel, "sub:"+project); err != nil {
			d.logger.Warn("webhook notify failed", "err", err)
		}
	}
	return st, nil
}

// release hands claimed deliveries back, due as they were, without counting an attempt. It runs
// on its own short context: it matters most while the dispatcher is stopping.
func (d *Dispatcher) release(items []claimed) {
	if len(items) == 0 {
		return
	}
	idList := make([]string, len(items))
	for i, it := range items {
		idList[i] = it.id
		d.held.remove(it.id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := d.pool.Exec(ctx, `update webhook_deliveries set status = 'pending', lease_owner = null,
	lease_until = null, updated_at = now()
where id = any($1) and status = 'delivering' and lease_owner = $2`, idList, d.node); err != nil {
		// Not lost: the lease expires and another claim takes them.
		d.logger.Warn("webhook deliveries not handed back; their lease will expire", "deliveries", len(idList), "err", err)
	}
}

// renewLeases extends the leases of the deliveries this dispatcher holds every Lease/3, so only
// a dispatcher that stopped renewing (crashed, hung, cut off from Postgres) loses them. A
// delivery whose outcome could not be recorded is no longer held, so its lease runs out and it
// is sent again.
func (d *Dispatcher) renewLeases(ctx context.Context) error {
	tick.Every(ctx, d.cfg.Lease/3, func(ctx context.Context) {
		held := d.held.list()
		if len(held) == 0 {
			return
		}
		if _, err := d.pool.Exec(ctx, `update webhook_deliveries set lease_until = now() + $3 * interval '1 millisecond'
where id = any($1) and status = 'delivering' and lease_owner = $2`, held, d.node, d.cfg.Lease.Milliseconds()); err != nil && ctx.Err() == nil {
			d.logger.Warn("webhook lease renewal failed", "err", err)
		}
	})
	return nil
}

// heldSet is the deliveries a dispatcher has claimed and not yet finished with.
type heldSet struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

func (h *heldSet) add(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ids == nil {
		h.ids = map[string]struct{}{}
	}
	h.ids[id] = struct{}{}
}

func (h *heldSet) remove(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.ids, id)
}

func (h *heldSet) list() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.ids))
	for id := range h.ids {
		out = append(out, id)
	}
	return out
}
