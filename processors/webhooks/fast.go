package webhooks

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/storage/postgres"
	"carehub/storage/postgres/pgcopy"
)

// First attempts in the consumer. A healthy concurrent subscription's deliveries are sent by the
// consumer that reads their events, before it records them: each delivery is then written once,
// finished, with its attempt, instead of inserted pending, claimed and finished (three versions
// of the row and its indexes). The backlog of such a subscription stays in Kafka, as consumer
// lag, and is sent at the consumer's pace. The offsets are committed only after the deliveries
// are recorded, so a crash before that sends them again with the same webhook-id: at least once,
// as after any crash mid-attempt. Recorded means on disk: a poll's last record waits for the WAL,
// unlike a lane's claims and outcomes (which a lost commit turns into a retry), because nothing
// reads these events again once their offsets are committed, and a failed first attempt whose
// row a crash of Postgres took would never be retried. The WAL is flushed in order, so that one
// flush makes the poll's earlier records durable too: the chunks recorded while the rest are sent
// commit without waiting for it (a crash of Postgres that takes one also takes the poll's offsets,
// and the poll is read again).
//
// A subscription is sent to this way while it is active, concurrent (maxInFlight above one, no
// rate limit), has nothing queued (no pending or delivering delivery: retries and backlogs go
// through the schedule, its lanes and their order) and has no lane on this dispatcher; its
// events come from one partition (the topic is keyed by project), so from one consumer, and the
// consumer sends at most maxInFlight of them at once. Finished attempts are recorded fastChunk (or
// a quarter of the poll, if more) at a time while the rest are sent. The consumer waits for a
// poll's attempts until one has run for FastWait, or the poll for fastCap: then those still
// running are recorded delivering under this dispatcher's lease and their outcomes written when
// they end, and those not begun are recorded pending for a lane, so a slow endpoint holds the
// consumer (and the subscriptions behind it) for about FastWait. A subscription whose attempt
// failed or outran the wait goes through the schedule for fastCooldown. When recording fails
// (Postgres down, or refusing one of the batch's events), the attempts made are kept (sent) and
// the batch, read again, records them rather than sending them again.

// fastCooldown is how long a subscription that failed or was slow is left to the schedule.
const fastCooldown = 10 * time.Second

// maxCooling is how many cooling subscriptions are kept before the expired ones are dropped.
const maxCooling = 1000

// maxUnrecorded is how many attempts whose deliveries were not recorded are kept (two polls'
// worth) before they are forgotten, and their deliveries sent again when read again.
const maxUnrecorded = 2 * pollRecords

// States of a fastItem: waiting to be sent, being sent, sent (its result in res), or dropped by
// the consumer before it was sent.
const (
	fastWaiting int32 = iota
	fastSending
	fastSent
	fastDropped
)

// fastItem is one delivery the consumer sends.
type fastItem struct {
	fl    *fastLane
	row   newDelivery
	state atomic.Int32
	began atomic.Int64  // when its attempt began, in Unix nanoseconds
	res   fastResult    // its result, once sent
	sent  chan struct{} // closed once sent
	taken bool          // the consumer has its result (the consumer's only)
}

// fastResult is an attempt's outcome; sent is false when nothing was sent (the patient data could
// not be checked, or the dispatcher is stopping) and the delivery is pending, unattempted.
type fastResult struct {
	out  outcome
	sent bool
}

// fastLane is one subscription's deliveries of a poll.
type fastLane struct {
	l     *lane
	items []*fastItem
	next  atomic.Int64
	cool  bool // an attempt failed or was slow (the consumer's only)
}

// fastRun is a poll's first attempts.
type fastRun struct {
	lanes   []*fastLane
	items   int
	stop    atomic.Bool
	stopped chan struct{}  // closed when stop is set
	results chan *fastItem // each item once sent
	sent    atomic.Int64   // items sent
	begun   atomic.Int64   // items whose attempts were begun, or found sent before
	// next is closed once all but the last 1/nextLead of the items' attempts are begun: the
	// consumer polls and begins the next events then (Dispatcher.consume), so that their first
	// attempts follow these without a gap.
	next     chan struct{}
	nextOnce sync.Once
	// ready is closed once every item is sent, or FastWait after the poll's attempts were begun:
	// then finishFast would not wait long (the consumer ends the poll rather than wait for the
	// next one's events, Dispatcher.consume).
	ready     chan struct{}
	readyOnce sync.Once
	readyTime *time.Timer
}

