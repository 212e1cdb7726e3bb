// Package webhooks manages webhook subscriptions and delivers events to them, signed per Standard
// Webhooks (DECISIONS §5).
//
// Two halves share one Postgres schema (schemas/postgres/0003_webhooks.sql):
//
//	service.go        Service: subscriptions, deliveries and attempts for the API (scopes, tenancy)
//	testsend.go       Service.Test: POST /api/v1/webhooks/test
//	dispatcher.go     Dispatcher: the "carehub-webhooks" consumer group on carehub.events.v1; it
//	                  records one delivery per (subscription, event) before committing offsets
//	fast.go           the consumer's own first attempts to healthy subscriptions, each delivery
//	                  recorded once, finished, before the offsets are committed
//	subscriptions.go  the dispatcher's per-project subscription cache
//	deliver.go        the delivery worker pool: claims and refills lanes, attempts, leases
//	outcomes.go       each lane's outcome writer: attempts, deliveries and the subscription's state
//	sender.go         one signed HTTP attempt (no redirects, no proxy, bounded, trimmed answer);
//	                  destinations are checked by kernel/egress, at create time and in the dialer
//	sign.go           secrets, Standard Webhooks signatures, the delivered body
//	seal.go           secrets at rest: sealed under the server sealing key, and the start-up
//	                  step that seals those older versions stored in clear
//	phi.go            patient data in delivered bodies: what each subscription may carry
//	schedule.go       retry schedule, jitter, Retry-After
//	nodeverify/       the reference verifier (npm standardwebhooks) the tests check against
//
// Delivery is at least once: concurrent per subscription by default, or in order (Settings). An
// event becomes a delivery row before its Kafka offset is committed: attempted already by the
// consumer (fast.go), or for the dispatcher that holds its subscription's lane lease to attempt.
// A consumer killed before it records its attempts reads their events again, and a lease that is
// not renewed (a dispatcher killed mid-attempt) expires: either way the delivery is sent again,
// with the same webhook-id, so receivers deduplicate.
package webhooks

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
	"carehub/kernel/config"
	"carehub/kernel/egress"
	"carehub/kernel/events"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/kernel/phi"
	"carehub/kernel/sealing"
	"carehub/kernel/whsig"
	"carehub/storage/idempotency"
	"carehub/storage/postgres"
)

// Subscription is a webhook subscription. Secret is the full secret only on the results of Create
// and RotateSecret; elsewhere it is masked.
type Subscription struct {
	ID              string     `json:"id"`
	OrgID           string     `json:"-"`
	ProjectID       string     `json:"projectId"`
	URL             string     `json:"url"`
	Events          []string   `json:"events"`
	Status          string     `json:"status"` // active, paused, failing, disabled
	Secret          string     `json:"secret"`
	FailureCount    int        `json:"failureCount"`
	LastDeliveredAt *time.Time `json:"lastDeliveredAt"`
	CreatedAt       time.Time  `json:"createdAt"`
	UpdatedAt       time.Time  `json:"updatedAt"`
	Settings
}

// Settings is how a subscription's deliveries are sent (issue 55; deliver.go).
type Settings struct {
	// Ordered sends one POST at a time in the order events were consumed, each carrying up to
	// BatchSize events as a JSON array; otherwise (the default) up to MaxInFlight attempts run at
	// once and order is best effort.
	Ordered     bool `json:"ordered"`
	MaxInFlight int  `json:"maxInFlight"` // concurrent mode: 1..64, default DefaultMaxInFlightPerSubscription
	BatchSize   int  `json:"batchSize"`   // ordered mode: events a POST, 1..100, default 1
	RateLimit   int  `json:"rateLimit"`   // events a second at most, 0..10000; 0: no limit
}

// Bounds and defaults of Settings.
const (
	DefaultMaxInFlightPerSubscription = 16
	MaxInFlightPerSubscription        = 64
	MaxBatchSize                      = 100
	MaxRateLimit                      = 10_000
)

