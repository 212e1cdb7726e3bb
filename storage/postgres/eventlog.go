package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"carehub/kernel/events"
	"carehub/storage"
	"carehub/storage/postgres/pgcopy"
)

// Page sizes of QueryEvents and QueryAudit: storage's, which both stores share.
const (
	DefaultPageSize = storage.DefaultPageSize // a query without Limit
	MaxPageSize     = storage.MaxPageSize     // larger limits are clamped to this
)

// copyThreshold is the batch size from which AppendEvents and AppendAudit stage rows with COPY
// instead of a single INSERT … SELECT FROM unnest(…). COPY costs two more round trips and a temp
// table; below this size the one-statement insert is faster (BenchmarkAppendEvents).
const copyThreshold = 1000

// EventLog is the Postgres event log (table event_log, schemas/postgres/0002_eventlog.sql). It
// implements storage.EventLog and is safe for concurrent use.
type EventLog struct {
	// DeferFrom is the smallest batch AppendEventsDeferred defers; smaller ones it appends as
	// AppendEvents does. NewEventLog sets it to DefaultDeferFrom. Set it before use.
	DeferFrom int

	pool *pgxpool.Pool
	// AppendEventsDeferred's state, from the query after its last deferred append: it may
	// commit without waiting (no synchronous standbys), and the server's epoch.
	deferOK atomic.Bool
	epoch   atomic.Int64
}

// DefaultDeferFrom is EventLog.DeferFrom's default, the batch size from which appends are
// copied. On a durable local cluster (BenchmarkAppendEventsDurable, 2026-11-28) a deferred
// commit saved 9 % of a batch of 5,000 events (172 against 189 ms: the flush of its 5 MB of
// WAL), broke even at 1,000, and at 10 cost 0.6 ms more than it saved (2.1 against 1.5 ms: the
// transaction and the WAL position are round trips of their own, more than a small flush).
const DefaultDeferFrom = copyThreshold

// NewEventLog returns the event log stored in pool's database (migrated).
func NewEventLog(pool *pgxpool.Pool) *EventLog {
	return &EventLog{pool: pool, DeferFrom: DefaultDeferFrom}
}

var _ storage.EventLog = (*EventLog)(nil)

var eventColumns = []string{"id", "org_id", "project_id", "type", "source", "severity", "payload", "created_at"}

// AppendEvents stores events idempotently by id in one transaction: all or none are stored.
// An event already stored (or repeated within events) is left as first stored. Rows are
// inserted in id order, so concurrent appends of overlapping batches (two writers around a
// rebalance) wait on each other instead of deadlocking.
//
// Batches of copyThreshold events or more are copied (COPY) straight into event_log, which
// fails as a whole when one id is stored already; then, and only then, they are copied into a
// temporary staging table and moved with INSERT … SELECT … ON CONFLICT (id) DO NOTHING. Smaller
// batches go in one INSERT … SELECT FROM unnest(…) ON CONFLICT (id) DO NOTHING statement.
func (l *EventLog) AppendEvents(ctx context.Context, events []events.Event) error {
	return l.append(ctx, events, false)
}

var _ storage.DeferredEventLog = (*EventLog)(nil)