// fastEligible reports whether the consumer may send sub's deliveries itself, as the cache knows
// it (pickFast then asks Postgres whether it has any queued, and how it is now).
func (d *Dispatcher) fastEligible(sub cachedSub, now time.Time) bool {
	return d.cfg.FastWait >= 0 && sub.status == StatusActive && fastMode(sub.settings) && now.After(d.cool[sub.id]) &&
		!d.servedHere(sub.id)
}

// fastMode reports settings the consumer sends by: concurrent, more than one at once, no limit.
func fastMode(set Settings) bool { return !set.Ordered && set.MaxInFlight > 1 && set.RateLimit == 0 }

// pickFast splits rows into the deliveries the consumer sends itself and the rest.
func (d *Dispatcher) pickFast(ctx context.Context, rows []newDelivery, subs map[string]cachedSub) ([]*fastLane, []newDelivery, error) {
	now := time.Now()
	hooks, evIDs := make([]string, 0, len(rows)), make([]string, 0, len(rows))
	for _, r := range rows {
		if d.fastEligible(subs[r.webhookID], now) {
			hooks = append(hooks, r.webhookID)
			evIDs = append(evIDs, r.ev.ID)
		}
	}
	if len(hooks) == 0 {
		return nil, rows, nil
	}
	// In one round trip: deliveries recorded already (an event read again), the subscriptions
	// with deliveries queued, and the subscriptions as they are now, as a lane's claim reads
	// them, so a secret rotated, a URL changed or a grant narrowed a moment ago applies, whether
	// or not the cache has heard.
	//
	// A subscription's events are one project's, so one partition's, and a poll's ids (ULIDs,
	// made as events are accepted) lie in a narrow range: the deliveries recorded in that range
	// are few (those of the poll's events read again, and of the previous poll's last ones)
	// and are read in one range of the unique key per subscription. A range holding more rows
	// than the poll has deliveries (old events replayed among new ones) is left, and the
	// poll's deliveries are probed one by one in a second round trip. Probing each of a
	// poll's deliveries was 5 % of the consumer's time on one busy subscription.
	subIDs := slices.Compact(slices.Sorted(slices.Values(hooks)))
	limit := len(evIDs) + 1
	b := &pgx.Batch{}
	// The range's ends are taken in SQL, in the column's collation, which orders its index.
	b.Queue(`
with poll as (select min(e) first, max(e) last from unnest($2::text[]) e)
(select d.webhook_id, d.event_id from webhook_deliveries d, poll
	where d.webhook_id = any($1::text[]) and d.event_id between poll.first and poll.last limit $3)
union all
select w, '' from unnest($1::text[]) w
where exists (select 1 from webhook_deliveries d where d.webhook_id = w and d.status = 'pending')
	or exists (select 1 from webhook_deliveries d where d.webhook_id = w and d.status = 'delivering')`,
		subIDs, evIDs, limit)
	b.Queue(laneTargetsQuery, subIDs)
	queued, recorded, targets, err := d.readPick(ctx, b)
	if err != nil {
		return nil, nil, err
	}
	if len(recorded) >= limit {
		recorded, err = d.recordedOneByOne(ctx, hooks, evIDs)
		if err != nil {
			return nil, nil, err
		}
	}
	var lanes []*fastLane
	byHook := map[string]*fastLane{}
	rest := rows[:0:0]
	items := make([]fastItem, len(hooks)) // the poll's items in one allocation: at most one an eligible row
	for _, r := range rows {
		sub := subs[r.webhookID]
		t := targets[sub.id]
		switch {
		case !d.fastEligible(sub, now) || queued[sub.id] || t == nil || !t.active || !fastMode(t.settings):
			rest = append(rest, r)
		case recorded[[2]string{sub.id, r.ev.ID}]:
			// Recorded already: its outcome is the schedule's.
		default:
			fl := byHook[sub.id]
			if fl == nil {
				fl = &fastLane{l: &lane{webhookID: sub.id, orgID: sub.orgID, settings: t.settings, url: t.url,
					secrets: t.secrets, reader: t.reader}}
				byHook[sub.id] = fl
				lanes = append(lanes, fl)
			}
			it := &items[0]
			items = items[1:]
			*it = fastItem{fl: fl, row: r, sent: make(chan struct{})}
			fl.items = append(fl.items, it)
		}
	}
	return lanes, rest, nil
}

