package webhooks

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"carehub/kernel/config"
	"carehub/kernel/events"
	"carehub/kernel/ids"
	"carehub/kernel/phi"
	"carehub/kernel/sealing"
	"carehub/kernel/tick"
	"carehub/storage"
	"carehub/storage/kafka"
	"carehub/storage/kafka/consume"
	"carehub/storage/postgres"
)

// DefaultGroup is the dispatcher's consumer group.
const DefaultGroup = "carehub-webhooks"

// Dispatcher defaults.
const (
	DefaultLease        = 30 * time.Second
	DefaultMaxInFlight  = 256
	DefaultLaneBatch    = 512
	DefaultPollInterval = 500 * time.Millisecond
	DefaultCacheTTL     = 5 * time.Second
	DefaultFastWait     = 250 * time.Millisecond
)

// pollRecords is the most events a poll takes: a poll's first attempts are sent while the ones
// before them are recorded, and what a poll costs besides (the look-up, the last write, the
// commit) is paid once for all of them. Polls start at minPollRecords and are sized by how long
// their first attempts took (sizePolls).
const (
	pollRecords    = 4000
	minPollRecords = 500
)

// creationSkew is how much earlier than a subscription's creation an event may have been
// created and still be delivered to it: events and subscriptions are timestamped by different
// clocks (the producing node's and Postgres's).
const creationSkew = time.Minute

// DispatcherConfig configures a Dispatcher. Zero values take the defaults.
type DispatcherConfig struct {
	Pool        *pgxpool.Pool     // required
	Brokers     []string          // required
	Credentials kafka.Credentials // authenticate to brokers that require SASL
	Topic       string            // default kafka.DefaultTopics().Events
	Group       string            // default DefaultGroup
	Logger      *slog.Logger
	Registerer  prometheus.Registerer
	// DeadLetterTopic receives the events whose deliveries Postgres refuses
	// (storage.ErrUnstorable); default kafka.DefaultTopics().EventsDLQ, which the event log
	// shares (the carehub-dlq-consumer header, "webhooks", tells them apart).
	DeadLetterTopic string
	// Key is the server sealing key that signing secrets are sealed under (required; the same
	// as the Service's).
	Key *sealing.Key

	// AllowPrivate lets deliveries connect to private and loopback addresses (development and
	// tests; --webhooks-allow-private).
	AllowPrivate bool
	// RootCAs are the certificate authorities a receiver's certificate is checked against (nil:
	// the system's; --webhooks-ca-file adds a private one).
	RootCAs *x509.CertPool
	// Schedule is the delay before each attempt (DefaultSchedule); its length is the number of
	// attempts before a delivery fails. Tests shorten it.
	Schedule []time.Duration
	// Timeout bounds one attempt (DefaultTimeout).
	Timeout time.Duration
	// Lease is how long a claimed delivery stays with this dispatcher without renewal; a
	// dispatcher renews its leases every Lease/3, so a delivery outlives its dispatcher by at
	// most Lease before another sends it again (DefaultLease).
	Lease time.Duration
	// MaxInFlight bounds the attempts in flight (the consumer's first attempts and the lanes'),
	// and the subscriptions being sent (a lane waiting for its inbox does not count), at once on
	// this dispatcher (DefaultMaxInFlight). Each subscription's own bound is its maxInFlight
	// (ordered: one).
	MaxInFlight int
	// LaneBatch is the most of a subscription's due deliveries one claim takes
	// (DefaultLaneBatch); a claim takes eight times the subscription's maxInFlight, or four
	// of its batches (ordered), up to this.
	LaneBatch int
	// PollInterval is how often the worker pool looks for due deliveries when nothing wakes it
	// (DefaultPollInterval). New deliveries, resumes and redeliveries wake it at once.
	PollInterval time.Duration
	// CacheTTL bounds how long the subscriptions of a project are cached; changes made through
	// the Service invalidate them at once (DefaultCacheTTL).
	CacheTTL time.Duration
	// FastWait is how long the consumer waits for the first attempts it makes itself before it
	// records those still running as delivering and goes on (DefaultFastWait; fast.go). Negative:
	// the consumer sends nothing itself, and every delivery goes through the schedule.
	FastWait time.Duration
	// ClientOpts are extra franz-go options (tests).
	ClientOpts []kgo.Opt
}

