package fhirsubs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"carehub/kernel/egress"
	"carehub/kernel/telemetry"
	"carehub/kernel/whsig"
)

// DelivererConfig configures a Deliverer.
type DelivererConfig struct {
	// BaseURL is the FHIR base's URL as clients reach it (…/fhir/R4): the references a
	// notification carries. It may return "" until the node listens.
	BaseURL    func() string
	Wake       *Wake
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Workers bounds the subscriptions a round delivers to at once (default 32); a round leases
	// eight times as many.
	Workers int
}

// Deliverer sends rest-hook subscriptions' handshakes, notifications and heartbeats, signed as
// carehub's webhooks are (Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature
// under the subscription's whsec_ secret). Any processors node may run one: a subscription is
// leased to one deliverer at a time. Notifications go in event-number order, at most the
// subscription's max-count events per Bundle; a receiver that fails is retried with backoff (1 s
// doubling to 30 s: a receiver back after an outage hears within 30 s), the subscription is in
// error from the third failure on and active again at the first success, and nothing is
// skipped: what it missed is sent when it answers again (and $events reads it meanwhile).
type Deliverer struct {
	s       *Service
	cfg     DelivererConfig
	client  *http.Client
	log     *slog.Logger
	sent    *prometheus.CounterVec
	latency prometheus.Histogram
}

// Retry bounds.
const (
	FirstRetry  = time.Second
	LastRetry   = 30 * time.Second
	errorAfter  = 3
	leaseFor    = time.Minute
	idleRecheck = time.Second
)

// NewDeliverer returns the rest-hook deliverer of s.
func (s *Service) NewDeliverer(cfg DelivererConfig) *Deliverer {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 32
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if !s.cfg.AllowPrivate {
		dialer.Control = egress.DialControl
	}
	d := &Deliverer{s: s, cfg: cfg, log: cfg.Logger.With("component", "fhir_subscription_delivery"),
		client: &http.Client{
			Transport: egress.Guard(&http.Transport{Proxy: nil, DialContext: dialer.DialContext, ForceAttemptHTTP2: true,
				MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: 10 * time.Second,
				MaxResponseHeaderBytes: egress.MaxAnswerHeaderBytes}),
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "fhir_subscriptions",
			Name: "notifications_sent_total", Help: "Rest-hook notification attempts by type and outcome (ok, failed)."}, []string{"type", "outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "carehub", Subsystem: "fhir_subscriptions",
			Name: "event_to_notification_seconds", Help: "From a platform event's creation to its rest-hook notification's 2xx answer.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
	}
	if cfg.Registerer != nil {
		d.sent = telemetry.Shared(cfg.Registerer, d.sent)
		d.latency = telemetry.Shared(cfg.Registerer, d.latency)
	}
	return d
}

// Run delivers until ctx ends and returns nil: whenever the notifier announces events, and every
// second for heartbeats, retries and announcements lost.
func (d *Deliverer) Run(ctx context.Context) error {
	defer d.client.CloseIdleConnections()
	// Two loops: one round's attempts overlap the other's reads and writes (leases keep them
	// apart), so a receiver's next notification does not wait for a whole round's commit.
	var wg sync.WaitGroup
	for range loops {
		wg.Go(func() { d.loop(ctx) })
	}
	wg.Go(func() { d.sweep(ctx) })
	wg.Wait()
	return nil
}

// sweep deletes the events past EventRetention that nothing needs, once a minute.
func (d *Deliverer) sweep(ctx context.Context) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := d.s.Sweep(ctx, EventRetention); err != nil && ctx.Err() == nil {
			d.log.Warn("fhir subscriptions: sweep", "err", err)
		} else if n > 0 {
			d.log.Debug("fhir subscriptions: events past retention deleted", "events", n)
		}
	}
}

// loops is how many round loops a deliverer runs; a round leases leasePerWorker subscriptions
// a worker.
const (
	loops          = 4
	leasePerWorker = 8
)

func (d *Deliverer) loop(ctx context.Context) {
	woken, stop := d.cfg.Wake.Wait("")
	defer stop()
	tick := time.NewTicker(idleRecheck)
	defer tick.Stop()
	for ctx.Err() == nil {
		for d.round(ctx) > 0 && ctx.Err() == nil {
		}
		select {
		case <-ctx.Done():
		case <-woken:
		case <-tick.C:
		}
	}
}