// Options changes Settings on Create and Update; nil fields take the default (Create) or stay
// as they are (Update).
type Options struct {
	Ordered     *bool `json:"ordered"`
	MaxInFlight *int  `json:"maxInFlight"`
	BatchSize   *int  `json:"batchSize"`
	RateLimit   *int  `json:"rateLimit"`
}

// check validates the options that are set.
func (o Options) check() error {
	fields := map[string]string{}
	if o.MaxInFlight != nil && (*o.MaxInFlight < 1 || *o.MaxInFlight > MaxInFlightPerSubscription) {
		fields["maxInFlight"] = fmt.Sprintf("must be 1..%d", MaxInFlightPerSubscription)
	}
	if o.BatchSize != nil && (*o.BatchSize < 1 || *o.BatchSize > MaxBatchSize) {
		fields["batchSize"] = fmt.Sprintf("must be 1..%d", MaxBatchSize)
	}
	if o.RateLimit != nil && (*o.RateLimit < 0 || *o.RateLimit > MaxRateLimit) {
		fields["rateLimit"] = fmt.Sprintf("must be 0..%d (0: no limit)", MaxRateLimit)
	}
	if len(fields) > 0 {
		return fault.Validation("invalid delivery settings", fields)
	}
	return nil
}

// Delivery is one event's delivery to one subscription.
type Delivery struct {
	ID             string     `json:"id"`
	WebhookID      string     `json:"webhookId"`
	EventID        string     `json:"eventId"`
	EventType      string     `json:"eventType"`
	Status         string     `json:"status"` // pending, delivering, succeeded, failed, cancelled
	AttemptCount   int        `json:"attemptCount"`
	NextAttemptAt  *time.Time `json:"nextAttemptAt"`
	LastAttemptAt  *time.Time `json:"lastAttemptAt"`
	LastStatusCode *int       `json:"lastStatusCode"`
	CreatedAt      time.Time  `json:"createdAt"`
	// Body is the request body sent, as the reader may see it (phi.go); only Service.Delivery
	// fills it.
	Body json.RawMessage `json:"body,omitempty"`
}

// Attempt is one HTTP attempt of a delivery.
type Attempt struct {
	ID           string    `json:"id"`
	DeliveryID   string    `json:"deliveryId"`
	StatusCode   *int      `json:"statusCode"`
	LatencyMs    int       `json:"latencyMs"`
	Error        *string   `json:"error"`
	ResponseBody *string   `json:"responseBody"`
	AttemptedAt  time.Time `json:"attemptedAt"`
}

// Update changes a subscription; nil fields stay as they are.
type Update struct {
	URL    *string
	Events []string
	Status *string // active, paused, disabled
	Options
}

// Subscription statuses.
const (
	StatusActive   = "active"
	StatusPaused   = "paused"
	StatusFailing  = "failing"
	StatusDisabled = "disabled"
)

// Delivery statuses.
const (
	DeliveryPending    = "pending"
	DeliveryDelivering = "delivering"
	DeliverySucceeded  = "succeeded"
	DeliveryFailed     = "failed"
	DeliveryCancelled  = "cancelled"
)

// PauseAfter is the number of consecutive failed attempts that pauses a subscription.
const PauseAfter = 10

// RotationOverlap is how long a rotated-out secret keeps signing.
const RotationOverlap = 24 * time.Hour

// RedeliverWindow is how long a finished delivery can be sent again.
const RedeliverWindow = 30 * 24 * time.Hour

// NotifyChannel is the Postgres channel on which subscription changes ("sub:<project id>") and
// newly due deliveries ("due") are announced to every dispatcher.
const NotifyChannel = "carehub_webhooks"

const maxPatterns = 100