func (c *DispatcherConfig) defaults() {
	config.Default(&c.Topic, kafka.DefaultTopics().Events)
	config.Default(&c.Group, DefaultGroup)
	config.Default(&c.DeadLetterTopic, kafka.DefaultTopics().EventsDLQ)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if len(c.Schedule) == 0 {
		c.Schedule = DefaultSchedule
	}
	config.Default(&c.Timeout, DefaultTimeout)
	config.Default(&c.Lease, DefaultLease)
	config.Default(&c.MaxInFlight, DefaultMaxInFlight)
	config.Default(&c.LaneBatch, DefaultLaneBatch)
	config.Default(&c.PollInterval, DefaultPollInterval)
	config.Default(&c.CacheTTL, DefaultCacheTTL)
	if c.FastWait == 0 { // negative turns it off
		c.FastWait = DefaultFastWait
	}
}

// validate reports a config that cannot build a dispatcher (after defaults).
func (c *DispatcherConfig) validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("webhook dispatcher: no Postgres pool")
	case len(c.Brokers) == 0:
		return errors.New("webhook dispatcher: no Kafka brokers")
	case c.Key == nil:
		return errors.New("webhook dispatcher: no sealing key")
	case c.Lease < 300*time.Millisecond:
		return fmt.Errorf("webhook dispatcher: lease %s is too short", c.Lease)
	}
	return nil
}

// Dispatcher turns platform events into signed webhook deliveries. It is two loops that share
// only Postgres: the consumer (group DefaultGroup on the events topic) makes the first attempts
// of healthy concurrent subscriptions itself and records each of those deliveries once, finished
// (fast.go), records the other matching (subscription, event) pairs pending for the schedule,
// and commits offsets only after the rows are written; the worker pool claims due deliveries
// (retries, backlogs, ordered and throttled subscriptions), a subscription at a time, attempts
// them and records the outcome. Any number of dispatchers may run against one database and group.
type Dispatcher struct {
	cfg    DispatcherConfig
	logger *slog.Logger
	cl     *kgo.Client
	r      *consume.Runner
	pool   *pgxpool.Pool
	guard  *phi.Guard
	sender *sender
	box    secretBox
	subs   *subCache
	node   string // lease owner id of this dispatcher
	m      *metrics

	wake   chan struct{} // a nudge for the claimer
	sem    chan struct{} // attempts in flight
	active atomic.Int64  // lanes being served
	held   heldSet       // deliveries claimed and not finished, whose leases are renewed

	claimPasses atomic.Int64 // claims made, for tests

	limitersMu sync.Mutex
	limiters   map[string]*rate.Limiter // by subscription: its rate limit on this dispatcher

	servingMu sync.Mutex
	serving   map[string]*inbox // subscriptions with a lane on this dispatcher, and its inbox (inbox.go)

	cool   map[string]time.Time     // by subscription: until when the consumer leaves it to the schedule (fast.go)
	sent   map[[2]string]fastResult // first attempts made whose deliveries were not recorded, by (subscription, event)
	polls  *atomic.Int64            // the most events the next poll takes (sizePolls)
	slots  map[string]subSlots      // by subscription: its first attempts in flight, across polls (fast.go)
	rebal  *consume.Rebalancing     // tells the consumer that a rebalance waits for the polls it holds
	spills sync.WaitGroup           // first attempts that outran fastWait, their outcomes not yet written

	runOnce  sync.Once
	closeErr error
}

