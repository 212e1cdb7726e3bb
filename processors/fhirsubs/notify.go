package fhirsubs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/access"
	"carehub/kernel/clinical"
	"carehub/kernel/config"
	"carehub/kernel/events"
	"carehub/kernel/telemetry"
	"carehub/storage"
	"carehub/storage/kafka"
	"carehub/storage/kafka/consume"
	"carehub/storage/postgres"
)

// Defaults of NotifierConfig.
const (
	DefaultGroup    = "carehub-fhir-subscriptions"
	DefaultClientID = "carehub-fhir-subscriptions"
	notifyBatch     = 500
	// wakeChannel is the Postgres NOTIFY channel a numbered event is announced on (its payload
	// the subscription id): the deliverer and websocket channels wait on it.
	wakeChannel = "carehub_fhir_subscriptions"
)

// NotifierConfig configures a Notifier.
type NotifierConfig struct {
	Brokers         []string
	Credentials     kafka.Credentials
	ClientID        string
	ClientOpts      []kgo.Opt
	Group           string
	Topic           string // the events topic
	DeadLetterTopic string
	Logger          *slog.Logger
	Registerer      prometheus.Registerer
}

// Notifier is one member of the consumer group that turns platform events into subscription
// notification events: it reads the events topic, matches each event of a topic's source type
// against the live subscriptions (in memory, reloaded when one was created or deleted), and numbers
// each match per subscription in fhir_subscription_events, once per event however often it is
// delivered. Offsets are committed after the batch's numbering is. Notifications are never made
// by polling a table: the numbering is the stream's, and the deliverer and the websocket channel
// are woken by Postgres NOTIFY in the same transaction.
type Notifier struct {
	s   *Service
	cfg NotifierConfig
	cl  *kgo.Client
	r   *consume.Runner
	log *slog.Logger

	generation   int64 // of the copy: fhir_subscription_generation when it was read
	subs         []Subscription
	index        map[indexKey][]Subscription // subs by organization, source event type and patient filter ("": any)
	numbered     prometheus.Counter
	deadLettered prometheus.Counter
	closeOnce    sync.Once
}

// NewNotifier builds the notifier and its Kafka client; Run joins the group.
func (s *Service) NewNotifier(cfg NotifierConfig) (*Notifier, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("fhir subscriptions: no brokers")
	}
	config.Default(&cfg.ClientID, DefaultClientID)
	config.Default(&cfg.Group, DefaultGroup)
	config.Default(&cfg.Topic, kafka.DefaultTopics().Events)
	config.Default(&cfg.DeadLetterTopic, kafka.DefaultTopics().EventsDLQ)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	// A new group starts with the last minute's events, not the topic's history: a subscription
	// is notified of events after it was created.
	kcfg := kafka.ClientConfig{Brokers: cfg.Brokers, Credentials: cfg.Credentials, ClientID: cfg.ClientID,
		Registerer: cfg.Registerer, Logger: cfg.Logger}
	opts := append(consume.GroupOpts(cfg.Group, cfg.Topic),
		consume.StartRecent(kcfg, cfg.Group, cfg.Topic, time.Minute, cfg.ClientOpts...))
	cl, err := kafka.NewClient(kcfg, append(opts, cfg.ClientOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("fhir subscriptions: %w", err)
	}
	log := cfg.Logger.With("component", "fhir_subscriptions")
	r, err := consume.New(cl, consume.Config{Name: "fhir_subscriptions", MaxRecords: notifyBatch, Logger: log, Registerer: cfg.Registerer})
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("fhir subscriptions: %w", err)
	}
	n := &Notifier{s: s, cfg: cfg, cl: cl, r: r, log: log,
		numbered: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "fhir_subscriptions",
			Name: "events_numbered_total", Help: "Platform events numbered into a FHIR subscription's notification events."}),
		deadLettered: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "fhir_subscriptions",
			Name: "dead_lettered_total", Help: "Events Postgres refused to number, set aside on the dead-letter topic (alert on any)."})}
	if cfg.Registerer != nil {
		n.numbered = telemetry.Shared(cfg.Registerer, n.numbered)
		n.deadLettered = telemetry.Shared(cfg.Registerer, n.deadLettered)
	}
	return n, nil
}