// readPick sends pickFast's round trip and reads it.
func (d *Dispatcher) readPick(ctx context.Context, b *pgx.Batch) (queued map[string]bool, recorded map[[2]string]bool, targets map[string]*laneTarget, err error) {
	res := d.pool.SendBatch(ctx, b)
	defer res.Close()
	queued, recorded, err = scanRecorded(res.Query())
	if err != nil {
		return nil, nil, nil, fmt.Errorf("look up queued deliveries: %w", err)
	}
	if targets, err = d.scanLaneTargets(res.Query()); err != nil {
		return nil, nil, nil, fmt.Errorf("look up subscriptions: %w", err)
	}
	return queued, recorded, targets, nil
}

// recordedOneByOne returns which of the deliveries (hooks[i], evIDs[i]) are recorded, one
// probe of the unique key each.
func (d *Dispatcher) recordedOneByOne(ctx context.Context, hooks, evIDs []string) (map[[2]string]bool, error) {
	_, recorded, err := scanRecorded(d.pool.Query(ctx, `
select d.webhook_id, d.event_id from unnest($1::text[], $2::text[]) r(webhook_id, event_id)
	join webhook_deliveries d on d.webhook_id = r.webhook_id and d.event_id = r.event_id`, hooks, evIDs))
	if err != nil {
		return nil, fmt.Errorf("look up recorded deliveries: %w", err)
	}
	return recorded, nil
}

// scanRecorded reads pickFast's look-up: the subscriptions with deliveries queued, and the
// deliveries recorded already.
func scanRecorded(rows pgx.Rows, err error) (map[string]bool, map[[2]string]bool, error) {
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	queued, recorded := map[string]bool{}, map[[2]string]bool{}
	for rows.Next() {
		var hook, ev string
		if err := rows.Scan(&hook, &ev); err != nil {
			return nil, nil, err
		}
		if ev == "" {
			queued[hook] = true
		} else {
			recorded[[2]string{hook, ev}] = true
		}
	}
	return queued, recorded, rows.Err()
}

// subSlots are a subscription's first attempts in flight: a slot is held by each goroutine that
// sends its deliveries, from its first attempt to its last, whichever poll they are of.
type subSlots struct {
	n  int // the subscription's maxInFlight when they were made
	ch chan struct{}
}

// fastSlots returns the slots of l's subscription. A maxInFlight changed since they were made
// gets new ones: until the attempts on the old ones end, both are in use.
func (d *Dispatcher) fastSlots(l *lane) chan struct{} {
	s, ok := d.slots[l.webhookID]
	if ok && s.n == l.settings.MaxInFlight {
		return s.ch
	}
	if len(d.slots) > maxCooling {
		for id, s := range d.slots {
			if len(s.ch) == 0 {
				delete(d.slots, id)
			}
		}
	}
	s = subSlots{n: l.settings.MaxInFlight, ch: make(chan struct{}, l.settings.MaxInFlight)}
	d.slots[l.webhookID] = s
	return s.ch
}

// startFast sends lanes' deliveries in the background, at most each subscription's maxInFlight
// at once, those of the polls before included: the consumer begins a poll's attempts while the
// poll before's last ones are in flight (Dispatcher.consume), and they take their slots as those
// end. A delivery attempted before whose record failed (sent) is not sent again.
func (d *Dispatcher) startFast(ctx context.Context, lanes []*fastLane) *fastRun {
	run := &fastRun{lanes: lanes, stopped: make(chan struct{}), ready: make(chan struct{}), next: make(chan struct{})}
	for _, fl := range lanes {
		run.items += len(fl.items)
	}
	run.results = make(chan *fastItem, run.items)
	if run.items == 0 {
		run.markReady()
		close(run.next)
	} else {
		run.readyTime = time.AfterFunc(max(d.cfg.FastWait, 0), run.markReady)
	}
	for _, fl := range lanes {
		for _, it := range fl.items {
			if res, ok := d.sent[[2]string{fl.l.webhookID, it.row.ev.ID}]; ok {
				it.finish(res, fastWaiting, run)
				run.markBegun()
			}
		}
		slots := d.fastSlots(fl.l)
		for range min(fl.l.settings.MaxInFlight, len(fl.items)) {
			go func() {
				if !run.slot(ctx, slots) {
					return
				}
				defer func() { <-slots }()
				for {
					i := int(fl.next.Add(1)) - 1
					if i >= len(fl.items) || !run.slot(ctx, d.sem) {
						return
					}
					if it := fl.items[i]; it.state.CompareAndSwap(fastWaiting, fastSending) {
						run.markBegun()
						it.began.Store(time.Now().UnixNano())
						it.finish(d.sendFast(ctx, fl.l, it), fastSending, run)
					}
					<-d.sem
				}
			}()
		}
	}
	return run
}