// ServiceConfig configures a Service. Zero fields take their defaults.
type ServiceConfig struct {
	// AllowPrivate permits subscription URLs and test sends to private, loopback and other
	// non-public destinations, and plain http://. For development and tests only
	// (--webhooks-allow-private).
	AllowPrivate bool
	// Timeout bounds a test send. Default DefaultTimeout.
	Timeout time.Duration
	// RootCAs are the certificate authorities a receiver's certificate is checked against (nil:
	// the system's; --webhooks-ca-file adds a private one).
	RootCAs *x509.CertPool
	// Key is the server sealing key that signing secrets are sealed under (seal.go); the
	// dispatchers and every node sharing the database must have the same. Default: a random key
	// of this Service's own, whose secrets nothing else opens: for tests only.
	Key *sealing.Key
}

func (c *ServiceConfig) defaults() {
	config.Default(&c.Timeout, DefaultTimeout)
	if c.Key == nil {
		c.Key = sealing.Random()
	}
}

// Service is the webhook subscription service used by the GraphQL and REST transports. Every
// method checks the caller's scope and tenancy from ctx: reads of subscriptions (List, Get, ByIDs)
// take any valid credential and mask secrets; everything else requires admin:org. Another
// organization's subscription or delivery is NOT_FOUND.
type Service struct {
	pool   *pgxpool.Pool
	guard  *phi.Guard
	cfg    ServiceConfig
	sender *sender
	box    secretBox
}

// NewService returns the service on pool.
func NewService(pool *pgxpool.Pool, cfg ServiceConfig) *Service {
	cfg.defaults()
	return &Service{pool: pool, guard: phi.NewGuard(postgres.SyntheticPatients{Pool: pool}), cfg: cfg, sender: newSender(cfg.AllowPrivate, cfg.Timeout, 2, cfg.RootCAs),
		box: newSecretBox(cfg.Key)}
}

// allowPrivateHint ends the refusal of a URL that only --webhooks-allow-private would accept, so
// that whoever tries the README tour's http://127.0.0.1 receiver on a strict node learns why.
const allowPrivateHint = "; a node started with --webhooks-allow-private also accepts http to private and loopback addresses"

// checkURL is egress.CheckURL under the service's AllowPrivate, naming the flag when it is what
// refused the URL.
func (s *Service) checkURL(url string) error {
	err := egress.CheckURL(url, s.cfg.AllowPrivate)
	if err == nil || s.cfg.AllowPrivate || egress.CheckURL(url, true) != nil {
		return err
	}
	f := fault.As(err)
	return &fault.Error{Kind: f.Kind, Message: f.Message + allowPrivateHint, Details: f.Details}
}

const subscriptionColumns = `id, org_id, project_id, url, events, status, secret, secret_sealed, failure_count,
	last_delivered_at, created_at, updated_at, ordered, max_in_flight, batch_size, rate_limit`

// scanSubscription reads a subscription, its secret masked.
func (s *Service) scanSubscription(row pgx.Row) (*Subscription, error) {
	var sub Subscription
	var secret storedSecrets
	err := row.Scan(&sub.ID, &sub.OrgID, &sub.ProjectID, &sub.URL, &sub.Events, &sub.Status, &secret.current,
		&secret.currentSealed, &sub.FailureCount, &sub.LastDeliveredAt, &sub.CreatedAt, &sub.UpdatedAt,
		&sub.Ordered, &sub.MaxInFlight, &sub.BatchSize, &sub.RateLimit)
	if err != nil {
		return nil, err
	}
	sub.Secret = s.maskedSecret(sub.ID, secret)
	sub.CreatedAt, sub.UpdatedAt = sub.CreatedAt.UTC(), sub.UpdatedAt.UTC()
	if sub.LastDeliveredAt != nil {
		t := sub.LastDeliveredAt.UTC()
		sub.LastDeliveredAt = &t
	}
	return &sub, nil
}

// maskedSecret shows the end of the current secret, as reads do. A secret that does not open
// shows none: the read is still worth answering, and deliveries report the failure.
func (s *Service) maskedSecret(id string, st storedSecrets) string {
	current, err := s.box.pick(id, st.current, st.currentSealed)
	if err != nil {
		return whsig.SecretPrefix + "…"
	}
	return whsig.Mask(current)
}

