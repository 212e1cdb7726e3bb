package webhooks

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/time/rate"

	"carehub/kernel/phi"
	"carehub/kernel/tick"
	"carehub/storage/postgres"
)

// The worker pool. Deliveries are claimed a subscription at a time: a lane is up to a few rounds
// of one subscription's due deliveries in seq order, marked delivering under this dispatcher's
// lease. A subscription has at most one lane in the whole cluster (a claim skips subscriptions
// with delivering rows, and claims are serialized by an advisory lock). How a lane is sent is
// the subscription's (Settings):
//   - concurrent (the default): up to MaxInFlight attempts at once, one event each, order best
//     effort; a failure is retried on its own schedule and holds nothing behind it;
//   - ordered: one POST at a time, in seq order, each carrying up to BatchSize events; a failure
//     ends the lane, and the subscription is not claimed again until its earliest pending
//     delivery is due, so the receiver sees the order the events were consumed in.
//
// RateLimit paces either (events a second, per subscription, on the dispatcher serving it). A
// busy lane refills itself from its subscription's due deliveries rather than ending and being
// claimed again (refill). The outcomes of a lane are recorded by its writer, as many at a time
// as have finished (outcomes.go). A lane stops as soon as an outcome leaves its subscription
// paused, disabled or deleted, handing its unattempted rows back. The dispatcher's MaxInFlight
// bounds the attempts of all lanes at once; a lane takes at most its own share, so a slow,
// failing or throttled subscription holds only its own slots.

// claimLock is the pg_advisory_xact_lock key that serializes claims ("whclaim!").
const claimLock int64 = 0x7768636c61696d21