// Close leaves the group and closes the client. Run calls it on return; it is idempotent.
func (n *Notifier) Close() { n.closeOnce.Do(n.cl.Close) }

// Run consumes events until ctx ends and returns nil. A database error rewinds the batch (the
// numbering is idempotent per subscription and event); a record Postgres refuses as data goes to
// the dead-letter topic, so it cannot stop the subscriptions behind it.
func (n *Notifier) Run(ctx context.Context) error {
	defer n.Close()
	deadLetter := consume.DeadLetter(consume.DeadLetterConfig{
		Name: "fhir_subscriptions", Topic: n.cfg.DeadLetterTopic, Producer: n.cl, Logger: n.log,
		Permanent: storage.IsUnstorable, Reason: storage.Refusal,
		OnDeadLetter: func(*kgo.Record) { n.deadLettered.Inc() },
	})
	return n.r.Run(ctx, consume.Select(n.relevant, consume.Decode(n.r.Skip, events.Decode, n.handle)), consume.Commit(n.cl, n.log), deadLetter)
}

// relevant reloads the subscriptions when they changed since the copy was read and keeps the records
// a subscription may want, read by their head: most events concern none.
func (n *Notifier) relevant(ctx context.Context, recs []*kgo.Record) ([]*kgo.Record, error) {
	// The copy is reloaded when a subscription was created or deleted since it was read: one
	// row's read before each batch, rather than every subscription's.
	var generation int64
	if err := n.s.pool.QueryRow(ctx, `select generation from fhir_subscription_generation`).Scan(&generation); err != nil {
		return nil, fmt.Errorf("subscriptions' generation: %w", err)
	}
	if n.index == nil || generation != n.generation {
		if err := n.reload(ctx); err != nil {
			return nil, err
		}
	}
	kept := recs[:0:0]
	for _, r := range recs {
		h, ok := events.PeekHead(r.Value)
		if !ok || slices.ContainsFunc(n.subs, func(s Subscription) bool { return s.OrgID == h.OrgID && s.Topic.source == h.Type }) {
			kept = append(kept, r)
		}
	}
	return kept, nil
}

// reload reads the subscriptions that are not off, and the generation they are of (read first:
// a change committed between the two reads is in the rows, and the next batch reads it again).
func (n *Notifier) reload(ctx context.Context) error {
	var generation int64
	if err := n.s.pool.QueryRow(ctx, `select generation from fhir_subscription_generation`).Scan(&generation); err != nil {
		return fmt.Errorf("load subscriptions: %w", err)
	}
	rows, _ := n.s.pool.Query(ctx, `select `+columns+` from `+subscriptions+` where deleted_at is null and status <> 'off'`)
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Subscription, error) { return scanSubscription(r) })
	if err != nil {
		return fmt.Errorf("load subscriptions: %w", err)
	}
	index := map[indexKey][]Subscription{}
	for _, sub := range list {
		k := indexKey{org: sub.OrgID, source: sub.Topic.source, patient: sub.Filters.Patient}
		index[k] = append(index[k], sub)
	}
	n.generation, n.subs, n.index = generation, list, index
	return nil
}

// indexKey is what the notifier looks subscriptions up by.
type indexKey struct{ org, source, patient string }

// match is one subscription's notification event of a platform event.
type match struct {
	sub Subscription
	ev  events.Event
	p   payload
}