// checkEvents validates and normalizes subscription patterns: at least one, each an exact type,
// "prefix.*" or "*", duplicates removed, order kept.
func checkEvents(patterns []string) ([]string, error) {
	if len(patterns) == 0 {
		return nil, fault.Validation("events must name at least one event type or pattern",
			map[string]string{"events": "at least one pattern is required"})
	}
	if len(patterns) > maxPatterns {
		return nil, fault.Validation("too many event patterns", map[string]string{"events": "at most 100 patterns"})
	}
	out := make([]string, 0, len(patterns))
	for _, p := range patterns {
		if !events.ValidPattern(p) {
			return nil, fault.Validation("invalid event pattern "+quote(p),
				map[string]string{"events": "each pattern is an event type (two or more dot-separated segments of [a-z0-9_]), prefix.* or *"})
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// Create registers a subscription and returns it with its full secret. The subscription records
// what patient data the caller may read (its patient scopes and mode): its deliveries carry that
// much and no more (phi.go).
func (s *Service) Create(ctx context.Context, projectID, url string, patterns []string, opts Options) (*Subscription, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	if err := s.checkURL(url); err != nil {
		return nil, err
	}
	patterns, err = checkEvents(patterns)
	if err != nil {
		return nil, err
	}
	patientScopes, patientMode := phi.ReaderOf(p).Grant()
	id, secret := ids.New(ids.Webhook), whsig.NewSecret()
	var sub *Subscription
	err = s.inTx(ctx, &sub, func(tx pgx.Tx) error {
		row := tx.QueryRow(ctx, `
insert into webhooks (id, org_id, project_id, url, events, secret_sealed, patient_scopes, patient_mode,
	ordered, max_in_flight, batch_size, rate_limit)
select $1, p.org_id, p.id, $3, $4, $5, $7, $8, coalesce($9::boolean, false), coalesce($10::int, $13::int), coalesce($11::int, 1), coalesce($12::int, 0)
from projects p where p.id = $2 and ($6 = '' or p.org_id = $6)
returning `+subscriptionColumns,
			id, projectID, url, patterns, s.box.seal(id, secret), p.OrgFilter(), patientScopes, patientMode,
			opts.Ordered, opts.MaxInFlight, opts.BatchSize, opts.RateLimit, DefaultMaxInFlightPerSubscription)
		var err error
		if sub, err = s.scanSubscription(row); errors.Is(err, pgx.ErrNoRows) {
			return fault.NotFound("project", projectID)
		} else if err != nil {
			return err
		}
		sub.Secret = secret
		return notify(ctx, tx, "sub:"+sub.ProjectID)
	})
	if err != nil {
		return nil, wrap("create webhook", err)
	}
	return sub, nil
}

// List returns the subscriptions of a project, secrets masked.
func (s *Service) List(ctx context.Context, projectID string) ([]Subscription, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	var visible bool
	err = s.pool.QueryRow(ctx, `select exists (select 1 from projects where id = $1 and ($2 = '' or org_id = $2))`,
		projectID, p.OrgFilter()).Scan(&visible)
	if err != nil {
		return nil, wrap("list webhooks", err)
	}
	if !visible {
		return nil, fault.NotFound("project", projectID)
	}
	rows, err := s.pool.Query(ctx, `select `+subscriptionColumns+` from webhooks
where project_id = $1 and deleted_at is null and ($2 = '' or org_id = $2) order by created_at, id`, projectID, p.OrgFilter())
	if err != nil {
		return nil, wrap("list webhooks", err)
	}
	out := []Subscription{}
	for rows.Next() {
		sub, err := s.scanSubscription(rows)
		if err != nil {
			rows.Close()
			return nil, wrap("list webhooks", err)
		}
		out = append(out, *sub)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("list webhooks", err)
	}
	return out, nil
}

// Get returns one subscription, secret masked.
func (s *Service) Get(ctx context.Context, id string) (*Subscription, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	sub, err := s.scanSubscription(s.pool.QueryRow(ctx, `select `+subscriptionColumns+` from webhooks
where id = $1 and deleted_at is null and ($2 = '' or org_id = $2)`, id, p.OrgFilter()))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("webhook", id)
	}
	if err != nil {
		return nil, wrap("get webhook", err)
	}
	return sub, nil
}

// ByIDs returns subscriptions by id (a batched loader), secrets masked, tenancy applied.
func (s *Service) ByIDs(ctx context.Context, idList []string) (map[string]*Subscription, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*Subscription, len(idList))
	if len(idList) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, `select `+subscriptionColumns+` from webhooks
where id = any($1) and deleted_at is null and ($2 = '' or org_id = $2)`, idList, p.OrgFilter())
	if err != nil {
		return nil, wrap("load webhooks", err)
	}
	defer rows.Close()
	for rows.Next() {
		sub, err := s.scanSubscription(rows)
		if err != nil {
			return nil, wrap("load webhooks", err)
		}
		out[sub.ID] = sub
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("load webhooks", err)
	}
	return out, nil
}