// round leases the subscriptions with work due, reads what they need in one query each (their
// secrets and headers, their events, their keys), makes their attempts Workers at a time and
// records the outcomes in two statements: a round of a hundred notifications costs a handful of
// round trips and one commit, not a hundred. It returns how many it leased.
func (d *Deliverer) round(ctx context.Context) int {
	base := d.cfg.BaseURL()
	if base == "" {
		return 0
	}
	rows, _ := d.s.pool.Query(ctx, `update fhir_subscriptions set lease_until = now() + $1::interval
where id in (
	select s.id from fhir_subscriptions s join fhir_subscription_counters c on c.subscription_id = s.id
	where s.deleted_at is null and s.channel = 'rest-hook' and s.status <> 'off' and s.next_attempt_at <= now()
	  and (s.lease_until is null or s.lease_until < now())
	  and (s.status = 'requested' or s.last_sent_at is null or s.delivered_through < c.events_since_start
	       or (s.heartbeat_seconds > 0 and coalesce(s.last_sent_at, s.created_at) + s.heartbeat_seconds * interval '1 second' <= now()))
	order by s.next_attempt_at limit $2
	for update of s skip locked)
returning id`, leaseFor.String(), d.cfg.Workers*leasePerWorker)
	leased, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(leased) == 0 {
		if err != nil && ctx.Err() == nil {
			d.log.Warn("fhir subscriptions: lease", "err", err)
		}
		return 0
	}
	jobs, err := d.prepare(ctx, leased)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("fhir subscriptions: read leased subscriptions", "err", err)
		}
		return len(leased) // the leases run out and another round tries again
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, d.cfg.Workers)
	for _, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			d.attempt(ctx, j, base)
		}()
	}
	wg.Wait()
	d.record(ctx, jobs)
	return len(leased)
}

// job is one leased subscription's attempt: what prepare read for it and what attempt found.
type job struct {
	sub     Subscription
	secret  string
	headers []string
	typ     string
	evs     []event
	err     error // set by prepare (an unusable key, a sealed value that does not open) or attempt
}