// AppendEventsDeferred appends as AppendEvents does, in transactions that commit without
// waiting for their WAL to reach disk (synchronous_commit off for them alone), and returns the
// WAL insert position after the commit, which Durable passes once the WAL writer has flushed it
// (within three times wal_writer_delay, sooner under load). A COPY of a batch of
// events writes megabytes of WAL.
//
// The mark's epoch is the server's start time as last seen before the append began: if the
// server has restarted since (a crash loses commits not yet flushed, and the WAL then goes on
// from before them), Durable's epoch differs and the append counts as possibly lost.
//
// Batches smaller than DeferFrom, and every batch on a primary with synchronous standbys
// (synchronous_standby_names set: a local flush does not make a commit durable there), are
// appended as AppendEvents does, and their mark is the zero mark. The setting is read after
// each deferred append and applies to the next; a log's first one waits.
func (l *EventLog) AppendEventsDeferred(ctx context.Context, events []events.Event) (storage.DurableMark, error) {
	if len(events) < max(l.DeferFrom, 1) {
		return storage.DurableMark{}, l.append(ctx, events, false)
	}
	epoch, deferred := l.epoch.Load(), l.deferOK.Load()
	if err := l.append(ctx, events, deferred); err != nil {
		return storage.DurableMark{}, err
	}
	var (
		lsn, now  int64
		replicate bool
	)
	err := l.pool.QueryRow(ctx, `
select (pg_current_wal_insert_lsn() - '0/0')::int8, current_setting('synchronous_standby_names') <> '', `+startedSQL).
		Scan(&lsn, &replicate, &now)
	if err != nil {
		if deferred {
			return storage.DurableMark{}, fmt.Errorf("append events: read the WAL position: %w", err)
		}
		return storage.DurableMark{}, nil // committed and flushed
	}
	l.epoch.Store(now)
	l.deferOK.Store(!replicate)
	if !deferred {
		return storage.DurableMark{}, nil
	}
	return storage.DurableMark{Epoch: epoch, Pos: uint64(lsn)}, nil
}

// startedSQL is the server's start time in microseconds: the epoch of a DurableMark.
const startedSQL = `(extract(epoch from pg_postmaster_start_time()) * 1000000)::int8`

// Durable returns the server's epoch and the position up to which its WAL is flushed to disk.
func (l *EventLog) Durable(ctx context.Context) (storage.DurableMark, error) {
	var lsn, epoch int64
	if err := l.pool.QueryRow(ctx, `select (pg_current_wal_flush_lsn() - '0/0')::int8, `+startedSQL).Scan(&lsn, &epoch); err != nil {
		return storage.DurableMark{}, fmt.Errorf("event log: read the flushed WAL position: %w", err)
	}
	return storage.DurableMark{Epoch: epoch, Pos: uint64(lsn)}, nil
}

// AsyncCommit begins a transaction whose commit does not wait for its WAL to be flushed, in
// one round trip: for writes that a crash may lose without losing what they record (the event
// log's deferred batches, whose durability is tracked; webhook claims and outcomes, which a
// lost commit turns into a retry with the same webhook-id).
var AsyncCommit = pgx.TxOptions{BeginQuery: "begin; set local synchronous_commit = off"}

// writer is what an append writes through: a connection of the pool (each statement its own
// transaction) or a transaction.
type writer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Conn() *pgx.Conn
}

// append stores events; deferred commits without waiting for the WAL flush.
func (l *EventLog) append(ctx context.Context, events []events.Event, deferred bool) error {
	if len(events) == 0 {
		return nil
	}
	// A statement is its own transaction unless deferred: turning synchronous_commit off
	// needs one around it.
	opts := pgx.TxOptions{}
	if deferred {
		opts = AsyncCommit
	}
	statement := func(f func(writer) error) error {
		if !deferred {
			return l.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error { return f(c) })
		}
		return pgx.BeginTxFunc(ctx, l.pool, opts, func(tx pgx.Tx) error { return f(tx) })
	}
	var err error
	if len(events) < copyThreshold {
		err = statement(func(w writer) error { return appendUnnest(ctx, w, events) })
	} else if err = statement(func(w writer) error { return copyNew(ctx, w, events) }); UniqueViolation(err) {
		// stored before (a redelivery) or repeated in events
		err = pgx.BeginTxFunc(ctx, l.pool, opts, func(tx pgx.Tx) error { return appendCopy(ctx, tx, events) })
	}
	if err != nil {
		return fmt.Errorf("append events: %w", Refused(err))
	}
	return nil
}