// Update changes url, events or status. Status active resumes a paused, failing or disabled
// subscription: failureCount returns to 0 and every pending delivery becomes due at once, to be
// sent in order. paused stops attempts and keeps pending deliveries; disabled stops attempts
// and records no new deliveries. Like Create, it records what patient data the caller may read:
// from then on the subscription's deliveries carry that much, so a credential that may not read
// patient data cannot point a subscription somewhere else and receive it.
func (s *Service) Update(ctx context.Context, id string, u Update) (*Subscription, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	if u.URL != nil {
		if err := s.checkURL(*u.URL); err != nil {
			return nil, err
		}
	}
	if u.Events != nil {
		if u.Events, err = checkEvents(u.Events); err != nil {
			return nil, err
		}
	}
	if err := u.Options.check(); err != nil {
		return nil, err
	}
	if u.Status != nil && !slices.Contains([]string{StatusActive, StatusPaused, StatusDisabled}, *u.Status) {
		return nil, fault.Validation("invalid status "+quote(*u.Status),
			map[string]string{"status": "must be active, paused or disabled"})
	}
	patientScopes, patientMode := phi.ReaderOf(p).Grant()
	var sub *Subscription
	err = s.inTx(ctx, &sub, func(tx pgx.Tx) error {
		row := tx.QueryRow(ctx, `
update webhooks set
	url = coalesce($3, url),
	events = coalesce($4, events),
	status = coalesce($5, status),
	failure_count = case when $5 = 'active' then 0 else failure_count end,
	patient_scopes = $6, patient_mode = $7,
	ordered = coalesce($8::boolean, ordered), max_in_flight = coalesce($9::int, max_in_flight),
	batch_size = coalesce($10::int, batch_size), rate_limit = coalesce($11::int, rate_limit),
	updated_at = now()
where id = $1 and deleted_at is null and ($2 = '' or org_id = $2)
returning `+subscriptionColumns, id, p.OrgFilter(), u.URL, u.Events, u.Status, patientScopes, patientMode,
			u.Ordered, u.MaxInFlight, u.BatchSize, u.RateLimit)
		var err error
		if sub, err = s.scanSubscription(row); errors.Is(err, pgx.ErrNoRows) {
			return fault.NotFound("webhook", id)
		} else if err != nil {
			return err
		}
		if u.Status != nil && *u.Status == StatusActive {
			if _, err := tx.Exec(ctx, `update webhook_deliveries set next_attempt_at = now(), updated_at = now()
where webhook_id = $1 and status = 'pending' and next_attempt_at > now()`, id); err != nil {
				return err
			}
			if err := notify(ctx, tx, "due"); err != nil {
				return err
			}
		}
		return notify(ctx, tx, "sub:"+sub.ProjectID)
	})
	if err != nil {
		return nil, wrap("update webhook", err)
	}
	return sub, nil
}