// NewDispatcher returns a dispatcher; Run starts it.
func NewDispatcher(cfg DispatcherConfig) (*Dispatcher, error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// The runner blocks rebalances while a poll is in hand, so a revoked partition's offsets are
	// committed (after its deliveries are recorded) before another member takes it.
	rebal := &consume.Rebalancing{}
	opts := append(consume.GroupOpts(cfg.Group, cfg.Topic), rebal.Opt(),
		// A new group starts at the beginning: subscriptions only get events created after them
		// (within creationSkew), so the history of the topic is not replayed to anyone.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(250*time.Millisecond))
	cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: cfg.Brokers, Credentials: cfg.Credentials, ClientID: "carehub-webhooks",
		Registerer: cfg.Registerer, Logger: cfg.Logger}, append(opts, cfg.ClientOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("webhook dispatcher: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("webhook dispatcher: %w", err)
	}
	polls := &atomic.Int64{}
	polls.Store(minPollRecords)
	r, err := consume.New(cl, consume.Config{Name: "webhooks", MaxRecords: pollRecords, Records: func() int { return int(polls.Load()) },
		Logger: cfg.Logger, Registerer: cfg.Registerer})
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("webhook dispatcher: %w", err)
	}
	return &Dispatcher{
		cfg:    cfg,
		logger: cfg.Logger,
		cl:     cl,
		r:      r,
		pool:   cfg.Pool,
		guard:  phi.NewGuard(postgres.SyntheticPatients{Pool: cfg.Pool}),
		sender: newSender(cfg.AllowPrivate, cfg.Timeout, MaxInFlightPerSubscription, cfg.RootCAs),
		box:    newSecretBox(cfg.Key),
		subs:   newSubCache(cfg.Pool, cfg.CacheTTL),
		node:   ids.New("wdsp_"),
		m:      m,
		wake:   make(chan struct{}, 1),
		sem:    make(chan struct{}, cfg.MaxInFlight),
		cool:   map[string]time.Time{},
		sent:   map[[2]string]fastResult{},
		polls:  polls,
		slots:  map[string]subSlots{},
		rebal:  rebal,
	}, nil
}

// Run consumes events and delivers them until ctx is done, then stops: attempts in flight are
// abandoned unrecorded and their deliveries, with those claimed but not yet attempted, are handed
// back (pending) for any dispatcher to take. Offsets of events whose deliveries are not recorded
// are not committed. Run may be called once; it closes the Kafka client when it returns.
func (d *Dispatcher) Run(ctx context.Context) error {
	err := errors.New("webhook dispatcher: Run called twice")
	d.runOnce.Do(func() { err = d.run(ctx) })
	return err
}