// slot takes one of sem, the dispatcher's attempts in flight (shared with its lanes) or a
// subscription's (fastSlots), unless the consumer stopped waiting for run meanwhile.
func (run *fastRun) slot(ctx context.Context, sem chan struct{}) bool {
	if run.stop.Load() {
		return false
	}
	select {
	case sem <- struct{}{}:
		return true
	case <-run.stopped:
	case <-ctx.Done():
	}
	return false
}

// finish sets the item's result and hands it to the consumer, unless the consumer dropped it.
func (it *fastItem) finish(res fastResult, from int32, run *fastRun) {
	it.res = res
	if it.state.CompareAndSwap(from, fastSent) {
		close(it.sent)
		run.results <- it
		if run.sent.Add(1) == int64(run.items) {
			run.markReady()
		}
	}
}

func (run *fastRun) markReady() { run.readyOnce.Do(func() { close(run.ready) }) }

// 1/nextLead of a poll's attempts are still to begin when the consumer begins the next poll.
// Beginning one (a fetch, the events decoded, a look-up in Postgres) takes about 15-20 ms on two
// busy cores. Begun once the last attempt had begun, the subscription's slots emptied meanwhile
// and a third of a core idled in a drain (docs/PERFORMANCE.md, "twelfth session"). A quarter of
// a poll of 4,000 is about 40 ms of attempts at 25,000 a second. The next poll's attempts wait
// for the slots these hold, so they still follow them.
const nextLead = 4

// markBegun counts an item begun.
func (run *fastRun) markBegun() {
	if run.begun.Add(1) == int64(run.items-run.items/nextLead) {
		run.nextOnce.Do(func() { close(run.next) })
	}
}

// sendFast makes one delivery's first attempt.
func (d *Dispatcher) sendFast(ctx context.Context, l *lane, it *fastItem) fastResult {
	body, err := servedEvent(ctx, d.guard, l.reader, it.row.ev, it.row.body)
	if err != nil {
		d.logger.Warn("webhook delivery held back: its patient data cannot be checked", "webhook_id", l.webhookID, "err", err)
		return fastResult{}
	}
	d.m.firstAttemptLag.Observe(time.Since(it.row.ev.CreatedAt).Seconds())
	out, ok := d.sendAttempt(ctx, l.url, l.secrets, it.row.ev.ID, body)
	return fastResult{out: out, sent: ok}
}

// fastRow is a delivery the consumer sent (or meant to), as it is recorded.
type fastRow struct {
	it     *fastItem
	status string // succeeded, pending, failed, or delivering (still being sent)
	delay  time.Duration
	res    fastResult
}

// fastChunk is how many finished first attempts are recorded at a time while the rest are sent.
const fastChunk = 256

