// Package feed is a project's event feed as clients see it: reading the platform event log of a
// project (newest first) and publishing an event into it (publishEvent). Reads go through the
// storage.EventLog contract, so they serve from Postgres or ClickHouse alike; published events go
// through the transactional outbox to carehub.events.v1 like every other event, and so reach the
// log, webhooks and subscriptions the same way.
//
// Every event a client reads here, by query or by stream, is served through processors/phi:
// patient data only to callers that may see it, redacted for the others.
package feed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/processors/access"
	"carehub/processors/events"
	"carehub/processors/fault"
	"carehub/processors/idempotency"
	"carehub/processors/phi"
	"carehub/storage"
	"carehub/storage/kafka"
)

// MaxPayloadBytes bounds a published event's payload (256 KiB).
const MaxPayloadBytes = 256 << 10

// Service reads and publishes project events. It is safe for concurrent use.
type Service struct {
	pool        *pgxpool.Pool
	guard       *phi.Guard
	log         storage.EventLog
	eventsTopic string
}

// Option configures a Service.
type Option func(*Service)

// WithEventsTopic names the topic published events go to (default carehub.events.v1).
func WithEventsTopic(topic string) Option { return func(s *Service) { s.eventsTopic = topic } }

// New returns the feed over pool (projects, outbox) and log (reads).
func New(pool *pgxpool.Pool, log storage.EventLog, opts ...Option) *Service {
	s := &Service{pool: pool, guard: phi.NewGuard(pool), log: log, eventsTopic: kafka.DefaultTopics().Events}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Query selects events of one project.
type Query struct {
	ProjectID string
	Type      string    // exact type, optional
	Since     time.Time // zero for any time
	Limit     int       // 1..1000
	Cursor    string    // from an earlier page
}

// Page is a page of events as the caller may see them.
type Page struct {
	Events     []phi.Event
	Total      int64
	NextCursor string // "" on the last page
}

// Events returns a page of a project's events, newest first, with the total number of matches.
// Events carrying patient data the caller may not see are redacted (phi.Guard). A project the
// caller cannot see is NotFound; a cursor the log did not produce is Invalid.
func (s *Service) Events(ctx context.Context, q Query) (Page, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return Page{}, err
	}
	if _, err := s.projectOrg(ctx, p, q.ProjectID); err != nil {
		return Page{}, err
	}
	page, err := s.log.QueryEvents(ctx, storage.EventQuery{OrgID: p.OrgFilter(), ProjectID: q.ProjectID, Type: q.Type,
		Since: q.Since, Limit: q.Limit, Cursor: q.Cursor})
	if errors.Is(err, storage.ErrBadCursor) {
		return Page{}, fault.Invalid("invalid cursor: pass the meta.cursor of an earlier response unchanged")
	}
	if err != nil {
		return Page{}, fmt.Errorf("events of %s: %w", q.ProjectID, err)
	}
	evs, err := s.guard.Events(ctx, page.Events)
	if err != nil {
		return Page{}, fmt.Errorf("events of %s: %w", q.ProjectID, err)
	}
	return Page{Events: evs, Total: page.Total, NextCursor: page.NextCursor}, nil
}

// Serve returns one streamed event as the caller in ctx may see it (an eventStream push). When
// the caller's access to its patients cannot be decided (Postgres unreachable), the event is
// served redacted rather than withheld or leaked.
func (s *Service) Serve(ctx context.Context, ev storage.Event) phi.Event {
	evs, err := s.guard.Events(ctx, []storage.Event{ev})
	if err != nil {
		return phi.RedactEvent(ev)
	}
	return evs[0]
}

// Publish creates an event of type typ with payload (a JSON object of at most 256 KiB) in one of
// the caller's projects, source integration, and writes it to the outbox. It returns the event as
// the caller may see it: a payload that names a patient is patient data like any other
// (phi.FreeForm). Requires exec:workflows.
func (s *Service) Publish(ctx context.Context, typ string, payload json.RawMessage, projectID string) (*phi.Event, error) {
	p, err := access.Require(ctx, access.ExecWorkflows)
	if err != nil {
		return nil, err
	}
	bad := map[string]string{}
	if !events.ValidType(typ) {
		bad["type"] = "must be two or more dot-separated segments of a-z, 0-9 and _, such as device.observation_received"
	}
	switch t := strings.TrimSpace(string(payload)); {
	case len(payload) > MaxPayloadBytes:
		bad["payload"] = fmt.Sprintf("is %d bytes; at most %d (256 KiB) are allowed", len(payload), MaxPayloadBytes)
	case !strings.HasPrefix(t, "{") || !json.Valid(payload):
		bad["payload"] = "must be a JSON object"
	}
	if len(bad) > 0 {
		return nil, fault.Validation("invalid event", bad)
	}
	orgID, err := s.projectOrg(ctx, p, projectID)
	if err != nil {
		return nil, err
	}
	ev, err := events.New(typ, orgID, projectID, events.SourceIntegration, events.SeverityInfo, payload)
	if err != nil {
		return nil, fault.Invalid("invalid event: %v", err)
	}
	err = idempotency.Tx(ctx, s.pool, &ev, func(tx pgx.Tx) error {
		return events.Append(ctx, tx, s.eventsTopic, ev)
	})
	if err != nil {
		return nil, fmt.Errorf("publish event: %w", err)
	}
	served := s.Serve(ctx, ev)
	return &served, nil
}

// projectOrg returns the organization of a project the caller sees, or NotFound.
func (s *Service) projectOrg(ctx context.Context, p *access.Principal, projectID string) (string, error) {
	var orgID string
	err := s.pool.QueryRow(ctx, `select org_id from projects where id = $1 and ($2 = '' or org_id = $2)`, projectID, p.OrgFilter()).Scan(&orgID)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fault.NotFound("project", projectID)
	}
	if err != nil {
		return "", fmt.Errorf("project %s: %w", projectID, err)
	}
	return orgID, nil
}
