// Package retention keeps each organization's event log and audit log only as long as its policy
// says: the platform operator sets the policy (days of each log, or forever), and the Job purges
// older rows through the stores' PurgeEvents and PurgeAudit, whichever store (Postgres or
// ClickHouse) holds them. Audit records are never purged younger than six years (HIPAA, 45 CFR
// 164.316(b)(2)): a shorter policy is refused by the service and by the table itself.
package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
	"carehub/kernel/config"
	"carehub/kernel/fault"
	"carehub/kernel/tick"
	"carehub/storage"
)

// AuditFloorDays is the shortest audit retention a policy may ask: six years of 365.25 days,
// rounded up, so no cut-off falls inside the six years whatever the leap days.
const AuditFloorDays = 2192

// MaxDays is the longest retention a policy may ask of either log: 100 years. Longer is what null
// (forever) says; a larger number only risks arithmetic: 107,000,003 days before now is beyond
// the stores' time range, and the cut-off wrapped around into the future (every row older).
const MaxDays = 36_500

// Policy is one organization's retention. A nil field keeps that log forever.
type Policy struct {
	OrgID     string
	EventDays *int
	AuditDays *int
	UpdatedAt time.Time
	// What the job last did for the organization (zero before its first purge).
	PurgedAt                  time.Time
	EventsPurged, AuditPurged int64
}

// Service reads and sets policies. It is safe for concurrent use.
type Service struct {
	pool *pgxpool.Pool
}

// New returns the service on pool.
func New(pool *pgxpool.Pool) *Service { return &Service{pool: pool} }

// Policy returns the retention of the organization ref names (id or slug). Requires admin:org
// (an organization's administrators may read their policy); another tenant's is NotFound.
func (s *Service) Policy(ctx context.Context, ref string) (*Policy, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	orgID, err := s.orgID(ctx, p, ref)
	if err != nil {
		return nil, err
	}
	return s.policy(ctx, orgID)
}

// SetPolicy replaces the retention of the organization ref names. Only the platform operator
// sets it (retention is part of the operator's agreement with the tenant, not a tenant setting).
// Days below 1 or above MaxDays, or audit days below AuditFloorDays, are a Validation fault
// naming the field.
func (s *Service) SetPolicy(ctx context.Context, ref string, eventDays, auditDays *int) (*Policy, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	orgID, err := s.orgID(ctx, p, ref)
	if err != nil {
		return nil, err
	}
	if !p.Platform {
		return nil, fault.New(fault.KindForbidden, "only the platform operator sets an organization's retention")
	}
	bad := map[string]string{}
	switch {
	case eventDays != nil && *eventDays < 1:
		bad["eventRetentionDays"] = "must be at least 1 (or null: kept forever)"
	case eventDays != nil && *eventDays > MaxDays:
		bad["eventRetentionDays"] = tooLong
	}
	switch {
	case auditDays != nil && *auditDays < AuditFloorDays:
		bad["auditRetentionDays"] = fmt.Sprintf("must be at least %d days: HIPAA requires six years of audit records (45 CFR 164.316(b)(2)); null keeps them forever", AuditFloorDays)
	case auditDays != nil && *auditDays > MaxDays:
		bad["auditRetentionDays"] = tooLong
	}
	if len(bad) > 0 {
		return nil, fault.Validation("invalid retention", bad)
	}
	_, err = s.pool.Exec(ctx, `insert into org_retention (org_id, event_days, audit_days) values ($1, $2, $3)
		on conflict (org_id) do update set event_days = excluded.event_days, audit_days = excluded.audit_days, updated_at = now()`,
		orgID, eventDays, auditDays)
	if err != nil {
		return nil, fmt.Errorf("set retention of %s: %w", orgID, err)
	}
	return s.policy(ctx, orgID)
}

var tooLong = fmt.Sprintf("must be at most %d days (100 years); null keeps the log forever", MaxDays)

func (s *Service) orgID(ctx context.Context, p *access.Principal, ref string) (string, error) {
	var id string
	err := s.pool.QueryRow(ctx, `select id from organizations where id = $1 or slug = $1`, ref).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !p.SeesOrg(id)) {
		return "", fault.NotFound("organization", ref)
	}
	if err != nil {
		return "", fmt.Errorf("organization %s: %w", ref, err)
	}
	return id, nil
}

