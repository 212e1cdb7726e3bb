package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/storage"
)

// Page sizes of QueryEvents and QueryAudit.
const (
	DefaultPageSize = 100  // a query without Limit
	MaxPageSize     = 1000 // larger limits are clamped to this
)

// copyThreshold is the batch size from which AppendEvents and AppendAudit stage rows with COPY
// instead of a single INSERT … SELECT FROM unnest(…). COPY costs two more round trips and a temp
// table; below this size the one-statement insert is faster (BenchmarkAppendEvents).
const copyThreshold = 1000

// EventLog is the Postgres event log (table event_log, schemas/postgres/0002_eventlog.sql). It
// implements storage.EventLog and is safe for concurrent use.
type EventLog struct {
	pool *pgxpool.Pool
}

// NewEventLog returns the event log stored in pool's database (migrated).
func NewEventLog(pool *pgxpool.Pool) *EventLog {
	return &EventLog{pool: pool}
}

var _ storage.EventLog = (*EventLog)(nil)

var eventColumns = []string{"id", "org_id", "project_id", "type", "source", "severity", "payload", "created_at"}

// AppendEvents stores events idempotently by id in one transaction: all or none are stored.
// An event already stored (or repeated within events) is left as first stored. Rows are
// inserted in id order, so concurrent appends of overlapping batches (two writers around a
// rebalance) wait on each other instead of deadlocking.
//
// Batches of copyThreshold events or more are copied (COPY) into a temporary staging table and
// moved with INSERT … SELECT … ON CONFLICT (id) DO NOTHING; smaller batches go in one
// INSERT … SELECT FROM unnest(…) ON CONFLICT (id) DO NOTHING statement.
func (l *EventLog) AppendEvents(ctx context.Context, events []storage.Event) error {
	if len(events) == 0 {
		return nil
	}
	var err error
	if len(events) >= copyThreshold {
		err = l.appendCopy(ctx, events)
	} else {
		err = l.appendUnnest(ctx, events)
	}
	if err != nil {
		return fmt.Errorf("append events: %w", err)
	}
	return nil
}

func payloadOf(ev storage.Event) string {
	if len(ev.Payload) == 0 {
		return "null"
	}
	return string(ev.Payload)
}

func (l *EventLog) appendUnnest(ctx context.Context, events []storage.Event) error {
	n := len(events)
	var (
		id, org, project, typ, source, severity, payload = make([]string, n), make([]string, n), make([]string, n),
			make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		created = make([]time.Time, n)
	)
	for i, ev := range events {
		id[i], org[i], project[i], typ[i] = ev.ID, ev.OrgID, ev.ProjectID, ev.Type
		source[i], severity[i], payload[i], created[i] = ev.Source, ev.Severity, payloadOf(ev), ev.CreatedAt
	}
	_, err := l.pool.Exec(ctx, `
insert into event_log (id, org_id, project_id, type, source, severity, payload, created_at)
select id, org_id, project_id, type, source, severity, payload::jsonb, created_at
from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::timestamptz[])
	as t(id, org_id, project_id, type, source, severity, payload, created_at)
order by id
on conflict (id) do nothing`,
		id, org, project, typ, source, severity, payload, created)
	return err
}

