package retention

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"carehub/kernel/access"
	"carehub/kernel/events"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/storage"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func ptr(n int) *int { return &n }

// names reports whether err is a validation fault naming field.
func names(err error, field string) bool {
	f := fault.As(err)
	if f == nil || f.Kind != fault.KindValidation {
		return false
	}
	fields, _ := f.Details["fields"].(map[string]any)
	return fields[field] != nil
}

// TestPurge: one pass removes only the rows of an organization with a policy, only older than
// it; another organization's rows of the same age stay, and so do audit records inside six
// years.
func TestPurge(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.New(t)
	for _, o := range []string{"org_a", "org_b"} {
		if _, err := pool.Exec(ctx, `insert into organizations (id, name, slug, type, plan) values ($1, $1, $1, 'clinic', 'starter')`, o); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `insert into projects (id, org_id, name) values ('prj_a', 'org_a', 'a'), ('prj_b', 'org_b', 'b')`); err != nil {
		t.Fatal(err)
	}
	log, audit := postgres.NewEventLog(pool), postgres.NewAuditLog(pool)
	now := time.Now().UTC()
	event := func(org, project string, age time.Duration) events.Event {
		return events.Event{ID: ids.New(ids.Event), Type: "agent.run_completed", OrgID: org, ProjectID: project, Source: "agent",
			Severity: "info", Payload: json.RawMessage(`{}`), CreatedAt: now.Add(-age)}
	}
	record := func(org string, years int) storage.AuditRecord {
		return storage.AuditRecord{ID: ids.New(ids.Request), Time: now.AddDate(-years, 0, 0), OrgID: org, KeyID: "key_x",
			Mode: "live", Operation: "GET /v1/events", Outcome: "success", Status: 200}
	}
	const day = 24 * time.Hour
	evs := []events.Event{event("org_a", "prj_a", 40*day), event("org_a", "prj_a", 20*day), event("org_b", "prj_b", 40*day)}
	recs := []storage.AuditRecord{record("org_a", 7), record("org_a", 5), record("org_b", 7)}
	if err := log.AppendEvents(ctx, evs); err != nil {
		t.Fatal(err)
	}
	if err := audit.AppendAudit(ctx, recs); err != nil {
		t.Fatal(err)
	}

	platform := access.With(ctx, &access.Principal{Platform: true, Mode: access.Live})
	svc := New(pool)
	if _, err := svc.SetPolicy(platform, "org_a", ptr(30), ptr(AuditFloorDays)); err != nil {
		t.Fatal(err)
	}
	job, err := NewJob(JobConfig{Pool: pool, Events: log, Audit: audit})
	if err != nil {
		t.Fatal(err)
	}
	if err := job.PurgeOnce(ctx); err != nil {
		t.Fatal(err)
	}

	var left []string
	for _, q := range []storage.EventQuery{{ProjectID: "prj_a", Limit: 10}, {ProjectID: "prj_b", Limit: 10}} {
		page, err := log.QueryEvents(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Events {
			left = append(left, e.ID)
		}
	}
	if want := []string{evs[1].ID, evs[2].ID}; !slices.Equal(left, want) {
		t.Fatalf("events left %v, want org_a's 20-day-old and org_b's 40-day-old %v", left, want)
	}
	left = nil
	page, err := audit.QueryAudit(ctx, storage.AuditQuery{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range page.Records {
		left = append(left, r.ID)
	}
	slices.Sort(left)
	want := []string{recs[1].ID, recs[2].ID}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Fatalf("audit records left %v, want org_a's five-year-old and org_b's seven-year-old %v", left, want)
	}

	p, err := svc.Policy(platform, "org_a")
	if err != nil || p.EventsPurged != 1 || p.AuditPurged != 1 || p.PurgedAt.IsZero() {
		t.Fatalf("policy after the pass: %+v, %v", p, err)
	}
}

// TestPolicyRefusals: the six-year floor, who may set a policy, and the table's own check.
func TestPolicyRefusals(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.New(t)
	if _, err := pool.Exec(ctx, `insert into organizations (id, name, slug, type, plan) values ('org_a', 'A', 'a-clinic', 'clinic', 'starter'), ('org_b', 'B', 'b', 'clinic', 'starter')`); err != nil {
		t.Fatal(err)
	}
	svc := New(pool)
	platform := access.With(ctx, &access.Principal{Platform: true, Mode: access.Live})
	admin := access.With(ctx, &access.Principal{OrgID: "org_a", Mode: access.Live, Scopes: access.Scopes})

	_, err := svc.SetPolicy(platform, "a-clinic", nil, ptr(AuditFloorDays-1))
	if !names(err, "auditRetentionDays") {
		t.Fatalf("audit retention under six years: %v, want a validation fault naming auditRetentionDays", err)
	}
	_, err = svc.SetPolicy(platform, "a-clinic", ptr(0), nil)
	if !names(err, "eventRetentionDays") {
		t.Fatalf("zero event days: %v", err)
	}
	if _, err := svc.SetPolicy(admin, "org_a", ptr(30), nil); fault.KindOf(err) != fault.KindForbidden {
		t.Fatalf("an organization's admin sets its own retention: %v, want FORBIDDEN", err)
	}
	if _, err := svc.SetPolicy(admin, "org_b", ptr(30), nil); fault.KindOf(err) != fault.KindNotFound {
		t.Fatalf("another tenant's organization: %v, want NOT_FOUND", err)
	}
	p, err := svc.Policy(admin, "org_a")
	if err != nil || p.EventDays != nil || p.AuditDays != nil {
		t.Fatalf("no policy yet keeps both forever: %+v, %v", p, err)
	}
	_, err = pool.Exec(ctx, `insert into org_retention (org_id, audit_days) values ('org_a', 365)`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" { // check_violation
		t.Fatalf("the table takes an audit retention under six years: %v", err)
	}
}

// TestCutoffStaysInRange: whatever the table holds (a row written before the ceiling), the
// cut-off is between MaxDays and the floor before now, never past it nor in the future.
func TestCutoffStaysInRange(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, days := range []int{-1, 0, 1, 2191, 2192, MaxDays, MaxDays + 1, 107_000_003, 1 << 31, 1<<63 - 1} {
		for _, floor := range []int{1, AuditFloorDays} {
			c := cutoff(now, days, floor)
			if c.Before(now.AddDate(0, 0, -MaxDays)) || c.After(now.AddDate(0, 0, -floor)) {
				t.Errorf("cutoff(%d days, floor %d) = %s", days, floor, c)
			}
		}
	}
}