// RotateSecret issues a new secret, returned in full; the old one keeps signing for 24 h. The
// old one moves as it is stored: sealed, or in clear in a row not sealed yet.
func (s *Service) RotateSecret(ctx context.Context, id string) (*Subscription, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	secret := whsig.NewSecret()
	var sub *Subscription
	err = s.inTx(ctx, &sub, func(tx pgx.Tx) error {
		var err error
		sub, err = s.scanSubscription(tx.QueryRow(ctx, `
update webhooks set previous_secret = secret, previous_secret_sealed = secret_sealed,
	previous_secret_expires_at = now() + $4 * interval '1 second',
	secret = null, secret_sealed = $3, updated_at = now()
where id = $1 and deleted_at is null and ($2 = '' or org_id = $2)
returning `+subscriptionColumns, id, p.OrgFilter(), s.box.seal(id, secret), int64(RotationOverlap/time.Second)))
		if err != nil {
			return err
		}
		sub.Secret = secret
		// The consumer signs with the secrets it caches (fast.go): it must drop them.
		return notify(ctx, tx, "sub:"+sub.ProjectID)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("webhook", id)
	}
	if err != nil {
		return nil, wrap("rotate webhook secret", err)
	}
	return sub, nil
}

// Delete removes a subscription (a soft delete: its deliveries stay readable to the platform
// operator until retention removes them). Its pending deliveries are cancelled.
func (s *Service) Delete(ctx context.Context, id string) error {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return err
	}
	err = s.inTx(ctx, nil, func(tx pgx.Tx) error {
		var project string
		err := tx.QueryRow(ctx, `update webhooks set deleted_at = now(), updated_at = now()
where id = $1 and deleted_at is null and ($2 = '' or org_id = $2) returning project_id`, id, p.OrgFilter()).Scan(&project)
		if errors.Is(err, pgx.ErrNoRows) {
			return fault.NotFound("webhook", id)
		} else if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `update webhook_deliveries set status = 'cancelled', lease_owner = null,
	lease_until = null, completed_at = now(), updated_at = now()
where webhook_id = $1 and status in ('pending', 'delivering')`, id); err != nil {
			return err
		}
		return notify(ctx, tx, "sub:"+project)
	})
	return wrap("delete webhook", err)
}

const deliveryColumns = `d.id, d.webhook_id, d.event_id, d.event_type, d.status, d.attempt_count,
	d.next_attempt_at, d.last_attempt_at, d.last_status_code, d.created_at`

func scanDelivery(row pgx.Row, extra ...any) (*Delivery, error) {
	var d Delivery
	var next time.Time
	dest := append([]any{&d.ID, &d.WebhookID, &d.EventID, &d.EventType, &d.Status, &d.AttemptCount, &next,
		&d.LastAttemptAt, &d.LastStatusCode, &d.CreatedAt}, extra...)
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	d.CreatedAt = d.CreatedAt.UTC()
	if d.Status == DeliveryPending || d.Status == DeliveryDelivering {
		next = next.UTC()
		d.NextAttemptAt = &next
	}
	if d.LastAttemptAt != nil {
		t := d.LastAttemptAt.UTC()
		d.LastAttemptAt = &t
	}
	return &d, nil
}

var deliveryStatuses = []string{DeliveryPending, DeliveryDelivering, DeliverySucceeded, DeliveryFailed, DeliveryCancelled}