func (d *Dispatcher) run(ctx context.Context) error {
	defer d.closeClient()
	defer d.sender.close()
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(ctx, d.sender.abort)() // fasthttp's attempts take no context (plain.go)
	start := func(name string, fn func(context.Context) error) {
		wg.Go(func() {
			if err := fn(ctx); err != nil && ctx.Err() == nil {
				select {
				case errc <- fmt.Errorf("webhook %s: %w", name, err):
				default:
				}
				cancel()
			}
		})
	}
	var lanes sync.WaitGroup
	start("listener", d.listen)
	start("claimer", func(ctx context.Context) error { return d.claimLoop(ctx, &lanes) })
	start("leases", d.renewLeases)
	start("retention", d.retention)
	start("consumer", d.consume)
	wg.Wait()
	lanes.Wait()
	d.spills.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// clientCloseTimeout bounds leaving the group on the way out. Leaving waits for a join in
// progress, and a join waits for the members of a rebalance, a crashed one up to its session
// timeout; past this the client is left to finish closing on its own.
const clientCloseTimeout = 10 * time.Second

func (d *Dispatcher) closeClient() {
	// The last poll, cut short by ctx, still blocks rebalancing, and leaving the group is one:
	// allow it, or Close waits forever. What that poll returned was not committed.
	d.cl.AllowRebalance()
	done := make(chan struct{})
	go func() {
		d.cl.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(clientCloseTimeout):
		d.logger.Warn("webhook dispatcher: leaving the consumer group is taking long; not waiting for it")
	}
}

// consume polls events, records their deliveries and commits. A batch whose deliveries cannot
// be recorded (Postgres down) is retried until it can or ctx ends; it is never skipped. A batch
// Postgres refuses as data (storage.ErrUnstorable) would be refused on every retry and hold
// every subscription behind it: consume.DeadLetter records it by halves and sets each event
// refused alone aside on the dead-letter topic (counted, alerted by position only). A
// re-consumed event, a replayed one included, is a no-op (one delivery per subscription and
// event: unique (webhook_id, event_id)).
func (d *Dispatcher) consume(ctx context.Context) error {
	deadLetter := consume.DeadLetter(consume.DeadLetterConfig{
		Name: "webhooks", Topic: d.cfg.DeadLetterTopic, Producer: d.cl, Logger: d.logger,
		Permanent:    storage.IsUnstorable,
		Reason:       storage.Refusal,
		OnDeadLetter: func(*kgo.Record) { d.m.deadLettered.Inc() },
	})
	// A poll's first attempts are begun before the poll before is recorded and committed
	// (consume.Runner.Overlap), so that the subscriptions' attempts go on while the consumer
	// looks the next poll up and writes the last one. After a failure, polls are handled one at a
	// time, with the dead-letter middleware, by record.
	begin := func(ctx context.Context, recs []*kgo.Record) (consume.Effect, error) {
		eff := consume.Effect{End: func() error { return nil }}
		err := d.events(func(ctx context.Context, evs []events.Event) error {
			var err error
			eff, err = d.beginRecord(ctx, evs)
			return err
		})(ctx, recs)
		return eff, err
	}
	return d.r.Overlap(ctx, consume.Overlapped{Begin: begin, Commit: d.cl, Rebalancing: d.rebal},
		d.events(d.record), consume.Commit(d.cl, d.logger), deadLetter)
}

// events hands next the events of a poll that a subscription may want, decoded (the poison
// ones skipped).
func (d *Dispatcher) events(next func(context.Context, []events.Event) error) consume.Handler {
	return consume.Select(d.subscribed, consume.Decode(d.r.Skip, events.Decode, next))
}

// subscribed returns the records of recs that a subscription may want, read by their head
// (events.PeekHead), so that the many events no subscription asks for are passed over without
// decoding them. A record whose head cannot be read is kept: decoding it tells.
func (d *Dispatcher) subscribed(ctx context.Context, recs []*kgo.Record) ([]*kgo.Record, error) {
	heads := make([]events.Head, len(recs))
	read := make([]bool, len(recs))
	var projects []string
	seen := map[string]bool{}
	for i, r := range recs {
		heads[i], read[i] = events.PeekHead(r.Value)
		if p := heads[i].ProjectID; read[i] && p != "" && !seen[p] {
			seen[p] = true
			projects = append(projects, p)
		}
	}
	byProject, err := d.subs.get(ctx, projects)
	if err != nil {
		return nil, fmt.Errorf("load subscriptions: %w", err)
	}
	kept := make([]*kgo.Record, 0, len(recs))
	for i, r := range recs {
		h := heads[i]
		if !read[i] || slices.ContainsFunc(byProject[h.ProjectID], func(s cachedSub) bool { return s.wants(h.OrgID, h.Type) }) {
			kept = append(kept, r)
		}
	}
	return kept, nil
}

// newDelivery is a row to insert.
type newDelivery struct {
	id, orgID, webhookID string
	ev                   events.Event
	body                 []byte
	direct               bool // recorded delivering and handed to its lane's inbox
}

// record writes one delivery per matching subscription of each event in evs, in record order
// (so seq follows each partition's order), idempotently: attempted first by the consumer
// (fast.go), or pending, or delivering and handed to its lane (recordQueued).
func (d *Dispatcher) record(ctx context.Context, all []events.Event) error {
	eff, err := d.beginRecord(ctx, all)
	if err != nil {
		return err
	}
	return eff.End()
}

// beginRecord begins record: it records the deliveries for the schedule and begins the first
// attempts; the effect's End waits for those and records them.
func (d *Dispatcher) beginRecord(ctx context.Context, all []events.Event) (consume.Effect, error) {
	none := consume.Effect{End: func() error { return nil }}
	evs := make([]events.Event, 0, len(all))
	var projects []string
	seen := map[string]bool{}
	for _, ev := range all {
		if ev.ProjectID == "" {
			continue // marketplace events belong to no project, so to no subscription
		}
		evs = append(evs, ev)
		if !seen[ev.ProjectID] {
			seen[ev.ProjectID] = true
			projects = append(projects, ev.ProjectID)
		}
	}
	if len(evs) == 0 {
		return none, nil
	}
	byProject, err := d.subs.get(ctx, projects)
	if err != nil {
		return none, fmt.Errorf("load subscriptions: %w", err)
	}
	rows := make([]newDelivery, 0, len(evs)) // one subscription an event, as most are
	subs := map[string]cachedSub{}
	for _, ev := range evs {
		var body []byte
		for _, sub := range byProject[ev.ProjectID] {
			subs[sub.id] = sub
			if !sub.wants(ev.OrgID, ev.Type) || ev.CreatedAt.Before(sub.createdAt.Add(-creationSkew)) {
				continue
			}
			if body == nil {
				if body, err = Body(ev); err != nil { // the same event fails again: set it aside
					return none, fmt.Errorf("event %s: %w: %w", ev.ID, storage.ErrUnstorable, err)
				}
			}
			rows = append(rows, newDelivery{id: ids.New(ids.Delivery), orgID: sub.orgID, webhookID: sub.id, ev: ev, body: body})
		}
	}
	if len(rows) == 0 {
		return none, nil
	}
	fast, rows, err := d.pickFast(ctx, rows, subs)
	if err != nil {
		return none, err
	}
	run := d.startFast(ctx, fast)
	end := func() error {
		n, err := d.finishFast(ctx, run)
		d.m.recorded.Add(float64(n))
		return err
	}
	if err := d.recordQueued(ctx, rows); err != nil {
		_ = end() // the attempts made are kept for when the batch is read again
		return none, err
	}
	return consume.Effect{End: end, Ready: run.ready, Next: run.next}, nil
}

// recordQueued records rows for the schedule: pending, or delivering and handed to their lane.
func (d *Dispatcher) recordQueued(ctx context.Context, rows []newDelivery) error {
	if len(rows) == 0 {
		return nil
	}
	hooks := make([]string, 0, 1)
	for _, r := range rows {
		if !slices.Contains(hooks, r.webhookID) {
			hooks = append(hooks, r.webhookID)
		}
	}
	// Deliveries of subscriptions with an open inbox here go straight to their lanes (inbox.go),
	// as far as the inboxes have room.
	boxes, allServed := d.inboxes(hooks)
	room := make(map[string]int, len(boxes))
	for id, b := range boxes {
		room[id] = b.room()
	}
	for i, r := range rows {
		if b := boxes[r.webhookID]; b != nil {
			if room[r.webhookID] > 0 {
				rows[i].direct = true
				room[r.webhookID]--
			} else {
				b.spill() // a no-op unless it was accepting
			}
		}
	}
	n, direct, err := d.insertDeliveries(ctx, rows)
	if err != nil {
		return err
	}
	d.m.recorded.Add(float64(n))
	if !d.handOver(ctx, boxes, direct) {
		allServed = false
	}
	// New deliveries of subscriptions this dispatcher serves a lane of are the lanes' (they
	// refill before they end, and a lane that ends wakes the claimer): a claim would find
	// nothing, and claims are what a busy queue's churn makes slow.
	if n > 0 && !allServed {
		d.nudge()
		// Other dispatchers' workers wake too; without it they find the rows at their next poll.
		if _, err := d.pool.Exec(ctx, `select pg_notify($1, 'due')`, NotifyChannel); err != nil && ctx.Err() == nil {
			d.logger.Warn("webhook dispatcher notify failed", "err", err)
		}
	}
	return nil
}

// handOver puts the direct deliveries in their lanes' inboxes, with their subscriptions as
// they are now: a URL changed, a secret rotated or a grant narrowed since the lane began applies
// to what it sends from here on. A subscription no longer deliverable, or whose settings changed,
// gets its lane's inbox closed (the lane ends, and the next claim takes the settings as they
// are); its deliveries go back to pending, as do those of a lane that ended meanwhile. It
// reports whether every delivery was handed over.
func (d *Dispatcher) handOver(ctx context.Context, boxes map[string]*inbox, direct map[string][]claimed) bool {
	if len(direct) == 0 {
		return true
	}
	hooks := make([]string, 0, len(direct))
	for id := range direct {
		hooks = append(hooks, id)
	}
	now, err := d.laneTargets(ctx, hooks)
	if err != nil {
		if ctx.Err() == nil {
			d.logger.Warn("webhook subscriptions unreadable; deliveries left for the next claim", "err", err)
		}
		now = nil
	}
	all := true
	for id, items := range direct {
		b, t := boxes[id], now[id]
		if t == nil || !t.deliverable || t.settings != b.lane.settings {
			d.release(append(items, b.close()...))
			all = false
			continue
		}
		b.lane.mu.Lock()
		b.lane.url, b.lane.secrets, b.lane.reader = t.url, t.secrets, t.reader
		b.lane.mu.Unlock()
		if !b.put(items) { // the lane ended meanwhile: they are the next claim's
			d.release(items)
			all = false
			continue
		}
		d.m.handedOver.Add(float64(len(items)))
	}
	return all
}

// laneTarget is a subscription as a lane sends to it.
type laneTarget struct {
	hookState
	active   bool // active, not failing
	settings Settings
}

// laneTargets reads subscriptions ids as they are now.
func (d *Dispatcher) laneTargets(ctx context.Context, ids []string) (map[string]*laneTarget, error) {
	return d.scanLaneTargets(d.pool.Query(ctx, laneTargetsQuery, ids))
}

// laneTargetsQuery reads the subscriptions $1 as a lane sends to them (scanLaneTargets).
const laneTargetsQuery = `select id, deleted_at is null and status in ('active', 'failing'),
	deleted_at is null and status = 'active', url, patient_scopes,
	patient_mode, ordered, max_in_flight, batch_size, rate_limit, ` + secretColumns + `
from webhooks where id = any($1)`

func (d *Dispatcher) scanLaneTargets(rows pgx.Rows, err error) (map[string]*laneTarget, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]*laneTarget{}
	for rows.Next() {
		var t laneTarget
		var id, mode string
		var scopes []string
		var stored storedSecrets
		if err := rows.Scan(append([]any{&id, &t.deliverable, &t.active, &t.url, &scopes, &mode, &t.settings.Ordered,
			&t.settings.MaxInFlight, &t.settings.BatchSize, &t.settings.RateLimit}, stored.dest()...)...); err != nil {
			return nil, err
		}
		t.secrets, t.reader = d.secrets(id, stored), phi.ReaderFrom(scopes, mode)
		out[id] = &t
	}
	return out, rows.Err()
}

