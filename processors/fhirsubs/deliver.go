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
	"strings"
	"sync"
	"time"

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
	// Workers bounds the subscriptions delivered to at once (default 16).
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
		cfg.Workers = 16
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if !s.cfg.AllowPrivate {
		dialer.Control = egress.DialControl
	}
	d := &Deliverer{s: s, cfg: cfg, log: cfg.Logger.With("component", "fhir_subscription_delivery"),
		client: &http.Client{
			Transport: &http.Transport{Proxy: nil, DialContext: dialer.DialContext, ForceAttemptHTTP2: true,
				MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: 10 * time.Second},
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
	woken, stop := d.cfg.Wake.Wait("")
	defer stop()
	defer d.client.CloseIdleConnections()
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
	return nil
}

// round leases the subscriptions with work due and works them, Workers at a time; it returns how
// many it leased.
func (d *Deliverer) round(ctx context.Context) int {
	base := d.cfg.BaseURL()
	if base == "" {
		return 0
	}
	rows, _ := d.s.pool.Query(ctx, `update fhir_subscriptions set lease_until = now() + $1::interval
where id in (
	select id from fhir_subscriptions
	where deleted_at is null and channel = 'rest-hook' and status <> 'off' and next_attempt_at <= now()
	  and (lease_until is null or lease_until < now())
	  and (status = 'requested' or last_sent_at is null or delivered_through < events_since_start
	       or (heartbeat_seconds > 0 and coalesce(last_sent_at, created_at) + heartbeat_seconds * interval '1 second' <= now()))
	order by next_attempt_at limit $2
	for update skip locked)
returning `+columns, leaseFor.String(), d.cfg.Workers*4)
	var subs []Subscription
	for rows.Next() {
		sub, err := scanSubscription(rows)
		if err != nil {
			rows.Close()
			break
		}
		subs = append(subs, sub)
	}
	if err := rows.Err(); err != nil {
		if ctx.Err() == nil {
			d.log.Warn("fhir subscriptions: lease", "err", err)
		}
		return 0
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, d.cfg.Workers)
	for _, sub := range subs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			d.work(ctx, sub, base)
		}()
	}
	wg.Wait()
	return len(subs)
}

// work makes one attempt for sub (its handshake, its next notification, or a heartbeat) and
// records it, releasing the lease.
func (d *Deliverer) work(ctx context.Context, sub Subscription, base string) {
	typ, evs := TypeHeartbeat, []event(nil)
	var err error
	switch {
	case sub.Status == StatusRequested || sub.LastSentAt == nil:
		// No receiver took anything yet, not even the handshake (a failed one left it in error):
		// the handshake again, before any notification.
		typ = TypeHandshake
	case sub.DeliveredThrough < sub.EventsSinceStart:
		typ = TypeNotification
		evs, err = d.s.events(ctx, sub.ID, sub.DeliveredThrough, min(sub.EventsSinceStart, sub.DeliveredThrough+int64(sub.MaxCount)))
	}
	usable := err == nil
	if usable {
		usable, err = d.s.keyUsable(ctx, sub.KeyID)
	}
	if err == nil && !usable {
		err = fmt.Errorf("the key that created the subscription (%s) is revoked or expired", sub.KeyID)
	}
	var patients []string
	if err == nil {
		if typ == TypeHandshake {
			sub.Status = StatusActive // what the handshake announces once the receiver takes it
		}
		var body []byte
		body, patients, err = d.s.bundle(ctx, sub, base, typ, evs)
		if err == nil {
			err = d.post(ctx, sub, body)
		}
	}
	outcome := "ok"
	if err != nil {
		outcome = "failed"
	}
	d.sent.WithLabelValues(typ, outcome).Inc()
	if err != nil {
		d.failed(ctx, sub, err)
		return
	}
	through := sub.DeliveredThrough
	if len(evs) > 0 {
		through = evs[len(evs)-1].Number
		for _, ev := range evs {
			d.latency.Observe(time.Since(ev.OccurredAt).Seconds())
		}
	}
	_, dbErr := d.s.pool.Exec(ctx, `update fhir_subscriptions set status = 'active', delivered_through = greatest(delivered_through, $2),
	failures = 0, last_error = '', last_sent_at = now(), next_attempt_at = now(), lease_until = null
where id = $1 and status <> 'off'`, sub.ID, through)
	if dbErr != nil && ctx.Err() == nil {
		d.log.Warn("fhir subscriptions: record delivery", "subscription_id", sub.ID, "err", dbErr)
	}
	d.s.audit(sub, evs, patients)
}

// userAgent identifies carehub's notifications to receivers.
const userAgent = "carehub-fhir-subscriptions/1"

// failed records a failed attempt: the next one waits 1 s doubling to 30 s, and the
// subscription is in error from the third failure in a row.
func (d *Deliverer) failed(ctx context.Context, sub Subscription, cause error) {
	wait := FirstRetry << min(sub.Failures, 20)
	wait = min(wait, LastRetry)
	msg := cause.Error()
	if len(msg) > 500 {
		msg = msg[:500]
	}
	_, err := d.s.pool.Exec(ctx, `update fhir_subscriptions set failures = failures + 1, last_error = $2,
	status = case when status = 'requested' or failures + 1 >= $3 then 'error' else status end,
	next_attempt_at = now() + $4::interval, lease_until = null
where id = $1 and status <> 'off'`, sub.ID, msg, errorAfter, wait.String())
	if err != nil && ctx.Err() == nil {
		d.log.Warn("fhir subscriptions: record failure", "subscription_id", sub.ID, "err", err)
	}
	d.log.Info("fhir subscription notification failed", "subscription_id", sub.ID, "failures", sub.Failures+1, "err", msg)
}

// post sends body to sub's endpoint with its headers and carehub's signature; a 2xx is success.
func (d *Deliverer) post(ctx context.Context, sub Subscription, body []byte) error {
	var sealedSecret, sealedHeaders []byte
	if err := d.s.pool.QueryRow(ctx, `select secret, headers from fhir_subscriptions where id = $1`, sub.ID).Scan(&sealedSecret, &sealedHeaders); err != nil {
		return fmt.Errorf("read the subscription's secret: %w", err)
	}
	secret, err := d.s.open(sub.ID, "secret", sealedSecret)
	if err != nil {
		return err
	}
	var headers []string
	if sealedHeaders != nil {
		plain, err := d.s.open(sub.ID, "headers", sealedHeaders)
		if err != nil {
			return err
		}
		_ = json.Unmarshal(plain, &headers)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(sub.TimeoutSeconds)*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, sub.Endpoint, bytes.NewReader(body))
	if err != nil {
		return err
	}
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	req.Header.Set("Content-Type", "application/fhir+json")
	req.Header.Set("User-Agent", userAgent)
	if err := whsig.SetHeaders(req.Header, "msg_"+newUUID(), time.Now(), body, string(secret)); err != nil {
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