// Deliveries lists a subscription's deliveries, newest first, optionally by status. limit is
// 1..100 (0: 20), offset ≥ 0.
func (s *Service) Deliveries(ctx context.Context, webhookID, status string, limit, offset int) ([]Delivery, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	if status != "" && !slices.Contains(deliveryStatuses, status) {
		return nil, fault.Validation("invalid delivery status "+quote(status),
			map[string]string{"status": "must be pending, delivering, succeeded, failed or cancelled"})
	}
	if limit == 0 {
		limit = 20
	}
	if limit < 1 || limit > 100 {
		return nil, fault.Validation("limit out of range", map[string]string{"limit": "must be 1..100"})
	}
	if offset < 0 {
		return nil, fault.Validation("offset out of range", map[string]string{"offset": "must be ≥ 0"})
	}
	if err := s.visibleWebhook(ctx, webhookID, p); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `select `+deliveryColumns+` from webhook_deliveries d
where d.webhook_id = $1 and ($2 = '' or d.status = $2)
order by d.created_at desc, d.id desc limit $3 offset $4`, webhookID, status, limit, offset)
	if err != nil {
		return nil, wrap("list deliveries", err)
	}
	defer rows.Close()
	out := []Delivery{}
	for rows.Next() {
		d, err := scanDelivery(rows)
		if err != nil {
			return nil, wrap("list deliveries", err)
		}
		out = append(out, *d)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("list deliveries", err)
	}
	return out, nil
}

// Delivery returns one delivery with the body it sends, as the caller may see it: without the
// patient data that the subscription does not carry or that the caller may not read (phi.go).
func (s *Service) Delivery(ctx context.Context, id string) (*Delivery, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	var body []byte
	var patientScopes []string
	var patientMode string
	d, err := scanDelivery(s.pool.QueryRow(ctx, `select `+deliveryColumns+`, d.body, w.patient_scopes, w.patient_mode
from webhook_deliveries d join webhooks w on w.id = d.webhook_id and w.deleted_at is null
where d.id = $1 and ($2 = '' or d.org_id = $2)`, id, p.OrgFilter()), &body, &patientScopes, &patientMode)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("delivery", id)
	}
	if err != nil {
		return nil, wrap("get delivery", err)
	}
	reader := phi.ReaderFrom(patientScopes, patientMode).And(phi.ReaderOf(p))
	if d.Body, err = servedBody(ctx, s.guard, reader, body); err != nil {
		return nil, wrap("get delivery", err)
	}
	return d, nil
}

// Attempts returns the attempts of each delivery, oldest first (a batched loader).
func (s *Service) Attempts(ctx context.Context, deliveryIDs []string) (map[string][]Attempt, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]Attempt, len(deliveryIDs))
	if len(deliveryIDs) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, `select id, delivery_id, status_code, latency_ms, error, response_body, attempted_at
from webhook_attempt_log where delivery_id = any($1) and ($2 = '' or org_id = $2) order by attempted_at, id`,
		deliveryIDs, p.OrgFilter())
	if err != nil {
		return nil, wrap("load attempts", err)
	}
	defer rows.Close()
	for rows.Next() {
		var a Attempt
		if err := rows.Scan(&a.ID, &a.DeliveryID, &a.StatusCode, &a.LatencyMs, &a.Error, &a.ResponseBody, &a.AttemptedAt); err != nil {
			return nil, wrap("load attempts", err)
		}
		a.AttemptedAt = a.AttemptedAt.UTC()
		out[a.DeliveryID] = append(out[a.DeliveryID], a)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("load attempts", err)
	}
	return out, nil
}