func (l *EventLog) appendCopy(ctx context.Context, events []storage.Event) error {
	return pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		// The staging table has no index or constraint, so COPY only appends; ON COMMIT DROP
		// removes it whether the transaction commits or not.
		if _, err := tx.Exec(ctx, `
create temp table event_log_stage (
	id text, org_id text, project_id text, type text, source text, severity text,
	payload jsonb, created_at timestamptz
) on commit drop`); err != nil {
			return err
		}
		rows := pgx.CopyFromSlice(len(events), func(i int) ([]any, error) {
			ev := events[i]
			return []any{ev.ID, ev.OrgID, ev.ProjectID, ev.Type, ev.Source, ev.Severity, payloadOf(ev), ev.CreatedAt}, nil
		})
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"event_log_stage"}, eventColumns, rows); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
insert into event_log (id, org_id, project_id, type, source, severity, payload, created_at)
select id, org_id, project_id, type, source, severity, payload, created_at from event_log_stage
order by id
on conflict (id) do nothing`)
		return err
	})
}

// QueryEvents returns the events of q.ProjectID (and q.OrgID unless empty), newest first, ties
// broken by id descending. Since selects events created at or after it; Type selects one type
// exactly. Limit is clamped to 1..MaxPageSize (0 means DefaultPageSize). Total counts every
// match of the filters, ignoring Cursor and Limit. A cursor this log did not produce fails with
// storage.ErrBadCursor.
//
// The page and the count go to the server in one round trip. Both walk the same index
// (event_log_project or event_log_project_type), the count as an index-only scan.
func (l *EventLog) QueryEvents(ctx context.Context, q storage.EventQuery) (storage.EventPage, error) {
	if q.ProjectID == "" {
		return storage.EventPage{}, errors.New("query events: project id required")
	}
	limit := pageSize(q.Limit)
	var where conditions
	where.add("project_id = $%d", q.ProjectID)
	if q.OrgID != "" {
		where.add("org_id = $%d", q.OrgID)
	}
	if q.Type != "" {
		where.add("type = $%d", q.Type)
	}
	if !q.Since.IsZero() {
		where.add("created_at >= $%d", q.Since)
	}
	countSQL := "select count(*) from event_log where " + where.sql()
	countArgs := append([]any(nil), where.args...)

	if q.Cursor != "" {
		at, id, err := storage.DecodeCursor(q.Cursor)
		if err != nil {
			return storage.EventPage{}, err
		}
		where.add2("(created_at, id) < ($%d, $%d)", at, id)
	}
	pageArgs := append(where.args, limit+1)
	pageSQL := fmt.Sprintf(`select id, org_id, project_id, type, source, severity, payload, created_at
from event_log where %s order by created_at desc, id desc limit $%d`, where.sql(), len(pageArgs))

	var page storage.EventPage
	batch := &pgx.Batch{}
	batch.Queue(pageSQL, pageArgs...).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var ev storage.Event
			var payload []byte
			if err := rows.Scan(&ev.ID, &ev.OrgID, &ev.ProjectID, &ev.Type, &ev.Source, &ev.Severity, &payload, &ev.CreatedAt); err != nil {
				return err
			}
			ev.Payload = payload
			ev.CreatedAt = ev.CreatedAt.UTC()
			page.Events = append(page.Events, ev)
		}
		return rows.Err()
	})
	batch.Queue(countSQL, countArgs...).QueryRow(func(row pgx.Row) error {
		return row.Scan(&page.Total)
	})
	if err := l.pool.SendBatch(ctx, batch).Close(); err != nil {
		return storage.EventPage{}, fmt.Errorf("query events: %w", err)
	}
	if len(page.Events) > limit {
		page.Events = page.Events[:limit]
		last := page.Events[limit-1]
		page.NextCursor = storage.EncodeCursor(last.CreatedAt, last.ID)
	}
	return page, nil
}

// AuditLog is the Postgres audit log (table audit_log, schemas/postgres/0002_eventlog.sql and
// 0009_audit_truncation_and_refusals.sql). It
// implements storage.AuditLog and is safe for concurrent use.
type AuditLog struct {
	pool *pgxpool.Pool
}

// NewAuditLog returns the audit log stored in pool's database (migrated).
func NewAuditLog(pool *pgxpool.Pool) *AuditLog {
	return &AuditLog{pool: pool}
}

var _ storage.AuditLog = (*AuditLog)(nil)

var auditColumns = []string{"id", "time", "org_id", "key_id", "mode", "client_ip", "user_agent", "operation",
	"resource_ids", "patient_ids", "outcome", "status", "latency_ms",
	"truncated", "patient_ids_omitted", "resource_ids_omitted", "auth_failure", "credential"}

func auditRow(r storage.AuditRecord) []any {
	return []any{r.ID, r.Time, r.OrgID, r.KeyID, r.Mode, r.ClientIP, r.UserAgent, r.Operation,
		nonNil(r.ResourceIDs), nonNil(r.PatientIDs), r.Outcome, int32(r.Status), int32(r.LatencyMs),
		r.Truncated, int32(r.PatientIDsOmitted), int32(r.ResourceIDsOmitted), r.AuthFailure, r.Credential}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// AppendAudit stores records idempotently by id in one transaction, copying them through a
// staging table (audit batches come from the audit writer in thousands).
func (l *AuditLog) AppendAudit(ctx context.Context, records []storage.AuditRecord) error {
	if len(records) == 0 {
		return nil
	}
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
create temp table audit_log_stage (
	id text, time timestamptz, org_id text, key_id text, mode text, client_ip text,
	user_agent text, operation text, resource_ids text[], patient_ids text[], outcome text,
	status integer, latency_ms integer, truncated boolean, patient_ids_omitted integer,
	resource_ids_omitted integer, auth_failure text, credential text
) on commit drop`); err != nil {
			return err
		}
		rows := pgx.CopyFromSlice(len(records), func(i int) ([]any, error) { return auditRow(records[i]), nil })
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"audit_log_stage"}, auditColumns, rows); err != nil {
			return err
		}
		cols := strings.Join(auditColumns, ", ")
		_, err := tx.Exec(ctx, "insert into audit_log ("+cols+") select "+cols+" from audit_log_stage order by id on conflict (id) do nothing")
		return err
	})
	if err != nil {
		return fmt.Errorf("append audit: %w", err)
	}
	return nil
}