// claimed is one delivery of a lane.
type claimed struct {
	seq            int64
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
	settings         Settings
	box              *inbox // what the consumer hands it (inbox.go); nil for an ordered lane

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
			began := time.Now()
			claimedLanes, err := d.claim(ctx, free)
			d.m.claimSeconds.Observe(time.Since(began).Seconds())
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
				d.laneStarted(l)
				lanes.Go(func() {
					defer func() {
						d.laneEnded(l.webhookID)
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

// claim returns up to n lanes, of subscriptions this dispatcher serves no lane of: a lane whose
// deliveries are all recorded, awaiting its refill, holds no delivering row, and a second lane
// of its subscription would break an ordered one's order. It first hands back deliveries whose
// lease expired (their dispatcher died mid-attempt), so they are claimed again in order.
func (d *Dispatcher) claim(ctx context.Context, n int) ([]*lane, error) {
	var lanes []*lane
	err := pgx.BeginTxFunc(ctx, d.pool, postgres.AsyncCommit, func(tx pgx.Tx) error {
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
		// An ordered subscription is claimed only when its earliest pending delivery is due, and
		// only the deliveries before its first one that is not due yet.
		rows, err := tx.Query(ctx, `
with lanes as (
	select w.id, w.ordered,
		least($2, case when w.ordered then 4 * w.batch_size else 8 * w.max_in_flight end) as lim,
		case when w.ordered then coalesce((select min(d.seq) from webhook_deliveries d where d.webhook_id = w.id
			and d.status = 'pending' and d.next_attempt_at > statement_timestamp()), 9223372036854775807)
			else 9223372036854775807 end as before_seq
	from webhooks w
	where w.deleted_at is null and w.status in ('active', 'failing')
		and exists (select 1 from webhook_deliveries d where d.webhook_id = w.id and d.status = 'pending'
			and d.next_attempt_at <= statement_timestamp())
		and not exists (select 1 from webhook_deliveries d where d.webhook_id = w.id and d.status = 'delivering')
		and w.id <> all($5::text[])
		and (not w.ordered or (select d.next_attempt_at from webhook_deliveries d where d.webhook_id = w.id
			and d.status = 'pending' order by d.seq limit 1) <= statement_timestamp())
	order by (select min(d.next_attempt_at) from webhook_deliveries d where d.webhook_id = w.id and d.status = 'pending'), w.id
	limit $1
),
picked as (
	select p.id from lanes l cross join lateral (
		select d.id from webhook_deliveries d
		where d.webhook_id = l.id and d.status = 'pending' and d.next_attempt_at <= statement_timestamp()
			and d.seq < l.before_seq
		order by d.seq limit l.lim
		for update skip locked
	) p
)
update webhook_deliveries d set status = 'delivering', lease_owner = $3,
	lease_until = statement_timestamp() + $4 * interval '1 millisecond', updated_at = statement_timestamp()
from picked p, webhooks w
where d.id = p.id and w.id = d.webhook_id
returning `+claimedColumns, n, d.cfg.LaneBatch, d.node, d.cfg.Lease.Milliseconds(), d.served())
		if err != nil {
			return err
		}
		lanes, err = d.scanLanes(rows)
		return err
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

// claimedColumns is what a claim returns of each delivery it marks delivering (d) and of its
// subscription (w), as scanLanes reads them.
const claimedColumns = `d.webhook_id, d.seq, d.id, d.event_id, d.body, d.schedule_pos, d.attempt_count, d.event_created_at,
	w.org_id, w.url, w.patient_scopes, w.patient_mode, w.ordered, w.max_in_flight, w.batch_size, w.rate_limit, ` + secretColumns

// scanLanes reads claimed deliveries into lanes, one a subscription, each in seq order, and
// holds them (their leases are renewed).
func (d *Dispatcher) scanLanes(rows pgx.Rows) ([]*lane, error) {
	defer rows.Close()
	var lanes []*lane
	byHook := map[string]*lane{}
	for rows.Next() {
		var c claimed
		var webhookID, orgID, url, patientMode string
		var patientScopes []string
		var stored storedSecrets
		var set Settings
		if err := rows.Scan(append([]any{&webhookID, &c.seq, &c.id, &c.eventID, &c.body, &c.schedulePos, &c.attemptCount,
			&c.eventCreatedAt, &orgID, &url, &patientScopes, &patientMode,
			&set.Ordered, &set.MaxInFlight, &set.BatchSize, &set.RateLimit}, stored.dest()...)...); err != nil {
			return nil, err
		}
		l := byHook[webhookID]
		if l == nil {
			l = &lane{webhookID: webhookID, orgID: orgID, url: url, secrets: d.secrets(webhookID, stored),
				reader: phi.ReaderFrom(patientScopes, patientMode), settings: set}
			byHook[webhookID] = l
			lanes = append(lanes, l)
		}
		l.items = append(l.items, c)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, l := range lanes { // RETURNING has no order
		slices.SortFunc(l.items, func(a, b claimed) int { return cmp.Compare(a.seq, b.seq) })
		for _, it := range l.items {
			d.held.add(it.id)
		}
	}
	return lanes, nil
}

// refill claims up to n more due deliveries of a lane's subscription for the lane, as claim
// would, under the same lock, unless another dispatcher has begun a lane of it (the lane must
// still hold deliveries when it refills, so no claim can have begun one since it started). It
// reads from after the lane's last seq on: the rows before it are the ones the lane sent, whose
// dead index entries (a queue's churn, until vacuum) a scan from the start would walk through.
// A retry due meanwhile waits for the subscription's next claim. The lane takes the
// subscription's URL, secrets and patient grant from the refill, as from every outcome write.
func (d *Dispatcher) refill(ctx context.Context, l *lane, n int, after int64) ([]claimed, error) {
	var more []claimed
	err := pgx.BeginTxFunc(ctx, d.pool, postgres.AsyncCommit, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `select pg_advisory_xact_lock($1)`, claimLock); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `
with picked as (
	select d.id from webhook_deliveries d join webhooks w on w.id = d.webhook_id
	where d.webhook_id = $1 and d.status = 'pending' and d.next_attempt_at <= statement_timestamp() and d.seq > $5
		and w.deleted_at is null and w.status in ('active', 'failing')
		and not exists (select 1 from webhook_deliveries x where x.webhook_id = $1 and x.status = 'delivering'
			and x.lease_owner <> $3)
		and (not w.ordered or d.seq < coalesce((select min(x.seq) from webhook_deliveries x where x.webhook_id = $1
			and x.status = 'pending' and x.next_attempt_at > statement_timestamp()), 9223372036854775807))
	order by d.seq limit $2
	for update of d skip locked
)
update webhook_deliveries d set status = 'delivering', lease_owner = $3,
	lease_until = statement_timestamp() + $4 * interval '1 millisecond', updated_at = statement_timestamp()
from picked p, webhooks w
where d.id = p.id and w.id = d.webhook_id
returning `+claimedColumns, l.webhookID, n, d.node, d.cfg.Lease.Milliseconds(), after)
		if err != nil {
			return err
		}
		lanes, err := d.scanLanes(rows)
		if len(lanes) == 1 {
			// The subscription as it is now: a URL changed, a secret rotated or a grant narrowed
			// since the lane began applies to what the lane sends from here on.
			fresh := lanes[0]
			more = fresh.items
			l.mu.Lock()
			l.url, l.secrets, l.reader = fresh.url, fresh.secrets, fresh.reader
			l.mu.Unlock()
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("refill deliveries: %w", err)
	}
	return more, nil
}

// serve sends a lane's deliveries as its subscription's settings say, and records their
// outcomes through the lane's writer.
func (d *Dispatcher) serve(ctx context.Context, l *lane) {
	set := l.settings
	size, inFlight := 1, min(max(set.MaxInFlight, 1), d.cfg.MaxInFlight)
	if set.Ordered {
		size, inFlight = max(set.BatchSize, 1), 1
	}
	limiter := d.limiter(l.webhookID, set.RateLimit, size)
	w := d.newOutcomeWriter(ctx, l)
	inLane := make(chan struct{}, inFlight)
	// Attempts sent and not yet recorded, bounded: sending runs ahead of the lane's writes by at
	// most sixteen rounds, so the writes stay small and the unrecorded few.
	unrecorded := make(chan struct{}, 16*inFlight)
	// A lane with work coming refills itself from its subscription's due deliveries before it
	// runs dry, for up to maxLaneLife: a busy subscription is not claimed anew (a claim
	// searches every subscription) every few hundred deliveries. The refill runs while the lane
	// sends what it has. It reads after the last delivery claimed or refilled (after): those
	// from the inbox were never pending.
	items, began, dry := l.items, time.Now(), false
	after := items[len(items)-1].seq
	refillN := laneSize(set, d.cfg.LaneBatch)
	var refilled chan []claimed // the refill in flight
	box := l.box
	take := func(more []claimed) {
		refilled = nil
		items, dry = append(items, more...), len(more) == 0
		if len(more) > 0 {
			after = more[len(more)-1].seq
		}
		if box != nil && len(more) < refillN { // caught up: what comes next may come straight
			box.accept()
		}
	}
	fromBox := func(more []claimed, spilled bool) {
		items, dry = append(items, more...), dry && !spilled
	}
	defer func() {
		if refilled != nil { // a refill still running when the lane stops: its deliveries go back
			d.release(<-refilled)
		}
		if box != nil { // what the consumer handed it since it last looked goes back too
			d.release(box.close())
		}
	}()
	var wg sync.WaitGroup
	for i := 0; ; i += size {
		if box != nil && len(items)-i < refillN {
			fromBox(box.take())
		}
		if box != nil && time.Since(began) >= maxLaneLife {
			items = append(items, box.close()...) // the rest of its life is sending what it has
			box = nil
		}
		if refilled == nil && !dry && len(items)-i < refillN && !w.stopped() && time.Since(began) < maxLaneLife {
			refilled = make(chan []claimed, 1)
			go func(ch chan<- []claimed, after int64) {
				more, err := d.refill(ctx, l, refillN, after)
				if err != nil && ctx.Err() == nil {
					d.logger.Warn("webhook lane refill failed", "webhook_id", l.webhookID, "err", err)
				}
				ch <- more
			}(refilled, after)
		}
		if refilled != nil {
			if i >= len(items) { // nothing left to send: wait for it
				take(<-refilled)
			} else {
				select {
				case more := <-refilled:
					take(more)
				default:
				}
			}
		}
		if i >= len(items) && box != nil && !w.stopped() {
			// Nothing to send and nothing to refill: wait for the consumer, for up to laneIdle,
			// without holding one of the dispatcher's lanes meanwhile.
			d.active.Add(-1)
			d.nudge()
			select {
			case <-box.ready:
			case <-time.After(laneIdle):
			case <-ctx.Done():
			}
			d.active.Add(1)
			if more, spilled := box.take(); len(more) > 0 || spilled {
				fromBox(more, spilled)
			} else if more := box.closeIfEmpty(); len(more) > 0 {
				fromBox(more, false)
			} else {
				box = nil // closed
			}
			i -= size // look again
			continue
		}
		if i >= len(items) {
			break
		}
		group := items[i:min(i+size, len(items))]
		if w.stopped() || !d.acquire(ctx, unrecorded) {
			d.release(items[i:])
			break
		}
		if w.stopped() || !d.acquire(ctx, inLane) {
			<-unrecorded
			d.release(items[i:])
			break
		}
		if limiter != nil && limiter.WaitN(ctx, len(group)) != nil {
			<-inLane
			<-unrecorded
			d.release(items[i:])
			break
		}
		if w.stopped() || !d.acquire(ctx, d.sem) {
			<-inLane
			<-unrecorded
			d.release(items[i:])
			break
		}
		// A failed attempt holds its slot until its outcome is written, so the attempt after the
		// tenth failure in a row (or a 410, or an ordered lane's failure) is not made; a
		// successful one frees it at once, its outcome written with others.
		wg.Go(func() {
			defer func() { <-d.sem; <-inLane }()
			d.attempt(ctx, l, group, set.Ordered && set.BatchSize > 1, w, func() { <-unrecorded })
		})
	}
	wg.Wait()
	w.close()
}

// maxLaneLife is how long a lane refills itself; then it ends and its subscription is claimed
// afresh (with its settings as they are then).
const maxLaneLife = 10 * time.Second

// laneSize is how many deliveries a claim or refill takes for a subscription: eight times its
// maxInFlight, or four of its batches (ordered), at most most.
func laneSize(set Settings, most int) int {
	if set.Ordered {
		return min(4*max(set.BatchSize, 1), most)
	}
	return min(8*max(set.MaxInFlight, 1), most)
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

// limiter is subscription id's rate limiter on this dispatcher (nil without a rate limit): a
// token bucket of perSecond events, with a burst of one POST (size events) or a twentieth of a
// second, whichever is more. A subscription's lanes follow one another, so the bucket outlives
// each; a changed limit replaces it.
func (d *Dispatcher) limiter(id string, perSecond, size int) *rate.Limiter {
	d.limitersMu.Lock()
	defer d.limitersMu.Unlock()
	if perSecond <= 0 {
		delete(d.limiters, id)
		return nil
	}
	burst := max(size, perSecond/20, 1)
	if l := d.limiters[id]; l != nil && l.Limit() == rate.Limit(perSecond) && l.Burst() == burst {
		return l
	}
	l := rate.NewLimiter(rate.Limit(perSecond), burst)
	if d.limiters == nil {
		d.limiters = map[string]*rate.Limiter{}
	}
	d.limiters[id] = l
	return l
}

// attempt sends group (one event, or an ordered subscription's batch as one POST) and hands the
// outcome to w.
func (d *Dispatcher) attempt(ctx context.Context, l *lane, group []claimed, batch bool, w *outcomeWriter, recorded func()) {
	written := false
	defer func() {
		if !written {
			recorded()
		}
	}()
	url, secrets, reader := l.target()
	bodies := make([][]byte, len(group))
	for i, it := range group {
		body, err := servedBody(ctx, d.guard, reader, it.body)
		if err != nil {
			// What the subscription may receive is unknown (Postgres unreachable): send nothing,
			// and hand the deliveries back uncounted to be sent when it is known.
			d.logger.Warn("webhook delivery held back: its patient data cannot be checked", "delivery_id", it.id, "webhook_id", l.webhookID, "err", err)
			d.release(group)
			w.stop()
			return
		}
		bodies[i] = body
	}
	for _, it := range group {
		if it.attemptCount == 0 {
			d.m.firstAttemptLag.Observe(time.Since(it.eventCreatedAt).Seconds())
		}
	}
	id, body := group[0].eventID, bodies[0]
	if batch {
		ids := make([]string, len(group))
		for i, it := range group {
			ids[i] = it.eventID
		}
		id, body = BatchBody(ids, bodies)
	}
	out, ok := d.sendAttempt(ctx, url, secrets, id, body)
	if !ok {
		// Hand the deliveries back uncounted; they are sent again, with the same webhook-id.
		d.release(group)
		w.stop()
		return
	}
	written = true
	done := w.add(group, out, recorded)
	if !out.Succeeded() {
		<-done
	}
}

// sendAttempt makes one attempt: body, as webhook-id id, to url signed with secrets. It reports
// false when stopping cut the attempt short: its outcome is unknown, and not the receiver's fault.
func (d *Dispatcher) sendAttempt(ctx context.Context, url string, secrets []string, id string, body []byte) (outcome, bool) {
	out := d.sender.send(ctx, url, id, body, secrets)
	if ctx.Err() != nil && out.StatusCode == 0 {
		return out, false
	}
	d.m.observe(out)
	return out, true
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
where id in (select id from webhook_deliveries where id = any($1) and status = 'delivering' and lease_owner = $2
	order by id for update)`, idList, d.node); err != nil {
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
		// A row another statement holds is skipped, not waited for: it is being recorded or
		// handed back, and the next renewal, a third of the lease later, takes it if not.
		if _, err := d.pool.Exec(ctx, `update webhook_deliveries set lease_until = now() + $3 * interval '1 millisecond'
where id in (select id from webhook_deliveries where id = any($1) and status = 'delivering' and lease_owner = $2
	for update skip locked)`, held, d.node, d.cfg.Lease.Milliseconds()); err != nil && ctx.Err() == nil {
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