// insertDeliveries records rows, those marked direct as delivering under this dispatcher's
// lease, and returns how many it inserted and, by subscription, the direct ones it inserted (a
// re-consumed event's delivery exists already and is not inserted again), held.
func (d *Dispatcher) insertDeliveries(ctx context.Context, rows []newDelivery) (int, map[string][]claimed, error) {
	n := len(rows)
	dids, orgs, hooks, evIDs, types := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	created := make([]time.Time, n)
	bodies := make([][]byte, n)
	direct := make([]bool, n)
	byID := make(map[string]int, n)
	for i, r := range rows {
		dids[i], orgs[i], hooks[i], evIDs[i], types[i] = r.id, r.orgID, r.webhookID, r.ev.ID, r.ev.Type
		created[i], bodies[i], direct[i] = r.ev.CreatedAt, r.body, r.direct
		byID[r.id] = i
	}
	out, err := d.pool.Query(ctx, `
insert into webhook_deliveries (id, org_id, webhook_id, event_id, event_type, event_created_at, body,
	status, lease_owner, lease_until)
select id, org_id, webhook_id, event_id, event_type, created, body,
	case when direct then 'delivering' else 'pending' end,
	case when direct then $9 end,
	case when direct then statement_timestamp() + $10 * interval '1 millisecond' end
from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[], $7::bytea[], $8::bool[])
	with ordinality as t(id, org_id, webhook_id, event_id, event_type, created, body, direct, n)
order by n
on conflict (webhook_id, event_id) do nothing
returning id, seq`, dids, orgs, hooks, evIDs, types, created, bodies, direct, d.node, d.cfg.Lease.Milliseconds())
	if err != nil {
		return 0, nil, fmt.Errorf("insert deliveries: %w", postgres.Refused(err))
	}
	defer out.Close()
	inserted := 0
	held := map[string][]claimed{}
	for out.Next() {
		var id string
		var seq int64
		if err := out.Scan(&id, &seq); err != nil {
			return 0, nil, fmt.Errorf("insert deliveries: %w", err)
		}
		inserted++
		if r := rows[byID[id]]; r.direct {
			held[r.webhookID] = append(held[r.webhookID], claimed{seq: seq, id: id, eventID: r.ev.ID, body: r.body,
				eventCreatedAt: r.ev.CreatedAt})
		}
	}
	if err := out.Err(); err != nil {
		return 0, nil, fmt.Errorf("insert deliveries: %w", postgres.Refused(err))
	}
	for _, items := range held { // RETURNING has no order
		slices.SortFunc(items, func(a, b claimed) int { return cmp.Compare(a.seq, b.seq) })
		for _, it := range items {
			d.held.add(it.id)
		}
	}
	return inserted, held, nil
}