// handle numbers the batch's matches: one transaction of two statements whatever the batch's
// size (a device stream's batch of 500 observations may match 500 subscriptions).
func (n *Notifier) handle(ctx context.Context, evs []events.Event) error {
	var matches []match
	var testPatients []string
	for _, ev := range evs {
		var p payload
		if json.Unmarshal(ev.Payload, &p) != nil || p.PatientID == "" {
			continue
		}
		var rising *bool
		risingOnce := func() (bool, error) {
			if rising == nil {
				r, err := n.rising(ctx, p)
				if err != nil {
					return false, err
				}
				rising = &r
			}
			return *rising, nil
		}
		for _, patient := range []string{p.PatientID, ""} {
			for _, sub := range n.index[indexKey{org: ev.OrgID, source: ev.Type, patient: patient}] {
				if !sub.Filters.matches(p) {
					continue
				}
				ok, err := sub.Topic.match(p, risingOnce)
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
				if sub.Mode == access.Test && !slices.Contains(testPatients, p.PatientID) {
					testPatients = append(testPatients, p.PatientID)
				}
				matches = append(matches, match{sub: sub, ev: ev, p: p})
			}
		}
	}
	if len(matches) == 0 {
		return nil
	}
	synthetic, err := n.synthetic(ctx, testPatients)
	if err != nil {
		return err
	}
	var subs, eventIDs, focusTypes, focusIDs, patients []string
	var at []time.Time
	for _, m := range matches {
		// A test subscription hears only of synthetic patients, whatever the event names.
		if m.sub.Mode == access.Test && !synthetic[m.p.PatientID] {
			continue
		}
		typ, id := m.p.focus()
		subs, eventIDs, focusTypes, focusIDs = append(subs, m.sub.ID), append(eventIDs, m.ev.ID), append(focusTypes, typ), append(focusIDs, id)
		patients, at = append(patients, m.p.PatientID), append(at, m.ev.CreatedAt)
	}
	if len(subs) == 0 {
		return nil
	}
	var numbered int64
	err = pgx.BeginFunc(ctx, n.s.pool, func(tx pgx.Tx) error {
		// The subscriptions' rows first, in id order: a member of the group numbering other
		// partitions' events for the same subscriptions waits here, and the statement below then
		// sees what it numbered (a new snapshot), so no event is numbered twice and no number is
		// skipped.
		if _, err := tx.Exec(ctx, `select 1 from fhir_subscription_counters where subscription_id = any($1) order by subscription_id for update`, subs); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `with m as (
	select * from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[]) with ordinality
		as m(sub, event_id, focus_type, focus_id, patient_id, occurred_at, ord)),
fresh as (
	select m.* from m where not exists (
		select 1 from fhir_subscription_events e where e.subscription_id = m.sub and e.event_id = m.event_id)),
counts as (select sub, count(*) as n from fresh group by sub),
bumped as (
	update fhir_subscription_counters k set events_since_start = k.events_since_start + c.n from counts c, fhir_subscriptions s
	where k.subscription_id = c.sub and s.id = c.sub and s.deleted_at is null
	returning k.subscription_id as id, k.events_since_start - c.n as base),
ins as (
	insert into fhir_subscription_events (subscription_id, number, event_id, focus_type, focus_id, patient_id, occurred_at)
	select f.sub, b.base + row_number() over (partition by f.sub order by f.ord), f.event_id, f.focus_type, f.focus_id, f.patient_id, f.occurred_at
	from fresh f join bumped b on b.id = f.sub
	returning subscription_id),
woken as (select pg_notify($7, sub) from (select distinct subscription_id as sub from ins) x)
select (select count(*) from ins) + 0 * (select count(*) from woken)`, subs, eventIDs, focusTypes, focusIDs, patients, at, wakeChannel).Scan(&numbered)
	})
	if err != nil {
		return fmt.Errorf("number subscription events: %w", postgres.Refused(err))
	}
	n.numbered.Add(float64(numbered))
	return nil
}

// synthetic reports which of patients are synthetic.
func (n *Notifier) synthetic(ctx context.Context, patients []string) (map[string]bool, error) {
	out := map[string]bool{}
	if len(patients) == 0 {
		return out, nil
	}
	rows, _ := n.s.pool.Query(ctx, `select id from patients where id = any($1) and synthetic`, patients)
	list, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("synthetic patients: %w", err)
	}
	for _, id := range list {
		out[id] = true
	}
	return out, nil
}

// rising reports whether the assessment of p is more severe than the patient's previous one of
// the same code (a first one rises when it is above NONE). Report ids are ULIDs: they order by
// time.
func (n *Notifier) rising(ctx context.Context, p payload) (bool, error) {
	var prev string
	err := n.s.pool.QueryRow(ctx, `select severity from reports where patient_id = $1 and code = $2 and id < $3
order by id desc limit 1`, p.PatientID, p.Code, p.ReportID).Scan(&prev)
	if errors.Is(err, pgx.ErrNoRows) {
		prev = string(clinical.SeverityNone)
	} else if err != nil {
		return false, fmt.Errorf("previous assessment: %w", err)
	}
	return clinical.Severity(p.Severity).Rank() > clinical.Severity(prev).Rank(), nil
}