// Refused returns err as a storage.RefusedError when it is Postgres refusing the rows
// themselves: a data exception (class 22: a number numeric cannot hold, an unpaired surrogate
// escape, invalid UTF-8, a NUL in text), an integrity constraint (class 23) or a program limit
// (class 54: JSON nested past the stack). Other errors (the connection, a timeout) are returned
// as they are. The stores here wrap their appends with it, and so do the consumers that write
// rows a record dictates (the webhook dispatcher, the workflow triggers), so that
// consume.DeadLetter sets such a record aside rather than retrying it forever.
func Refused(err error) error {
	pg, ok := errors.AsType[*pgconn.PgError](err)
	if ok && len(pg.Code) == 5 && (pg.Code[:2] == "22" || pg.Code[:2] == "23" || pg.Code[:2] == "54") {
		return &storage.RefusedError{Code: "SQLSTATE " + pg.Code, Err: err}
	}
	return err
}

// Transient reports an error that the same statement may not meet again: a deadlock (40P01) or
// a serialization failure (40001), which Postgres resolves by failing one of the parties.
func Transient(err error) bool {
	pg, ok := errors.AsType[*pgconn.PgError](err)
	return ok && (pg.Code == "40P01" || pg.Code == "40001")
}

// noPayload is what the log stores for an event without a payload: JSON null.
const noPayload = "null"

func payloadOf(ev events.Event) string {
	if len(ev.Payload) == 0 {
		return noPayload
	}
	return string(ev.Payload)
}

func appendUnnest(ctx context.Context, w writer, events []events.Event) error {
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
	_, err := w.Exec(ctx, `
insert into event_log (id, org_id, project_id, type, source, severity, payload, created_at)
select id, org_id, project_id, type, source, severity, payload::jsonb, created_at
from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::timestamptz[])
	as t(id, org_id, project_id, type, source, severity, payload, created_at)
order by id
on conflict (id) do nothing`,
		id, org, project, typ, source, severity, payload, created)
	return err
}

// copyNew copies events, in id order, straight into event_log: one statement, so all or none
// are stored; an id stored already (or repeated in events) fails it with unique_violation.
// Writing new events once instead of twice (staging table, then insert) is what the event log
// writer does under load, where every batch is new.
func copyNew(ctx context.Context, w writer, events []events.Event) error {
	order := make([]int, len(events))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(events[a].ID, events[b].ID) })
	_, err := copyRows(events, order).Copy(ctx, w.Conn().PgConn(), "event_log", eventColumns)
	return err
}

// copyRows is the body of a COPY of events into eventColumns, in order (nil: as they stand).
func copyRows(events []events.Event, order []int) *pgcopy.Rows {
	size := 0
	for i := range events {
		ev := &events[i]
		size += len(ev.ID) + len(ev.OrgID) + len(ev.ProjectID) + len(ev.Type) + len(ev.Source) + len(ev.Severity) + len(ev.Payload) + len(noPayload)
	}
	rows := pgcopy.New(len(eventColumns), size+len(events)*(2+8*4+1+8))
	for i := range events {
		if order != nil {
			i = order[i]
		}
		ev := &events[i]
		rows.Row()
		rows.Texts(ev.ID, ev.OrgID, ev.ProjectID, ev.Type, ev.Source, ev.Severity)
		if len(ev.Payload) == 0 {
			rows.JSONB([]byte(noPayload))
		} else {
			rows.JSONB(ev.Payload)
		}
		rows.Timestamptz(ev.CreatedAt)
	}
	return rows
}

// UniqueViolation reports Postgres refusing a row whose key is stored already (23505).
func UniqueViolation(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "23505"
}

// appendCopy copies events into a staging table and moves the new ones into event_log, in tx.
func appendCopy(ctx context.Context, tx pgx.Tx, events []events.Event) error {
	// The staging table has no index or constraint, so COPY only appends; ON COMMIT DROP
	// removes it whether the transaction commits or not.
	if _, err := tx.Exec(ctx, `
create temp table event_log_stage (
	id text, org_id text, project_id text, type text, source text, severity text,
	payload jsonb, created_at timestamptz
) on commit drop`); err != nil {
		return err
	}
	if _, err := copyRows(events, nil).Copy(ctx, tx.Conn().PgConn(), "event_log_stage", eventColumns); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `
insert into event_log (id, org_id, project_id, type, source, severity, payload, created_at)
select id, org_id, project_id, type, source, severity, payload, created_at from event_log_stage
order by id
on conflict (id) do nothing`)
	return err
}

