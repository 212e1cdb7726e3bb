package fhirsubs

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/kernel/sealing"
	"carehub/kernel/whsig"
	"carehub/storage"
	"carehub/storage/postgres"
)

// Config configures a Service.
type Config struct {
	// Key seals signing secrets and channel headers at rest, and signs websocket binding tokens.
	Key *sealing.Key
	// AllowPrivate lets rest-hook endpoints be private addresses (as --webhooks-allow-private).
	AllowPrivate bool
	// Read reads a resource as the principal in ctx may (the FHIR base's read): what a
	// full-resource notification carries. Required for full-resource subscriptions.
	Read func(ctx context.Context, resourceType, id string) (json.RawMessage, error)
	// Audit records a notification that carried patient data (nil: not recorded).
	Audit  func(storage.AuditRecord)
	Logger *slog.Logger
}

// Service keeps FHIR Subscriptions and reads their notifications back.
type Service struct {
	pool *pgxpool.Pool
	cfg  Config
	box  cipher.AEAD
	log  *slog.Logger
}

// MaxPerOrganization bounds an organization's subscriptions (not deleted): the notifier holds
// every live one in memory and matches each event against them.
const MaxPerOrganization = 5000

// sealInfo names this use of the server key (kernel/sealing derives one key per use).
const sealInfo = "carehub fhir subscription v1"

// New returns the service on pool.
func New(pool *pgxpool.Pool, cfg Config) *Service {
	if cfg.Key == nil {
		cfg.Key = sealing.Random()
	}
	box, err := cfg.Key.AEAD(sealInfo, nil)
	if err != nil {
		panic("fhirsubs: sealing key: " + err.Error()) // fixed lengths: cannot fail
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{pool: pool, cfg: cfg, box: box, log: cfg.Logger}
}

// seal encrypts plain for subscription id (the associated data: a sealed value copied into
// another row does not open there).
func (s *Service) seal(id, what string, plain []byte) []byte {
	n := s.box.NonceSize()
	nonce := make([]byte, n, n+len(plain)+s.box.Overhead())
	rand.Read(nonce)
	return s.box.Seal(nonce, nonce, plain, []byte(id+"/"+what))
}

func (s *Service) open(id, what string, sealed []byte) ([]byte, error) {
	n := s.box.NonceSize()
	if len(sealed) < n {
		return nil, errors.New("a sealed value of subscription " + id + " is too short")
	}
	plain, err := s.box.Open(nil, sealed[:n], sealed[n:], []byte(id+"/"+what))
	if err != nil {
		return nil, fmt.Errorf("a sealed value of subscription %s does not open under this node's sealing key", id)
	}
	return plain, nil
}

// subscribing returns the caller when it may hold a subscription: every topic is about patients'
// Observations and RiskAssessments, so notifications need read:patients and read:observations.
func subscribing(ctx context.Context) (*access.Principal, error) {
	p, err := access.Require(ctx, access.ReadPatients, access.ReadObservations)
	if err != nil {
		return nil, err
	}
	if p.OrgID == "" {
		return nil, fault.Invalid("a subscription belongs to an organization: use an organization's key")
	}
	return p, nil
}

// Create stores the Subscription in body for the caller's organization and returns it as
// created, with its signing secret (rest-hook) shown this once. A rest-hook subscription starts
// requested; the deliverer's handshake makes it active. A websocket one is active at once.
func (s *Service) Create(ctx context.Context, body []byte) (json.RawMessage, error) {
	p, err := subscribing(ctx)
	if err != nil {
		return nil, err
	}
	sub, err := parse(body, s.cfg.AllowPrivate)
	if err != nil {
		return nil, err
	}
	if sub.Content == ContentFull && s.cfg.Read == nil {
		return nil, fault.Invalid("full-resource notifications are not served by this node")
	}
	sub.ID, sub.OrgID, sub.KeyID, sub.Mode, sub.Scopes = ids.New(ids.Subscription), p.OrgID, p.KeyID, p.Mode, p.Scopes
	if p.Platform {
		sub.Scopes = []string{access.ReadPatients, access.ReadObservations}
	}
	sub.Status = StatusActive
	var secret string
	var sealedSecret, sealedHeaders []byte
	if sub.Channel == ChannelRestHook {
		sub.Status = StatusRequested
		secret = whsig.NewSecret()
		sealedSecret = s.seal(sub.ID, "secret", []byte(secret))
		if len(sub.Headers) > 0 {
			h, _ := json.Marshal(sub.Headers)
			sealedHeaders = s.seal(sub.ID, "headers", h)
		}
	}
	filters, _ := json.Marshal(sub.Filters)
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The organization's creates one at a time, so that concurrent ones cannot all pass the
		// count and overshoot the cap: the lock first, then the count in a statement of its own,
		// whose snapshot (taken when it starts) sees the creates committed while it waited.
		if _, err := tx.Exec(ctx, `select pg_advisory_xact_lock(hashtext('fhir-subscriptions ' || $1))`, sub.OrgID); err != nil {
			return err
		}
		var held int
		if err := tx.QueryRow(ctx, `select count(*) from fhir_subscriptions where org_id = $1 and deleted_at is null`, sub.OrgID).Scan(&held); err != nil {
			return fmt.Errorf("count subscriptions: %w", err)
		}
		if held >= MaxPerOrganization {
			return fault.New(fault.KindRateLimited, "the organization holds %d subscriptions, the most it may: delete one first", held)
		}
		err := tx.QueryRow(ctx, `insert into fhir_subscriptions (id, org_id, key_id, mode, scopes, topic, filters, criteria, reason,
	channel, endpoint, headers, secret, content, heartbeat_seconds, timeout_seconds, max_count, status)
values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18) returning created_at`,
			sub.ID, sub.OrgID, sub.KeyID, sub.Mode, sub.Scopes, sub.Topic.ID, filters, sub.Criteria, sub.Reason,
			sub.Channel, sub.Endpoint, sealedHeaders, sealedSecret, sub.Content, sub.HeartbeatSeconds, sub.TimeoutSeconds, sub.MaxCount,
			sub.Status).Scan(&sub.CreatedAt)
		if err != nil {
			return err
		}
		return changed(ctx, tx, `insert into fhir_subscription_counters (subscription_id) values ($1)`, sub.ID)
	})
	if f := fault.As(err); f != nil && f.Kind == fault.KindRateLimited {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("store subscription: %w", postgres.Refused(err))
	}
	access.Touch(ctx, "fhir_subscription", sub.ID)
	return json.Marshal(sub.resource(secret))
}