// finishFast records run's deliveries as their attempts finish, a chunk at a time (fastChunk, or
// a quarter of the poll if more: each chunk costs a transaction and its subscriptions' updates),
// until all have or an attempt has run for FastWait (or the poll for fastCap): then it records
// each of the rest as it stands, pending if not begun and delivering if its attempt goes on (its
// outcome is written when it ends). The last record is durable. It updates the subscriptions by
// their outcomes.
func (d *Dispatcher) finishFast(ctx context.Context, run *fastRun) (int, error) {
	if run.items == 0 {
		d.sizePolls(0) // nothing sent here: polls as large as recording likes
		return 0, nil
	}
	began := time.Now()
	check := time.NewTicker(max(d.cfg.FastWait/4, time.Millisecond))
	defer check.Stop()
	var rows []fastRow
	var firstErr error
	inserted := 0
	chunk := max(fastChunk, run.items/4)
	record := func(final bool) {
		if len(rows) == 0 || !final && len(rows) < chunk {
			return
		}
		if firstErr == nil {
			n, err := d.recordFast(ctx, rows, final)
			inserted, firstErr = inserted+n, err
		}
		d.afterRecord(ctx, rows, firstErr)
		rows = rows[:0]
	}
	seen, capped := 0, false
wait:
	for seen < run.items {
		select {
		case it := <-run.results:
			seen++
			it.taken = true
			rows = append(rows, d.finishedRow(it))
			if seen < run.items { // the last is recorded durably, below
				record(false)
			}
		case now := <-check.C:
			capped = now.Sub(began) >= fastCap(d.cfg.FastWait)
			if capped || run.slow(now, d.cfg.FastWait) {
				break wait
			}
		case <-ctx.Done():
			break wait
		}
	}
	run.stop.Store(true)
	close(run.stopped)
	if run.readyTime != nil {
		run.readyTime.Stop()
	}
	// What is left is recorded as it stands. A subscription is left to the schedule when its own
	// attempt was slow, or when it had more than the poll could send; the others' deliveries not
	// sent are pending, and their lanes send them.
	for _, fl := range run.lanes {
		for _, it := range fl.items {
			switch {
			case it.taken:
			case it.state.CompareAndSwap(fastWaiting, fastDropped):
				fl.cool = fl.cool || capped
				rows = append(rows, fastRow{it: it, status: DeliveryPending})
			case it.state.Load() == fastSent:
				it.taken = true
				rows = append(rows, d.finishedRow(it))
			default: // still being sent: recorded delivering, its outcome when it ends
				d.held.add(it.row.id)
				rows = append(rows, fastRow{it: it, status: DeliveryDelivering})
			}
		}
	}
	record(true)
	now := time.Now()
	d.sizePolls(now.Sub(began))
	for _, fl := range run.lanes {
		if fl.cool {
			d.cool[fl.l.webhookID] = now.Add(fastCooldown)
		}
	}
	if len(d.cool) > maxCooling {
		for id, until := range d.cool {
			if now.After(until) {
				delete(d.cool, id)
			}
		}
	}
	return inserted, firstErr
}

// sizePolls sizes the next poll by how long this one's first attempts took: a poll that cannot
// send its deliveries within fastCap leaves the rest of its subscription's to the schedule, which
// is slower than this path and keeps its backlog (a burst on a receiver that takes deliveries
// more slowly, or on a busy machine, would be delivered at the schedule's pace to its end). A
// poll that took more than half of fastCap halves the next; one that took less than an eighth
// doubles it, between minPollRecords and pollRecords.
func (d *Dispatcher) sizePolls(took time.Duration) {
	if d.cfg.FastWait < 0 { // no first attempts here: nothing to size polls by
		d.polls.Store(pollRecords)
		return
	}
	limit, n := fastCap(d.cfg.FastWait), d.polls.Load()
	switch {
	case took > limit/2:
		n /= 2
	case took < limit/8:
		n *= 2
	}
	d.polls.Store(min(max(n, minPollRecords), pollRecords))
}

// fastCap bounds how long a poll's first attempts hold the consumer.
func fastCap(wait time.Duration) time.Duration { return 8 * wait }

// slow reports whether an attempt of run has been running for wait, and marks the subscriptions
// of those that have to be left to the schedule.
func (run *fastRun) slow(now time.Time, wait time.Duration) bool {
	found := false
	for _, fl := range run.lanes {
		for _, it := range fl.items {
			if b := it.began.Load(); b != 0 && it.state.Load() == fastSending && now.Sub(time.Unix(0, b)) >= wait {
				fl.cool, found = true, true
			}
		}
	}
	return found
}

// finishedRow is a sent item as it is recorded.
func (d *Dispatcher) finishedRow(it *fastItem) fastRow {
	r := fastRow{it: it, status: DeliveryPending, res: it.res}
	if r.res.sent {
		r.status, r.delay = outcomeStatus(d.cfg.Schedule, 0, r.res.out)
	}
	if !r.res.out.Succeeded() {
		it.fl.cool = true
	}
	return r
}