// QueryEvents returns the events of q.ProjectID (and q.OrgID unless empty), newest first, ties
// broken by id descending (oldest first, ascending, with q.Ascending). Since is inclusive and To
// exclusive; Type selects one type exactly, Types any of several types or prefixes; the
// resource filters match the ids the payload names. Limit is clamped to 1..MaxPageSize (0 means
// DefaultPageSize). Total counts every match of the filters, ignoring Cursor and Limit, as
// q.Total asks. A cursor this log did not produce fails with storage.ErrBadCursor.
//
// The page and the count go to the server in one round trip. Both walk the same index
// (event_log_project, event_log_project_type or a resource index of 0020_analysts.sql), the
// count as an index-only scan where it can.
func (l *EventLog) QueryEvents(ctx context.Context, q storage.EventQuery) (storage.EventPage, error) {
	page, err := l.queryEvents(ctx, q)
	return page, unavailable(err)
}

func (l *EventLog) queryEvents(ctx context.Context, q storage.EventQuery) (storage.EventPage, error) {
	if q.ProjectID == "" {
		return storage.EventPage{}, errors.New("query events: project id required")
	}
	limit := storage.PageSize(q.Limit)
	where := eventFilter(q.OrgID, q.ProjectID, q.Type, q.Types, q.Since, q.To)
	resourceFilters(&where, q)
	countSQL := "select count(*) from event_log where " + where.sql()
	countArgs := append([]any(nil), where.args...)
	pageSQL, pageArgs, err := eventsInOrder(q, where)
	if err != nil {
		return storage.EventPage{}, err
	}
	pageArgs = append(pageArgs, limit+1)
	pageSQL += fmt.Sprintf(" limit $%d", len(pageArgs))

	var page storage.EventPage
	batch := &pgx.Batch{}
	batch.Queue(pageSQL, pageArgs...).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			ev, err := scanEvent(rows)
			if err != nil {
				return err
			}
			page.Events = append(page.Events, ev)
		}
		return rows.Err()
	})
	queueTotal(batch, q.Total, countSQL, countArgs, &page.Total)
	if err := l.pool.SendBatch(ctx, batch).Close(); err != nil {
		return storage.EventPage{}, fmt.Errorf("query events: %w", err)
	}
	page.Events, page.NextCursor = storage.TrimPage(page.Events, limit, events.Event.CursorKey)
	return page, nil
}

// eventsInOrder is the select of the events matching where past q's cursor, in q's order,
// without limit.
func eventsInOrder(q storage.EventQuery, where conditions) (string, []any, error) {
	order, before := "desc", "<"
	if q.Ascending {
		order, before = "asc", ">"
	}
	if q.Cursor != "" {
		at, id, err := storage.DecodeCursor(q.Cursor)
		if err != nil {
			return "", nil, err
		}
		where.add2("(created_at, id) "+before+" ($%d, $%d)", at, id)
	}
	return fmt.Sprintf(`select id, org_id, project_id, type, source, severity, payload, created_at
from event_log where %s order by created_at %s, id %s`, where.sql(), order, order), where.args, nil
}

func scanEvent(rows pgx.CollectableRow) (events.Event, error) {
	var ev events.Event
	var payload []byte
	if err := rows.Scan(&ev.ID, &ev.OrgID, &ev.ProjectID, &ev.Type, &ev.Source, &ev.Severity, &payload, &ev.CreatedAt); err != nil {
		return ev, err
	}
	ev.Payload = payload
	ev.CreatedAt = ev.CreatedAt.UTC()
	return ev, nil
}