// columns are a subscription's columns as scanSubscription reads them, from subscriptions.
const columns = `id, org_id, key_id, mode, scopes, topic, filters, criteria, reason, channel, endpoint, content,
	heartbeat_seconds, timeout_seconds, max_count, status, events_since_start, delivered_through, failures, last_error, created_at,
	last_sent_at`

// subscriptions is what columns are read from: a subscription with its counter.
const subscriptions = `fhir_subscriptions join fhir_subscription_counters on subscription_id = id`

func scanSubscription(row pgx.Row) (Subscription, error) {
	var sub Subscription
	var topic string
	var filters []byte
	err := row.Scan(&sub.ID, &sub.OrgID, &sub.KeyID, &sub.Mode, &sub.Scopes, &topic, &filters, &sub.Criteria, &sub.Reason,
		&sub.Channel, &sub.Endpoint, &sub.Content, &sub.HeartbeatSeconds, &sub.TimeoutSeconds, &sub.MaxCount, &sub.Status,
		&sub.EventsSinceStart, &sub.DeliveredThrough, &sub.Failures, &sub.LastError, &sub.CreatedAt, &sub.LastSentAt)
	if err != nil {
		return sub, err
	}
	sub.Topic, _ = LookupTopic(topic)
	_ = json.Unmarshal(filters, &sub.Filters)
	return sub, nil
}

// changed runs a statement that creates or deletes a subscription, and bumps the generation the
// notifier reloads its copy on, in tx.
func changed(ctx context.Context, tx pgx.Tx, statement string, args ...any) error {
	if _, err := tx.Exec(ctx, statement, args...); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `update fhir_subscription_generation set generation = generation + 1`)
	return err
}

// get reads the caller's subscription id: NotFound for one of another organization, as for one
// that does not exist.
func (s *Service) get(ctx context.Context, id string) (Subscription, error) {
	p, err := subscribing(ctx)
	if err != nil {
		return Subscription{}, err
	}
	id = ids.FromFHIR(id)
	sub, err := scanSubscription(s.pool.QueryRow(ctx, `select `+columns+` from `+subscriptions+`
where id = $1 and deleted_at is null and ($2 = '' or org_id = $2)`, id, p.OrgFilter()))
	if errors.Is(err, pgx.ErrNoRows) {
		return sub, fault.NotFound("Subscription", ids.FHIR(id))
	}
	if err != nil {
		return sub, fmt.Errorf("read subscription: %w", err)
	}
	// A test key sees only test subscriptions: their notifications are about synthetic patients.
	if sub.Mode == access.Live && !p.SeesRealPatients() {
		return sub, fault.NotFound("Subscription", ids.FHIR(id))
	}
	sub.Headers = nil
	return sub, nil
}