// afterRecord follows a record of rows that ended with err: attempts whose deliveries were not
// recorded are kept for when their events are handled again, and those recorded delivering are
// followed to their end (or, not recorded, no longer held).
func (d *Dispatcher) afterRecord(ctx context.Context, rows []fastRow, err error) {
	if len(d.sent) > maxUnrecorded {
		clear(d.sent)
	}
	spilled := map[*fastLane][]*fastItem{}
	for _, r := range rows {
		key := [2]string{r.it.row.webhookID, r.it.row.ev.ID}
		switch {
		case r.status == DeliveryDelivering && err != nil:
			d.held.remove(r.it.row.id)
		case r.status == DeliveryDelivering:
			spilled[r.it.fl] = append(spilled[r.it.fl], r.it)
		case err == nil || !r.res.sent:
			delete(d.sent, key)
		default:
			d.sent[key] = r.res
		}
	}
	for fl, its := range spilled {
		d.spills.Go(func() { d.finishSpilled(ctx, fl.l, its) })
	}
}

// outcomeStatus is where an attempt leaves its delivery, at schedule position pos: succeeded,
// pending again after a delay, or failed.
func outcomeStatus(schedule []time.Duration, pos int, out outcome) (string, time.Duration) {
	if out.Succeeded() {
		return DeliverySucceeded, 0
	}
	if next, ok := retryDelay(schedule, pos+1, out.RetryAfter); ok {
		return DeliveryPending, next
	}
	return DeliveryFailed, 0
}

// finishSpilled records the outcomes of attempts that outran fastWait, as a lane's writer does.
func (d *Dispatcher) finishSpilled(ctx context.Context, l *lane, items []*fastItem) {
	w := d.newOutcomeWriter(ctx, l)
	defer w.close()
	for _, it := range items {
		<-it.sent
		res := it.res
		c := claimed{id: it.row.id, eventID: it.row.ev.ID, body: it.row.body, eventCreatedAt: it.row.ev.CreatedAt}
		if !res.sent {
			d.release([]claimed{c})
			continue
		}
		w.add([]claimed{c}, res.out, func() {})
	}
}

// recordFast inserts rows, each with its first attempt in its own row when it was sent, and
// updates each subscription by its outcomes, in one transaction, whose commit waits for the WAL
// flush when durable (and then makes every commit before it durable). It returns how many
// deliveries it inserted (a delivery recorded meanwhile by another consumer of the partition is
// left as it is).
//
// The rows are copied (COPY costs Postgres about three quarters of an INSERT … SELECT from
// arrays, docs/PERFORMANCE.md): pickFast left out the deliveries recorded already, so a copy
// fails only when another consumer of the partition recorded one meanwhile (a rebalance), and
// then the rows are copied into a staging table and inserted from there, those recorded
// skipped. The times the rows carry (when a retry is due, a lease ends, a delivery finished) are
// this node's clock, as an outcome's attempt time always was.
func (d *Dispatcher) recordFast(ctx context.Context, rows []fastRow, durable bool) (int, error) {
	body := d.fastCopy(rows)
	tallies := map[string]*tally{}
	var order []string // the subscriptions with attempts, as they first come
	pendingAny := false
	for _, r := range rows {
		pendingAny = pendingAny || r.status == DeliveryPending
		if !r.res.sent || r.status == DeliveryDelivering {
			continue
		}
		hook := r.it.row.webhookID
		t := tallies[hook]
		if t == nil {
			t = &tally{}
			tallies[hook] = t
			order = append(order, hook)
		}
		t.add(r.res.out)
	}
	var inserted int
	var notify []string
	write := func(staged bool) error {
		opts := postgres.AsyncCommit
		if durable {
			opts = pgx.TxOptions{}
		}
		return pgx.BeginTxFunc(ctx, d.pool, opts, func(tx pgx.Tx) error {
			n, err := copyFast(ctx, tx, body, staged)
			if err != nil {
				return err
			}
			inserted, notify = int(n), notify[:0]
			b := &pgx.Batch{}
			for _, id := range order {
				t := tallies[id]
				b.Queue(hookOutcome(1)+` returning status, project_id`, id, t.trailingArg(), t.failures, t.gone, PauseAfter, t.success)
			}
			res := tx.SendBatch(ctx, b)
			defer res.Close()
			for _, id := range order {
				var status, project string
				err := res.QueryRow().Scan(&status, &project)
				if errors.Is(err, pgx.ErrNoRows) {
					continue // nothing to change
				}
				if err != nil {
					return err
				}
				if t := tallies[id]; t.gone || t.failures > 0 && status != StatusActive {
					notify = append(notify, "sub:"+project)
				}
			}
			return res.Close()
		})
	}
	err := write(false)
	if postgres.UniqueViolation(err) {
		err = write(true)
	}
	if err != nil {
		return 0, fmt.Errorf("record first attempts: %w", postgres.Refused(err))
	}
	if pendingAny {
		notify = append(notify, "due")
	}
	for _, payload := range notify {
		if payload == "due" {
			d.nudge()
		}
		if _, err := d.pool.Exec(ctx, `select pg_notify($1, $2)`, NotifyChannel, payload); err != nil && ctx.Err() == nil {
			d.logger.Warn("webhook notify failed", "err", err)
		}
	}
	return inserted, nil
}