// ExportEvents streams the events matching q (its filters and cursor, as QueryEvents) through
// one server-side cursor over the query a page runs, without its limit: each FETCH continues
// the same index scan where the last stopped, so the export reads the range once, and memory
// holds one chunk whatever its size. Each FETCH is a statement of its own, so the pool's
// statement timeout bounds a chunk, not the export; a consumer that stalls between chunks for
// longer than IdleInTransactionTimeout loses the session (the export fails and resumes from the
// last cursor it received).
func (l *EventLog) ExportEvents(ctx context.Context, q storage.EventQuery, emit func([]events.Event) error) error {
	if q.ProjectID == "" {
		return errors.New("export events: project id required")
	}
	where := eventFilter(q.OrgID, q.ProjectID, q.Type, q.Types, q.Since, q.To)
	resourceFilters(&where, q)
	query, args, err := eventsInOrder(q, where)
	if err != nil {
		return err
	}
	err = pgx.BeginTxFunc(ctx, l.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		// An export reads its whole range, in order, and should start at once: the planner is
		// told to cost the cursor for its first rows only (cursor_tuple_fraction), so that it
		// reads an index in the export's order rather than sort the range before the first
		// row (a two-type export of 1.2 M events waited 1.3–1.8 s for its first byte).
		if _, err := tx.Exec(ctx, "set local cursor_tuple_fraction = 0.0001"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "declare export no scroll cursor for "+query, args...); err != nil {
			return err
		}
		// The next chunk is fetched while the last is emitted, so that the server and the
		// encoder work side by side rather than in turn; at most three chunks are held.
		chunks := make(chan []events.Event, 1)
		g, gctx := errgroup.WithContext(ctx)
		g.Go(func() error {
			defer close(chunks)
			return fetchChunks(gctx, tx, chunks)
		})
		g.Go(func() error {
			for chunk := range chunks {
				if err := emit(chunk); err != nil {
					return emitError{err}
				}
			}
			return nil
		})
		return g.Wait()
	})
	var e emitError
	if errors.As(err, &e) {
		return e.err
	}
	if err != nil {
		return fmt.Errorf("export events: %w", err)
	}
	return nil
}

// fetchChunks sends the rows of the cursor export, storage.ExportChunk at a time, to chunks
// until the cursor is exhausted or ctx ends.
func fetchChunks(ctx context.Context, tx pgx.Tx, chunks chan<- []events.Event) error {
	fetch := fmt.Sprintf("fetch %d from export", storage.ExportChunk)
	for {
		rows, err := tx.Query(ctx, fetch)
		if err != nil {
			return err
		}
		chunk, err := pgx.CollectRows(rows, scanEvent)
		if err != nil || len(chunk) == 0 {
			return err
		}
		select {
		case chunks <- chunk:
		case <-ctx.Done():
			return ctx.Err()
		}
		if len(chunk) < storage.ExportChunk {
			return nil
		}
	}
}

// emitError carries an error of ExportEvents' emit out of its transaction unwrapped.
type emitError struct{ err error }

func (e emitError) Error() string { return e.err.Error() }

// queueTotal queues the count of a page's matches as mode asks: countSQL exactly, the planner's
// estimate of it, or nothing.
func queueTotal(batch *pgx.Batch, mode storage.TotalMode, countSQL string, args []any, total *int64) {
	switch mode {
	case storage.TotalNone:
	case storage.TotalEstimate:
		batch.Queue("explain (format json) "+countSQL, args...).QueryRow(func(row pgx.Row) error {
			var plan []struct {
				Plan struct {
					Plans []struct {
						Rows float64 `json:"Plan Rows"`
					} `json:"Plans"`
				} `json:"Plan"`
			}
			if err := row.Scan(&plan); err != nil {
				return err
			}
			if len(plan) > 0 && len(plan[0].Plan.Plans) > 0 {
				*total = int64(plan[0].Plan.Plans[0].Rows)
			}
			return nil
		})
	default:
		batch.Queue(countSQL, args...).QueryRow(func(row pgx.Row) error { return row.Scan(total) })
	}
}

