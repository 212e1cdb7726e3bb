// Package clickhouse is the production implementation of the event log and the audit log
// (storage.EventLog, storage.AuditLog) on ClickHouse, over the native protocol with
// clickhouse-go/v2. The DDL is schemas/clickhouse/*.sql, applied by Open.
//
// Dedupe by id uses ReplacingMergeTree and FINAL reads (see the DDL for why); every append is
// one batched INSERT (one block per call, which is how the Kafka writers call it: thousands of
// rows at a time).
//
// Testing: no ClickHouse server runs on carehub's development machines or in CI, so this
// package is compiled there but its conformance tests (storage/storagetest, the same suites the
// Postgres implementation passes) run only when CAREHUB_CLICKHOUSE_URL points at a server, e.g.
// clickhouse://default:@localhost:9000/default. Until someone runs them so, treat this
// implementation as unverified against a live server.
package clickhouse

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"carehub/schemas"
	"carehub/storage"
)

// Page sizes of QueryEvents and QueryAudit (the same as storage/postgres).
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Store is the ClickHouse event log and audit log. It is safe for concurrent use.
type Store struct {
	conn driver.Conn
}

var (
	_ storage.EventLog = (*Store)(nil)
	_ storage.AuditLog = (*Store)(nil)
)

// Open connects to the ClickHouse server at url (clickhouse://user:password@host:9000/database?
// dial_timeout=5s&compress=lz4, as clickhouse-go's ParseDSN reads it), checks that it answers,
// and creates the tables of schemas/clickhouse if they do not exist. Close the store when done.
func Open(ctx context.Context, url string) (*Store, error) {
	opts, err := ch.ParseDSN(url)
	if err != nil {
		return nil, fmt.Errorf("open clickhouse: %w", err)
	}
	conn, err := ch.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("open clickhouse: %w", err)
	}
	if err := conn.Ping(ctx); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("open clickhouse: %w", err)
	}
	s := &Store{conn: conn}
	if err := s.migrate(ctx); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the connections.
func (s *Store) Close() error {
	return s.conn.Close()
}

// statements splits a DDL file into statements at semicolons that end a line, dropping
// comment lines.
func statements(sql string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.SplitSeq(sql, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") || trimmed == "" {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if rest := strings.TrimSpace(cur.String()); rest != "" {
		out = append(out, rest)
	}
	return out
}

func (s *Store) migrate(ctx context.Context) error {
	files, err := fs.Glob(schemas.ClickHouse, "clickhouse/*.sql")
	if err != nil {
		return fmt.Errorf("clickhouse migrations: %w", err)
	}
	slices.Sort(files)
	for _, f := range files {
		data, err := fs.ReadFile(schemas.ClickHouse, f)
		if err != nil {
			return fmt.Errorf("clickhouse migrations: %w", err)
		}
		for i, stmt := range statements(string(data)) {
			if err := s.conn.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("clickhouse migration %s statement %d: %w", path.Base(f), i+1, err)
			}
		}
	}
	return nil
}