// nudge wakes the claimer without blocking.
func (d *Dispatcher) nudge() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// listen follows NotifyChannel: subscription changes invalidate the cache, due deliveries wake
// the claimer. A lost connection is re-established; what was missed meanwhile is covered by
// dropping the whole cache and by the claimer's polling.
func (d *Dispatcher) listen(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := d.listenOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		d.subs.invalidate("")
		d.logger.Warn("webhook dispatcher lost its notification connection", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	return nil
}

func (d *Dispatcher) listenOnce(ctx context.Context) error {
	// A connection of its own: a LISTENing connection cannot serve the pool's other users.
	conn, err := pgx.ConnectConfig(ctx, d.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "listen "+NotifyChannel); err != nil {
		return err
	}
	// Anything changed before LISTEN took effect is unknown.
	d.subs.invalidate("")
	d.nudge()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		switch p := n.Payload; {
		case p == "due":
			d.nudge()
		case strings.HasPrefix(p, "sub:"):
			d.subs.invalidate(p[len("sub:"):])
		}
	}
}

// retention deletes deliveries (and their attempts) finished more than RedeliverWindow ago,
// hourly, in small batches.
func (d *Dispatcher) retention(ctx context.Context) error {
	tick.Every(ctx, time.Hour, func(ctx context.Context) {
		for ctx.Err() == nil {
			n, err := d.purge(ctx, RedeliverWindow, 1000)
			if err != nil {
				if ctx.Err() == nil {
					d.logger.Warn("webhook retention failed", "err", err)
				}
				break
			}
			if n < 1000 {
				break
			}
		}
	})
	return nil
}

// purge deletes up to n deliveries finished more than age ago, with their attempts, and returns
// how many.
func (d *Dispatcher) purge(ctx context.Context, age time.Duration, n int) (int64, error) {
	tag, err := d.pool.Exec(ctx, `with gone as (
	select id from webhook_deliveries where completed_at < now() - $1 * interval '1 millisecond' limit $2
), attempts as (
	delete from webhook_attempts a using gone where a.delivery_id = gone.id
)
delete from webhook_deliveries d using gone where d.id = gone.id`, age.Milliseconds(), n)
	return tag.RowsAffected(), err
}