// Read returns the caller's subscription id as an R4 Subscription.
func (s *Service) Read(ctx context.Context, id string) (json.RawMessage, error) {
	sub, err := s.get(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := s.loadHeaders(ctx, &sub); err != nil {
		return nil, err
	}
	return json.Marshal(sub.resource(""))
}

// loadHeaders fills sub.Headers from its sealed column.
func (s *Service) loadHeaders(ctx context.Context, sub *Subscription) error {
	var sealed []byte
	if err := s.pool.QueryRow(ctx, `select headers from fhir_subscriptions where id = $1`, sub.ID).Scan(&sealed); err != nil {
		return fmt.Errorf("read subscription headers: %w", err)
	}
	return s.openHeaders(sub, sealed)
}

// openHeaders fills sub.Headers from their sealed value (nil: none).
func (s *Service) openHeaders(sub *Subscription, sealed []byte) error {
	if sealed == nil {
		return nil
	}
	plain, err := s.open(sub.ID, "headers", sealed)
	if err != nil {
		return err
	}
	return json.Unmarshal(plain, &sub.Headers)
}

// maxSearch bounds a search's page: an organization's subscriptions, newest first.
const maxSearch = 500

// Search returns the caller's subscriptions, newest first, of status when it is set.
func (s *Service) Search(ctx context.Context, status string) ([]json.RawMessage, error) {
	p, err := subscribing(ctx)
	if err != nil {
		return nil, err
	}
	modes := []string{access.Live, access.Test}
	if !p.SeesRealPatients() {
		modes = []string{access.Test}
	}
	rows, _ := s.pool.Query(ctx, `select `+columns+`, headers from `+subscriptions+`
where deleted_at is null and ($1 = '' or org_id = $1) and ($2 = '' or status = $2) and mode = any($3)
order by created_at desc, id desc limit $4`, p.OrgFilter(), status, modes, maxSearch)
	var sealed [][]byte
	subs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Subscription, error) {
		var h []byte
		sub, err := scanSubscription(rowWith{r, []any{&h}})
		sealed = append(sealed, h)
		return sub, err
	})
	if err != nil {
		return nil, fmt.Errorf("search subscriptions: %w", err)
	}
	out := make([]json.RawMessage, 0, len(subs))
	for i, sub := range subs {
		if err := s.openHeaders(&sub, sealed[i]); err != nil {
			return nil, err
		}
		b, err := json.Marshal(sub.resource(""))
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// Delete ends the caller's subscription id: it is off, and no longer read, searched or notified.
func (s *Service) Delete(ctx context.Context, id string) error {
	sub, err := s.get(ctx, id)
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		return changed(ctx, tx, `update fhir_subscriptions set status = 'off', deleted_at = now() where id = $1`, sub.ID)
	})
	if err != nil {
		return fmt.Errorf("delete subscription: %w", err)
	}
	access.Touch(ctx, "fhir_subscription", sub.ID)
	return nil
}

// Status returns $status: a searchset Bundle holding the subscription's SubscriptionStatus.
func (s *Service) Status(ctx context.Context, id, base string) (json.RawMessage, error) {
	sub, err := s.get(ctx, id)
	if err != nil {
		return nil, err
	}
	st := statusParameters(sub, base, "query-status", nil)
	return json.Marshal(map[string]any{"resourceType": "Bundle", "type": "searchset", "total": 1,
		"timestamp": time.Now().UTC().Format(time.RFC3339Nano),
		"entry":     []map[string]any{{"fullUrl": "urn:uuid:" + newUUID(), "resource": st, "search": map[string]string{"mode": "match"}}}})
}

// MaxEventsRead bounds one $events answer.
const MaxEventsRead = 1000

// Events returns $events: the subscription's events numbered since..until (inclusive; 0: from the
// first kept, to the last), at most MaxEventsRead, as a history Bundle of type query-event with
// content (the subscription's own when empty). A subscriber that was down reads what it missed.
func (s *Service) Events(ctx context.Context, id string, since, until int64, content, base string) (json.RawMessage, error) {
	sub, err := s.get(ctx, id)
	if err != nil {
		return nil, err
	}
	if content != "" {
		sub.Content = content
	}
	if since <= 0 {
		since = 1
	}
	if until <= 0 || until > sub.EventsSinceStart {
		until = sub.EventsSinceStart
	}
	until = min(until, since+MaxEventsRead-1)
	evs, err := s.events(ctx, sub.ID, since-1, until)
	if err != nil {
		return nil, err
	}
	b, _, err := s.bundle(ctx, sub, base, "query-event", evs)
	return b, err
}

// event is a numbered notification event of a subscription.
type event struct {
	Number     int64
	EventID    string
	FocusType  string
	FocusID    string
	PatientID  string
	OccurredAt time.Time
}

// events reads subscription id's events numbered after..through.
func (s *Service) events(ctx context.Context, id string, after, through int64) ([]event, error) {
	rows, _ := s.pool.Query(ctx, `select number, event_id, focus_type, focus_id, patient_id, occurred_at
from fhir_subscription_events where subscription_id = $1 and number > $2 and number <= $3 order by number`, id, after, through)
	evs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[event])
	if err != nil {
		return nil, fmt.Errorf("read subscription events: %w", err)
	}
	return evs, nil
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// principal is the credential a subscription reads as: its creator's organization, key, mode
// and scopes, as they were when it was created.
func (sub Subscription) principal() *access.Principal {
	return &access.Principal{OrgID: sub.OrgID, KeyID: sub.KeyID, Mode: sub.Mode, Scopes: sub.Scopes}
}

// keyUsable reports whether the subscription's creator key still authenticates: a revoked or
// expired key's subscriptions deliver nothing more (they wait, and deliver again if it is not).
func (s *Service) keyUsable(ctx context.Context, keyID string) (bool, error) {
	var ok bool
	err := s.pool.QueryRow(ctx, `select status <> 'revoked' and (expires_at is null or expires_at > now()) from api_keys where id = $1`,
		keyID).Scan(&ok)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return ok, err
}