// AppendEvents inserts events in one batch. Copies of an id already stored collapse with it
// (ReplacingMergeTree); queries read through FINAL, so they never see two.
func (s *Store) AppendEvents(ctx context.Context, events []storage.Event) error {
	if len(events) == 0 {
		return nil
	}
	batch, err := s.conn.PrepareBatch(ctx, "INSERT INTO event_log (id, org_id, project_id, type, source, severity, payload, created_at)")
	if err != nil {
		return fmt.Errorf("append events: %w", err)
	}
	defer func() { _ = batch.Close() }()
	for _, ev := range events {
		payload := string(ev.Payload)
		if payload == "" {
			payload = "null"
		}
		if err := batch.Append(ev.ID, ev.OrgID, ev.ProjectID, ev.Type, ev.Source, ev.Severity, payload, ev.CreatedAt.UTC()); err != nil {
			return fmt.Errorf("append events: %w", err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("append events: %w", err)
	}
	return nil
}

// QueryEvents has the semantics of storage/postgres.EventLog.QueryEvents: newest first, ties by
// id descending, Since inclusive, Total over every match, storage.ErrBadCursor for a foreign
// cursor.
func (s *Store) QueryEvents(ctx context.Context, q storage.EventQuery) (storage.EventPage, error) {
	if q.ProjectID == "" {
		return storage.EventPage{}, errors.New("query events: project id required")
	}
	limit := pageSize(q.Limit)
	var where conditions
	if q.OrgID != "" {
		where.add("org_id = ?", q.OrgID)
	}
	where.add("project_id = ?", q.ProjectID)
	if q.Type != "" {
		where.add("type = ?", q.Type)
	}
	if !q.Since.IsZero() {
		where.add("created_at >= fromUnixTimestamp64Micro(?, 'UTC')", q.Since.UnixMicro())
	}
	var page storage.EventPage
	var total uint64
	if err := s.conn.QueryRow(ctx, "SELECT count() FROM event_log FINAL WHERE "+where.sql(), where.args...).Scan(&total); err != nil {
		return storage.EventPage{}, fmt.Errorf("query events: count: %w", err)
	}
	page.Total = int64(total)
	if q.Cursor != "" {
		at, id, err := storage.DecodeCursor(q.Cursor)
		if err != nil {
			return storage.EventPage{}, err
		}
		where.add("(created_at, id) < (fromUnixTimestamp64Micro(?, 'UTC'), ?)", at.UnixMicro(), id)
	}
	rows, err := s.conn.Query(ctx, `SELECT id, org_id, project_id, type, source, severity, payload, created_at
FROM event_log FINAL WHERE `+where.sql()+` ORDER BY created_at DESC, id DESC LIMIT `+strconv.Itoa(limit+1), where.args...)
	if err != nil {
		return storage.EventPage{}, fmt.Errorf("query events: %w", err)
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var ev storage.Event
		var payload string
		if err := rows.Scan(&ev.ID, &ev.OrgID, &ev.ProjectID, &ev.Type, &ev.Source, &ev.Severity, &payload, &ev.CreatedAt); err != nil {
			return storage.EventPage{}, fmt.Errorf("query events: %w", err)
		}
		ev.Payload = []byte(payload)
		ev.CreatedAt = ev.CreatedAt.UTC()
		page.Events = append(page.Events, ev)
	}
	if err := rows.Err(); err != nil {
		return storage.EventPage{}, fmt.Errorf("query events: %w", err)
	}
	if len(page.Events) > limit {
		page.Events = page.Events[:limit]
		last := page.Events[limit-1]
		page.NextCursor = storage.EncodeCursor(last.CreatedAt, last.ID)
	}
	return page, nil
}

// AppendAudit inserts records in one batch; copies of a stored id collapse as events do.
func (s *Store) AppendAudit(ctx context.Context, records []storage.AuditRecord) error {
	if len(records) == 0 {
		return nil
	}
	batch, err := s.conn.PrepareBatch(ctx, `INSERT INTO audit_log (id, time, org_id, key_id, mode, client_ip, user_agent,
operation, resource_ids, patient_ids, outcome, status, latency_ms, truncated, patient_ids_omitted, resource_ids_omitted,
auth_failure, credential)`)
	if err != nil {
		return fmt.Errorf("append audit: %w", err)
	}
	defer func() { _ = batch.Close() }()
	for _, r := range records {
		if err := batch.Append(r.ID, r.Time.UTC(), r.OrgID, r.KeyID, r.Mode, r.ClientIP, r.UserAgent, r.Operation,
			nonNil(r.ResourceIDs), nonNil(r.PatientIDs), r.Outcome, uint16(r.Status), uint32(max(r.LatencyMs, 0)),
			r.Truncated, uint32(max(r.PatientIDsOmitted, 0)), uint32(max(r.ResourceIDsOmitted, 0)), r.AuthFailure, r.Credential); err != nil {
			return fmt.Errorf("append audit: %w", err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("append audit: %w", err)
	}
	return nil
}

// QueryAudit has the semantics of storage/postgres.AuditLog.QueryAudit: newest first, From
// inclusive, To exclusive, PatientID matching any of a record's patient ids.
func (s *Store) QueryAudit(ctx context.Context, q storage.AuditQuery) (storage.AuditPage, error) {
	limit := pageSize(q.Limit)
	var where conditions
	if q.OrgID != "" {
		where.add("org_id = ?", q.OrgID)
	}
	if !q.From.IsZero() {
		where.add("time >= fromUnixTimestamp64Micro(?, 'UTC')", q.From.UnixMicro())
	}
	if !q.To.IsZero() {
		where.add("time < fromUnixTimestamp64Micro(?, 'UTC')", q.To.UnixMicro())
	}
	if q.KeyID != "" {
		where.add("key_id = ?", q.KeyID)
	}
	if q.PatientID != "" {
		where.add("has(patient_ids, ?)", q.PatientID)
	}
	if q.Operation != "" {
		where.add("operation = ?", q.Operation)
	}
	var page storage.AuditPage
	var total uint64
	if err := s.conn.QueryRow(ctx, "SELECT count() FROM audit_log FINAL WHERE "+where.sql(), where.args...).Scan(&total); err != nil {
		return storage.AuditPage{}, fmt.Errorf("query audit: count: %w", err)
	}
	page.Total = int64(total)
	if q.Cursor != "" {
		at, id, err := storage.DecodeCursor(q.Cursor)
		if err != nil {
			return storage.AuditPage{}, err
		}
		where.add("(time, id) < (fromUnixTimestamp64Micro(?, 'UTC'), ?)", at.UnixMicro(), id)
	}
	rows, err := s.conn.Query(ctx, `SELECT id, time, org_id, key_id, mode, client_ip, user_agent, operation,
resource_ids, patient_ids, outcome, status, latency_ms, truncated, patient_ids_omitted, resource_ids_omitted,
auth_failure, credential
FROM audit_log FINAL WHERE `+where.sql()+` ORDER BY time DESC, id DESC LIMIT `+strconv.Itoa(limit+1), where.args...)
	if err != nil {
		return storage.AuditPage{}, fmt.Errorf("query audit: %w", err)
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var r storage.AuditRecord
		var status uint16
		var latency, patientsOmitted, resourcesOmitted uint32
		if err := rows.Scan(&r.ID, &r.Time, &r.OrgID, &r.KeyID, &r.Mode, &r.ClientIP, &r.UserAgent, &r.Operation,
			&r.ResourceIDs, &r.PatientIDs, &r.Outcome, &status, &latency,
			&r.Truncated, &patientsOmitted, &resourcesOmitted, &r.AuthFailure, &r.Credential); err != nil {
			return storage.AuditPage{}, fmt.Errorf("query audit: %w", err)
		}
		r.Time = r.Time.UTC()
		r.Status, r.LatencyMs = int(status), int(latency)
		r.PatientIDsOmitted, r.ResourceIDsOmitted = int(patientsOmitted), int(resourcesOmitted)
		page.Records = append(page.Records, r)
	}
	if err := rows.Err(); err != nil {
		return storage.AuditPage{}, fmt.Errorf("query audit: %w", err)
	}
	if len(page.Records) > limit {
		page.Records = page.Records[:limit]
		last := page.Records[limit-1]
		page.NextCursor = storage.EncodeCursor(last.Time, last.ID)
	}
	return page, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
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

// conditions builds a WHERE clause with positional (?) parameters, bound by the driver.
type conditions struct {
	parts []string
	args  []any
}

func (c *conditions) add(cond string, args ...any) {
	c.parts = append(c.parts, cond)
	c.args = append(c.args, args...)
}

func (c *conditions) sql() string {
	if len(c.parts) == 0 {
		return "1"
	}
	return strings.Join(c.parts, " AND ")
}