// fastColumns are the columns of webhook_deliveries fastCopy gives, in order.
var fastColumns = []string{"id", "org_id", "webhook_id", "event_id", "event_type", "event_created_at", "body", "status",
	"attempt_count", "schedule_pos", "next_attempt_at", "lease_owner", "lease_until", "completed_at",
	"last_attempt_at", "first_attempted_at", "last_status_code", "first_status_code", "first_latency_ms", "first_error",
	"first_response_body"}

// fastFirstAttemptColumn is where fastColumns' attempt begins: null for a delivery not sent.
var fastFirstAttemptColumn = slices.Index(fastColumns, "last_attempt_at")

// fastCopy is rows as the body of a COPY into fastColumns: each delivery as it stands, with its
// first attempt when it was sent and has ended.
func (d *Dispatcher) fastCopy(rows []fastRow) *pgcopy.Rows {
	now := time.Now()
	size := 0
	for _, r := range rows {
		size += len(r.it.row.body) + len(r.res.out.ResponseBody) + 256
	}
	body := pgcopy.New(len(fastColumns), size)
	for _, r := range rows {
		row := r.it.row
		body.Row()
		body.Texts(row.id, row.orgID, row.webhookID, row.ev.ID, row.ev.Type)
		body.Timestamptz(row.ev.CreatedAt)
		body.Bytes(row.body)
		body.Text(r.status)
		attempted := r.res.sent && r.status != DeliveryDelivering
		tried := int32(0)
		if attempted {
			tried = 1
		}
		body.Int4(tried) // attempt_count
		body.Int4(tried) // schedule_pos
		body.Timestamptz(now.Add(r.delay))
		if r.status == DeliveryDelivering {
			body.Text(d.node)
			body.Timestamptz(now.Add(d.cfg.Lease))
		} else {
			body.Null()
			body.Null()
		}
		if r.status == DeliverySucceeded || r.status == DeliveryFailed {
			body.Timestamptz(now)
		} else {
			body.Null()
		}
		if !attempted {
			for range len(fastColumns) - fastFirstAttemptColumn {
				body.Null()
			}
			continue
		}
		out := r.res.out
		body.Timestamptz(out.AttemptedAt) // last_attempt_at
		body.Timestamptz(out.AttemptedAt) // first_attempted_at
		if out.StatusCode != 0 {
			body.Int4(int32(out.StatusCode))
			body.Int4(int32(out.StatusCode))
		} else {
			body.Null()
			body.Null()
		}
		body.Int4(int32(out.Latency.Milliseconds()))
		body.TextOrNull(out.Err)
		if out.StatusCode != 0 {
			body.Text(out.ResponseBody)
		} else {
			body.Null()
		}
	}
	return body
}

// copyFast copies body into webhook_deliveries in tx and returns how many deliveries it
// inserted; staged, it copies into a staging table first and skips those recorded already.
func copyFast(ctx context.Context, tx pgx.Tx, body *pgcopy.Rows, staged bool) (int64, error) {
	if !staged {
		return body.Copy(ctx, tx.Conn().PgConn(), "webhook_deliveries", fastColumns)
	}
	cols := strings.Join(fastColumns, ", ")
	if _, err := tx.Exec(ctx, `create temp table webhook_deliveries_stage on commit drop as
select `+cols+` from webhook_deliveries with no data`); err != nil {
		return 0, err
	}
	if _, err := body.Copy(ctx, tx.Conn().PgConn(), "webhook_deliveries_stage", fastColumns); err != nil {
		return 0, err
	}
	// In the order copied, so seq follows the partition's order (a fresh heap is read in order).
	tag, err := tx.Exec(ctx, `insert into webhook_deliveries (`+cols+`)
select `+cols+` from webhook_deliveries_stage
on conflict (webhook_id, event_id) do nothing`)
	return tag.RowsAffected(), err
}