// eventFilter is the WHERE clause of the filters event queries and aggregations share.
func eventFilter(orgID, projectID, typ string, types []string, from, to time.Time) conditions {
	var where conditions
	if projectID != "" {
		where.add("project_id = $%d", projectID)
	}
	if orgID != "" {
		where.add("org_id = $%d", orgID)
	}
	if typ != "" {
		where.add("type = $%d", typ)
	}
	if len(types) > 0 {
		exact, prefixes := storage.SplitTypePatterns(types)
		switch {
		case prefixes == nil:
			where.add("type = any($%d)", exact)
		case slices.Contains(prefixes, ""):
			// "*": every type
		default:
			likes := make([]string, len(prefixes))
			for i, p := range prefixes {
				likes[i] = strings.ReplaceAll(p, "_", `\_`) + "%"
			}
			where.add2("(type = any($%d) or type like any($%d))", exact, likes)
		}
	}
	if !from.IsZero() {
		where.add("created_at >= $%d", from)
	}
	if !to.IsZero() {
		where.add("created_at < $%d", to)
	}
	return where
}

// resourceFilters adds q's resource filters to where: the payload expressions indexed by
// 0020_analysts.sql.
func resourceFilters(where *conditions, q storage.EventQuery) {
	for _, f := range []struct{ expr, id string }{
		{"(payload->>'patientId')", q.PatientID},
		{"(payload->>'agentId')", q.AgentID},
		{workflowIDExpr, q.WorkflowID},
		{"(payload->>'deploymentId')", q.DeploymentID},
	} {
		if f.id != "" {
			where.add(f.expr+" = $%d", f.id)
		}
	}
}

// workflowIDExpr is a workflow's id in an event payload: workflowId, or workflow_id in the
// spec's webhook shape (workflow.run.completed).
const workflowIDExpr = "coalesce(payload->>'workflowId', payload->>'workflow_id')"

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
// staging table (audit batches come from the audit writer in thousands). The staging table lives
// as long as the connection (ON COMMIT DELETE ROWS empties it), as the observation writer's does:
// made and dropped with every batch it cost catalog rows and a file each time, Postgres's largest
// cost on the publish path (pg_stat_statements: 1.4–4.4 ms a batch of about 60 records, against
// 0.03 ms for the CREATE … IF NOT EXISTS that finds it; docs/PERFORMANCE.md).
func (l *AuditLog) AppendAudit(ctx context.Context, records []storage.AuditRecord) error {
	if len(records) == 0 {
		return nil
	}
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
create temp table if not exists audit_log_stage (
	id text, time timestamptz, org_id text, key_id text, mode text, client_ip text,
	user_agent text, operation text, resource_ids text[], patient_ids text[], outcome text,
	status integer, latency_ms integer, truncated boolean, patient_ids_omitted integer,
	resource_ids_omitted integer, auth_failure text, credential text
) on commit delete rows`); err != nil {
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
		return fmt.Errorf("append audit: %w", Refused(err))
	}
	return nil
}

// QueryAudit returns the audit records matching q, newest first (time, then id, descending).
// From is inclusive and To exclusive; zero values leave that side open. PatientID selects
// records whose patient ids include it. Limit, Total and Cursor behave as in
// EventLog.QueryEvents.
func (l *AuditLog) QueryAudit(ctx context.Context, q storage.AuditQuery) (storage.AuditPage, error) {
	page, err := l.queryAudit(ctx, q)
	return page, unavailable(err)
}

func (l *AuditLog) queryAudit(ctx context.Context, q storage.AuditQuery) (storage.AuditPage, error) {
	limit := storage.PageSize(q.Limit)
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
	queueTotal(batch, q.Total, countSQL, countArgs, &page.Total)
	if err := l.pool.SendBatch(ctx, batch).Close(); err != nil {
		return storage.AuditPage{}, fmt.Errorf("query audit: %w", err)
	}
	page.Records, page.NextCursor = storage.TrimPage(page.Records, limit, storage.AuditRecord.CursorKey)
	return page, nil
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