// QueryAudit returns the audit records matching q, newest first (time, then id, descending).
// From is inclusive and To exclusive; zero values leave that side open. PatientID selects
// records whose patient ids include it. Limit, Total and Cursor behave as in
// EventLog.QueryEvents.
func (l *AuditLog) QueryAudit(ctx context.Context, q storage.AuditQuery) (storage.AuditPage, error) {
	limit := pageSize(q.Limit)
	var where conditions
	if q.OrgID != "" {
		where.add("org_id = $%d", q.OrgID)
	}
	if !q.From.IsZero() {
		where.add("time >= $%d", q.From)
	}
	if !q.To.IsZero() {
		where.add("time < $%d", q.To)
	}
	if q.KeyID != "" {
		where.add("key_id = $%d", q.KeyID)
	}
	if q.PatientID != "" {
		where.add("patient_ids @> array[$%d::text]", q.PatientID)
	}
	if q.Operation != "" {
		where.add("operation = $%d", q.Operation)
	}
	countSQL := "select count(*) from audit_log where " + where.sql()
	countArgs := append([]any(nil), where.args...)
	if q.Cursor != "" {
		at, id, err := storage.DecodeCursor(q.Cursor)
		if err != nil {
			return storage.AuditPage{}, err
		}
		where.add2("(time, id) < ($%d, $%d)", at, id)
	}
	pageArgs := append(where.args, limit+1)
	pageSQL := fmt.Sprintf("select %s from audit_log where %s order by time desc, id desc limit $%d",
		strings.Join(auditColumns, ", "), where.sql(), len(pageArgs))

	var page storage.AuditPage
	batch := &pgx.Batch{}
	batch.Queue(pageSQL, pageArgs...).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var r storage.AuditRecord
			var status, latency, patientsOmitted, resourcesOmitted int32
			if err := rows.Scan(&r.ID, &r.Time, &r.OrgID, &r.KeyID, &r.Mode, &r.ClientIP, &r.UserAgent, &r.Operation,
				&r.ResourceIDs, &r.PatientIDs, &r.Outcome, &status, &latency,
				&r.Truncated, &patientsOmitted, &resourcesOmitted, &r.AuthFailure, &r.Credential); err != nil {
				return err
			}
			r.Time = r.Time.UTC()
			r.Status, r.LatencyMs = int(status), int(latency)
			r.PatientIDsOmitted, r.ResourceIDsOmitted = int(patientsOmitted), int(resourcesOmitted)
			page.Records = append(page.Records, r)
		}
		return rows.Err()
	})
	batch.Queue(countSQL, countArgs...).QueryRow(func(row pgx.Row) error {
		return row.Scan(&page.Total)
	})
	if err := l.pool.SendBatch(ctx, batch).Close(); err != nil {
		return storage.AuditPage{}, fmt.Errorf("query audit: %w", err)
	}
	if len(page.Records) > limit {
		page.Records = page.Records[:limit]
		last := page.Records[limit-1]
		page.NextCursor = storage.EncodeCursor(last.Time, last.ID)
	}
	return page, nil
}

func pageSize(limit int) int {
	switch {
	case limit <= 0:
		return DefaultPageSize
	case limit > MaxPageSize:
		return MaxPageSize
	}
	return limit
}

// conditions builds a WHERE clause with numbered placeholders.
type conditions struct {
	parts []string
	args  []any
}

func (c *conditions) add(format string, arg any) {
	c.args = append(c.args, arg)
	c.parts = append(c.parts, fmt.Sprintf(format, len(c.args)))
}

func (c *conditions) add2(format string, a, b any) {
	c.args = append(c.args, a, b)
	c.parts = append(c.parts, fmt.Sprintf(format, len(c.args)-1, len(c.args)))
}

func (c *conditions) sql() string {
	if len(c.parts) == 0 {
		return "true"
	}
	return strings.Join(c.parts, " and ")
}