// Redeliver schedules a delivery again at once. A failed or succeeded delivery gets a fresh
// retry schedule (for RedeliverWindow after it was created); a pending one becomes due now; one
// being attempted is returned as it is; a cancelled one (its subscription was deleted) is a
// conflict.
func (s *Service) Redeliver(ctx context.Context, deliveryID string) (*Delivery, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	var d *Delivery
	err = s.inTx(ctx, &d, func(tx pgx.Tx) error {
		var status string
		var created time.Time
		err := tx.QueryRow(ctx, `select d.status, d.created_at from webhook_deliveries d
join webhooks w on w.id = d.webhook_id and w.deleted_at is null
where d.id = $1 and ($2 = '' or d.org_id = $2) for update of d`, deliveryID, p.OrgFilter()).Scan(&status, &created)
		if errors.Is(err, pgx.ErrNoRows) {
			return fault.NotFound("delivery", deliveryID)
		} else if err != nil {
			return err
		}
		switch status {
		case DeliveryCancelled:
			return fault.Conflict("delivery %s was cancelled", deliveryID)
		case DeliveryFailed, DeliverySucceeded:
			if time.Since(created) > RedeliverWindow {
				return fault.Conflict("delivery %s is older than 30 days and can no longer be redelivered", deliveryID)
			}
		}
		d, err = scanDelivery(tx.QueryRow(ctx, `update webhook_deliveries d set
	status = case when d.status = 'delivering' then d.status else 'pending' end,
	schedule_pos = case when d.status in ('failed', 'succeeded') then 0 else d.schedule_pos end,
	next_attempt_at = case when d.status = 'delivering' then d.next_attempt_at else now() end,
	completed_at = case when d.status = 'delivering' then d.completed_at else null end,
	updated_at = now()
where d.id = $1 returning `+deliveryColumns, deliveryID))
		if err != nil {
			return err
		}
		return notify(ctx, tx, "due")
	})
	if err != nil {
		return nil, wrap("redeliver", err)
	}
	return d, nil
}

// Recover schedules again every failed delivery of a subscription created since a time (at most
// RedeliverWindow ago), or with all every finished one (succeeded, failed or cancelled), and
// returns how many. Each is sent again with its own webhook-id, as Redeliver does.
func (s *Service) Recover(ctx context.Context, webhookID string, since time.Time, all bool) (int, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return 0, err
	}
	if since.IsZero() {
		return 0, fault.Validation("since is required", map[string]string{"since": "required (ISO 8601)"})
	}
	if err := s.visibleWebhook(ctx, webhookID, p); err != nil {
		return 0, err
	}
	if earliest := time.Now().Add(-RedeliverWindow); since.Before(earliest) {
		since = earliest
	}
	var n int64
	err = s.inTx(ctx, &n, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `update webhook_deliveries set status = 'pending', schedule_pos = 0,
	next_attempt_at = now(), completed_at = null, updated_at = now()
where webhook_id = $1 and created_at >= $2
	and (status = 'failed' or $3 and status in ('succeeded', 'cancelled'))`, webhookID, since, all)
		if err != nil {
			return err
		}
		n = tag.RowsAffected()
		if n == 0 {
			return nil
		}
		return notify(ctx, tx, "due")
	})
	if err != nil {
		return 0, wrap("recover deliveries", err)
	}
	return int(n), nil
}

// visibleWebhook returns NOT_FOUND unless the caller sees the (non-deleted) subscription.
func (s *Service) visibleWebhook(ctx context.Context, id string, p *access.Principal) error {
	var ok bool
	err := s.pool.QueryRow(ctx, `select exists (select 1 from webhooks where id = $1 and deleted_at is null
and ($2 = '' or org_id = $2))`, id, p.OrgFilter()).Scan(&ok)
	if err != nil {
		return wrap("find webhook", err)
	}
	if !ok {
		return fault.NotFound("webhook", id)
	}
	return nil
}

// inTx runs fn in a transaction: a step of the request's Idempotency-Key claim, if it has one,
// recording *out (see idempotency.Tx).
func (s *Service) inTx(ctx context.Context, out any, fn func(pgx.Tx) error) error {
	return idempotency.Tx(ctx, s.pool, out, fn)
}

// notify announces payload on NotifyChannel when tx commits.
func notify(ctx context.Context, tx pgx.Tx, payload string) error {
	_, err := tx.Exec(ctx, `select pg_notify($1, $2)`, NotifyChannel, payload)
	return err
}

// wrap leaves classified errors as they are and gives the others context.
func wrap(op string, err error) error {
	if err == nil || fault.As(err) != nil {
		return err
	}
	return fmt.Errorf("%s: %w", op, err)
}