// prepare reads the leased subscriptions with their secrets and headers, the events each is to
// be sent next, and whether their creators' keys still authenticate.
func (d *Deliverer) prepare(ctx context.Context, leased []string) ([]*job, error) {
	rows, _ := d.s.pool.Query(ctx, `select `+columns+`, secret, headers from `+subscriptions+` where id = any($1)`, leased)
	var jobs []*job
	var keys []string
	for rows.Next() {
		var sealedSecret, sealedHeaders []byte
		sub, err := scanSubscription(rowWith{rows, []any{&sealedSecret, &sealedHeaders}})
		if err != nil {
			rows.Close()
			return nil, err
		}
		j := &job{sub: sub, typ: TypeHeartbeat}
		if secret, err := d.s.open(sub.ID, "secret", sealedSecret); err != nil {
			j.err = err
		} else {
			j.secret = string(secret)
		}
		if sealedHeaders != nil && j.err == nil {
			plain, err := d.s.open(sub.ID, "headers", sealedHeaders)
			if err != nil {
				j.err = err
			} else {
				_ = json.Unmarshal(plain, &j.headers)
			}
		}
		switch {
		case sub.Status == StatusRequested || sub.LastSentAt == nil:
			// No receiver took anything yet, not even the handshake (a failed one left it in
			// error): the handshake again, before any notification.
			j.typ = TypeHandshake
		case sub.DeliveredThrough < sub.EventsSinceStart:
			j.typ = TypeNotification
		}
		if !slices.Contains(keys, sub.KeyID) {
			keys = append(keys, sub.KeyID)
		}
		jobs = append(jobs, j)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, _ = d.s.pool.Query(ctx, `select id from api_keys where id = any($1) and status <> 'revoked' and (expires_at is null or expires_at > now())`, keys)
	usable, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	var subs []string
	var after, through []int64
	byID := map[string]*job{}
	for _, j := range jobs {
		if !slices.Contains(usable, j.sub.KeyID) && j.err == nil {
			j.err = fmt.Errorf("the key that created the subscription (%s) is revoked or expired", j.sub.KeyID)
		}
		if j.typ == TypeNotification && j.err == nil {
			subs, after = append(subs, j.sub.ID), append(after, j.sub.DeliveredThrough)
			through = append(through, min(j.sub.EventsSinceStart, j.sub.DeliveredThrough+int64(j.sub.MaxCount)))
			byID[j.sub.ID] = j
		}
	}
	if len(subs) > 0 {
		rows, _ = d.s.pool.Query(ctx, `select e.subscription_id, e.number, e.event_id, e.focus_type, e.focus_id, e.patient_id, e.occurred_at
from unnest($1::text[], $2::bigint[], $3::bigint[]) as w(sub, after, through)
join fhir_subscription_events e on e.subscription_id = w.sub and e.number > w.after and e.number <= w.through
order by e.subscription_id, e.number`, subs, after, through)
		var id string
		var ev event
		_, err := pgx.ForEachRow(rows, []any{&id, &ev.Number, &ev.EventID, &ev.FocusType, &ev.FocusID, &ev.PatientID, &ev.OccurredAt}, func() error {
			byID[id].evs = append(byID[id].evs, ev)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("read subscription events: %w", err)
		}
	}
	return jobs, nil
}

// rowWith scans a row into a Subscription's columns and then dest.
type rowWith struct {
	rows interface{ Scan(...any) error }
	dest []any
}

func (r rowWith) Scan(dest ...any) error { return r.rows.Scan(append(dest, r.dest...)...) }

// attempt makes j's attempt: its handshake, its next notification or a heartbeat.
func (d *Deliverer) attempt(ctx context.Context, j *job, base string) {
	if j.err == nil {
		sub := j.sub
		if j.typ == TypeHandshake {
			sub.Status = StatusActive // what the handshake announces once the receiver takes it
		}
		var body []byte
		var patients []string
		body, patients, j.err = d.s.bundle(ctx, sub, base, j.typ, j.evs)
		if j.err == nil {
			j.err = d.post(ctx, j, body)
		}
		if j.err == nil {
			d.s.audit(j.sub, j.evs, patients)
			for _, ev := range j.evs {
				d.latency.Observe(time.Since(ev.OccurredAt).Seconds())
			}
		}
	}
	outcome := "ok"
	if j.err != nil {
		outcome = "failed"
		d.log.Info("fhir subscription notification failed", "subscription_id", j.sub.ID, "failures", j.sub.Failures+1,
			"err", egress.Clip(j.err.Error(), egress.MaxErrorText))
	}
	d.sent.WithLabelValues(j.typ, outcome).Inc()
}

// record writes a round's outcomes and releases its leases. A success makes the subscription
// active with what it took delivered; a failure waits 1 s doubling to 30 s before the next
// attempt, and puts the subscription in error from the third in a row (a failed handshake at once).
func (d *Deliverer) record(ctx context.Context, jobs []*job) {
	var okIDs, failIDs, msgs, waits []string
	var through []int64
	for _, j := range jobs {
		if j.err == nil {
			last := j.sub.DeliveredThrough
			if len(j.evs) > 0 {
				last = j.evs[len(j.evs)-1].Number
			}
			okIDs, through = append(okIDs, j.sub.ID), append(through, last)
			continue
		}
		// At a character boundary: a byte cut could leave text Postgres refuses, and the whole
		// round's outcomes with it.
		failIDs, msgs = append(failIDs, j.sub.ID), append(msgs, egress.Clip(j.err.Error(), egress.MaxErrorText))
		waits = append(waits, min(FirstRetry<<min(j.sub.Failures, 20), LastRetry).String())
	}
	_, err := d.s.pool.Exec(ctx, `update fhir_subscriptions s set status = 'active', delivered_through = greatest(s.delivered_through, u.through),
	failures = 0, last_error = '', last_sent_at = now(), next_attempt_at = now(), lease_until = null
from unnest($1::text[], $2::bigint[]) as u(id, through) where s.id = u.id and s.status <> 'off'`, okIDs, through)
	if err == nil && len(failIDs) > 0 {
		_, err = d.s.pool.Exec(ctx, `update fhir_subscriptions s set failures = s.failures + 1, last_error = u.msg,
	status = case when s.status = 'requested' or s.failures + 1 >= $4 then 'error' else s.status end,
	next_attempt_at = now() + u.wait::interval, lease_until = null
from unnest($1::text[], $2::text[], $3::text[]) as u(id, msg, wait) where s.id = u.id and s.status <> 'off'`, failIDs, msgs, waits, errorAfter)
	}
	if err != nil && ctx.Err() == nil {
		d.log.Warn("fhir subscriptions: record attempts", "err", err) // the leases run out; the attempts are made again
	}
}

// userAgent identifies carehub's notifications to receivers.
const userAgent = "carehub-fhir-subscriptions/1"

// post sends body to j's endpoint with its headers and carehub's signature; a 2xx is success.
func (d *Deliverer) post(ctx context.Context, j *job, body []byte) error {
	sub := j.sub
	ctx, cancel := context.WithTimeout(ctx, time.Duration(sub.TimeoutSeconds)*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, sub.Endpoint, bytes.NewReader(body))
	if err != nil {
		return err
	}
	for _, h := range j.headers {
		name, value, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	req.Header.Set("Content-Type", "application/fhir+json")
	req.Header.Set("User-Agent", userAgent)
	if err := whsig.SetHeaders(req.Header, "msg_"+newUUID(), time.Now(), body, j.secret); err != nil {
		return err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", sub.Endpoint, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("POST %s: %s", sub.Endpoint, resp.Status)
	}
	return nil
}