func (s *Service) policy(ctx context.Context, orgID string) (*Policy, error) {
	out := &Policy{OrgID: orgID}
	var purgedAt, updatedAt *time.Time
	err := s.pool.QueryRow(ctx, `select event_days, audit_days, updated_at, purged_at, events_purged, audit_purged
		from org_retention where org_id = $1`, orgID).
		Scan(&out.EventDays, &out.AuditDays, &updatedAt, &purgedAt, &out.EventsPurged, &out.AuditPurged)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, nil // no policy: both logs kept forever
	}
	if err != nil {
		return nil, fmt.Errorf("retention of %s: %w", orgID, err)
	}
	if updatedAt != nil {
		out.UpdatedAt = *updatedAt
	}
	if purgedAt != nil {
		out.PurgedAt = *purgedAt
	}
	return out, nil
}

// DefaultInterval is how often the Job purges.
const DefaultInterval = time.Hour

// Job purges every organization's logs older than its policy. Run it on one node of the
// processors role; two running at once only repeat deletions, which are idempotent.
type Job struct {
	pool     *pgxpool.Pool
	events   storage.EventLog
	audit    storage.AuditLog
	logger   *slog.Logger
	interval time.Duration
	now      func() time.Time
}

// JobConfig configures a Job. Pool, Events and Audit are required.
type JobConfig struct {
	Pool     *pgxpool.Pool
	Events   storage.EventLog
	Audit    storage.AuditLog
	Logger   *slog.Logger  // nil: discarded
	Interval time.Duration // 0: DefaultInterval
}

func (c *JobConfig) defaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	config.Default(&c.Interval, DefaultInterval)
}

// NewJob returns the job of cfg; it fails when a required field is missing.
func NewJob(cfg JobConfig) (*Job, error) {
	if cfg.Pool == nil || cfg.Events == nil || cfg.Audit == nil {
		return nil, errors.New("retention job: Pool, Events and Audit are required")
	}
	cfg.defaults()
	return &Job{pool: cfg.Pool, events: cfg.Events, audit: cfg.Audit, logger: cfg.Logger, interval: cfg.Interval, now: time.Now}, nil
}

// Run purges at once, then every interval, until ctx ends. A failed pass is logged and retried
// at the next tick; Run returns nil when ctx ends.
func (j *Job) Run(ctx context.Context) error {
	tick.NowAndEvery(ctx, j.interval, func(ctx context.Context) {
		if err := j.PurgeOnce(ctx); err != nil && ctx.Err() == nil {
			j.logger.Error("retention pass failed", "err", err)
		}
	})
	return nil
}

// PurgeOnce runs one pass: for each organization with a policy, it deletes the events older
// than its event days and the audit records older than its audit days (never younger than six
// years), and records what it removed. It goes on past an organization that fails and returns
// the failures joined.
func (j *Job) PurgeOnce(ctx context.Context) error {
	rows, _ := j.pool.Query(ctx, `select org_id, event_days, audit_days from org_retention
		where event_days is not null or audit_days is not null order by org_id`)
	type policy struct {
		orgID                string
		eventDays, auditDays *int
	}
	policies, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (policy, error) {
		var p policy
		return p, r.Scan(&p.orgID, &p.eventDays, &p.auditDays)
	})
	if err != nil {
		return fmt.Errorf("retention policies: %w", err)
	}
	now := j.now().UTC()
	var errs []error
	for _, p := range policies {
		var events, audit int64
		var err error
		if p.eventDays != nil {
			events, err = j.events.PurgeEvents(ctx, p.orgID, cutoff(now, *p.eventDays, 1))
		}
		if err == nil && p.auditDays != nil {
			// audit_days ≥ AuditFloorDays is also a check of the table: no writer goes below it.
			audit, err = j.audit.PurgeAudit(ctx, p.orgID, cutoff(now, *p.auditDays, AuditFloorDays))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("purge %s: %w", p.orgID, err))
			continue
		}
		if events+audit > 0 {
			j.logger.Info("retention purged", "org_id", p.orgID, "events", events, "audit_records", audit)
		}
		if _, err := j.pool.Exec(ctx, `update org_retention set purged_at = $2, events_purged = $3, audit_purged = $4
			where org_id = $1`, p.orgID, now, events, audit); err != nil {
			errs = append(errs, fmt.Errorf("record purge of %s: %w", p.orgID, err))
		}
	}
	return errors.Join(errs...)
}

// cutoff is the instant before which a policy of days purges: days before now, with days held
// to [floor, MaxDays] whatever the table holds (a row written before the ceiling existed), so
// the cut-off is never after now minus floor nor outside the range the stores represent.
func cutoff(now time.Time, days, floor int) time.Time {
	return now.AddDate(0, 0, -min(max(days, floor), MaxDays))
}
