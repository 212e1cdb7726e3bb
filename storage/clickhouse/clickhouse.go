// Package clickhouse is the production implementation of the event log and the audit log
// (storage.EventLog, storage.AuditLog) on ClickHouse, over the native protocol with
// clickhouse-go/v2. The DDL is schemas/clickhouse/*.sql, applied by Open; it says how the tables
// are laid out for these queries and why.
//
// Writes: one INSERT per append, its rows sent column by column. A batch of asyncInsertBelow rows
// or more is written as a part of its own; a smaller one goes through the server's asynchronous
// insert buffer (waiting until it is flushed, so an append is durable when it returns), which
// folds the small batches of many writers into one part.
//
// Dedupe: Kafka delivers at least once, so an event or record may be inserted twice. Copies share
// the sorting key and collapse when parts merge (ReplacingMergeTree). Until then reads remove
// them: a page is read newest first in sorting-key order, where copies are adjacent, without
// FINAL, so it reads only the granules the page needs; totals count with FINAL.
//
// Testing: the conformance suites (storage/storagetest) and the benchmarks run when
// CAREHUB_CLICKHOUSE_URL points at a server, such as the one `make clickhouse-up` starts
// (deploy/local/clickhouse); `make test-clickhouse` runs them.
package clickhouse

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/ext"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"golang.org/x/sync/errgroup"

	"carehub/kernel/events"
	"carehub/schemas"
	"carehub/storage"
)

// Page sizes of QueryEvents and QueryAudit: storage's, which both stores share.
const (
	DefaultPageSize = storage.DefaultPageSize
	MaxPageSize     = storage.MaxPageSize
)

// asyncInsertBelow is the batch size under which an append goes through the server's
// asynchronous insert buffer: a part per small batch would make the server merge far more.
const asyncInsertBelow = 1000

// Store is the ClickHouse event log and audit log. It is safe for concurrent use.
type Store struct {
	conn driver.Conn
}

var (
	_ storage.EventLog = (*Store)(nil)
	_ storage.AuditLog = (*Store)(nil)
)

// Config configures Open. The zero value sets no retention.
type Config struct {
	// EventRetention and AuditRetention keep events and audit records that long (rounded up
	// to whole days) and let the server drop what is older, a month's part at a time, as a TTL
	// on each table. Zero leaves that table's TTL as it is. Open sets a TTL only when it differs
	// from the table's, so a restart costs nothing; a new TTL applies to the stored parts in the
	// background.
	EventRetention, AuditRetention time.Duration
}

// Open connects to the ClickHouse server at url (clickhouse://user:password@host:9000/database?
// dial_timeout=5s&compress=lz4, as clickhouse-go's ParseDSN reads it), checks that it answers,
// creates the tables of schemas/clickhouse if they do not exist and applies cfg. Close
// the store when done.
func Open(ctx context.Context, url string, cfg Config) (*Store, error) {
	chOpts, err := ch.ParseDSN(url)
	if err != nil {
		return nil, fmt.Errorf("open clickhouse: %w", err)
	}
	conn, err := ch.Open(chOpts)
	if err != nil {
		return nil, fmt.Errorf("open clickhouse: %w", err)
	}
	if err := conn.Ping(ctx); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("open clickhouse: %w", err)
	}
	s := &Store{conn: readRetry{conn}}
	if err := s.migrate(ctx); err != nil {
		_ = conn.Close()
		return nil, err
	}
	for _, r := range []struct {
		table, column string
		keep          time.Duration
	}{{"event_log", "created_at", cfg.EventRetention}, {countsTable, "hour", cfg.EventRetention}, {"audit_log", "time", cfg.AuditRetention}} {
		if err := s.retain(ctx, r.table, r.column, r.keep); err != nil {
			_ = conn.Close()
			return nil, err
		}
	}
	return s, nil
}

// retain sets table's TTL to keep rows for keep after their time column, unless keep is zero or
// the table has that TTL already.
func (s *Store) retain(ctx context.Context, table, column string, keep time.Duration) error {
	if keep <= 0 {
		return nil
	}
	days := (keep + 24*time.Hour - 1) / (24 * time.Hour)
	ttl := fmt.Sprintf("toDateTime(%s) + toIntervalDay(%d)", column, days)
	var engine string
	if err := s.conn.QueryRow(ctx, "SELECT engine_full FROM system.tables WHERE database = currentDatabase() AND name = ?",
		table).Scan(&engine); err != nil {
		return fmt.Errorf("clickhouse retention of %s: %w", table, err)
	}
	if strings.Contains(engine, " TTL "+ttl+" ") {
		return nil
	}
	if err := s.conn.Exec(ctx, "ALTER TABLE "+table+" MODIFY TTL "+ttl); err != nil {
		return fmt.Errorf("clickhouse retention of %s: %w", table, err)
	}
	return nil
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

// migrate applies the DDL files, counts the events stored before the hourly sums existed
// (backfillCounts: when it is the one that creates them, or when a backfill an earlier Open
// began did not finish) and spans them when it creates the spans (backfillSpans).
func (s *Store) migrate(ctx context.Context) error {
	var hadCounts, hadSpans uint64
	if err := s.conn.QueryRow(ctx, "SELECT countIf(name = ?), countIf(name = ?) FROM system.tables WHERE database = currentDatabase()",
		countsTable, spansTable).Scan(&hadCounts, &hadSpans); err != nil {
		return fmt.Errorf("clickhouse migrations: %w", err)
	}
	if err := s.planBackfill(ctx, hadCounts == 0); err != nil {
		return err
	}
	if err := s.applyDDL(ctx); err != nil {
		return err
	}
	if err := s.backfillCounts(ctx); err != nil {
		return err
	}
	if hadSpans == 0 {
		return s.backfillSpans(ctx)
	}
	return nil
}

// spansTable holds each project's first and last hour (0023_event_spans.sql).
const spansTable = "event_spans"

// backfillSpans spans the events stored before spansTable's view existed. An Open killed before
// it finishes leaves spans narrower than the log, which pages read as wider windows (pageStart).
func (s *Store) backfillSpans(ctx context.Context) error {
	err := s.conn.Exec(ctx, "INSERT INTO "+spansTable+` SELECT org_id, project_id,
toDateTime(toStartOfHour(min(created_at)), 'UTC'), toDateTime(toStartOfHour(max(created_at)), 'UTC')
FROM event_log GROUP BY org_id, project_id`)
	if err != nil {
		return fmt.Errorf("clickhouse migrations: span the stored events: %w", err)
	}
	return nil
}

func (s *Store) applyDDL(ctx context.Context) error {
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

// AppendEvents inserts, in one batch, the events of events whose id is not stored yet, each id
// once: the hourly sums (0021_event_counts.sql) count what is inserted, so a copy must not
// reach them. Two appends of one id at the same moment can both insert it (the Kafka writers
// append an event twice only around a rebalance); event_log collapses such copies when parts
// merge (ReplacingMergeTree), and queries never return two.
func (s *Store) AppendEvents(ctx context.Context, evs []events.Event) error {
	evs, err := s.unstored(ctx, evs)
	if err != nil {
		return fmt.Errorf("append events: %w", err)
	}
	if len(evs) == 0 {
		return nil
	}
	n := len(evs)
	id, org, project, typ, source, severity, payload := make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	created := make([]time.Time, n)
	for i, ev := range evs {
		id[i], org[i], project[i], typ[i], source[i], severity[i] = ev.ID, ev.OrgID, ev.ProjectID, ev.Type, ev.Source, ev.Severity
		payload[i] = string(ev.Payload)
		if payload[i] == "" {
			payload[i] = "null"
		}
		created[i] = ev.CreatedAt.UTC()
	}
	err = s.insert(ctx, "INSERT INTO event_log (id, org_id, project_id, type, source, severity, payload, created_at)",
		n, id, org, project, typ, source, severity, payload, created)
	if err != nil {
		return fmt.Errorf("append events: %w", refused(err))
	}
	return nil
}

// appendBatch is the Store's storage.BatchedEventLog batch: the event log writer takes up to
// this many events a poll. At 5,000 a backlog of a million events took 200 inserts, and the
// server spent twice the CPU ClickHouse's own Kafka engine spends on the same rows;
// at 20,000 the writer read it at 1.3–1.8× the engine's rows/s against 0.7–0.8× (docs/PERFORMANCE.md,
// the analytics peers). Batches are that large only when that many records are waiting: the
// writer has no linger, so at a low rate an event is stored as soon as it is fetched.
const appendBatch = 20_000

// AppendBatch returns how many events the event log writer should append at once
// (storage.BatchedEventLog).
func (s *Store) AppendBatch() int { return appendBatch }

// dataErrorCodes are ClickHouse's error codes for values it cannot take (ErrorCodes.cpp):
// CANNOT_PARSE_TEXT, CANNOT_PARSE_INPUT_ASSERTION_FAILED, TYPE_MISMATCH, ARGUMENT_OUT_OF_BOUND,
// CANNOT_CONVERT_TYPE, CANNOT_PARSE_NUMBER, INCORRECT_DATA, TOO_LARGE_STRING_SIZE,
// VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE, CANNOT_PARSE_UUID… and CANNOT_PARSE_DATETIME.
var dataErrorCodes = map[int32]bool{6: true, 27: true, 53: true, 69: true, 70: true, 72: true, 117: true,
	131: true, 321: true, 376: true, 41: true}

// refused returns err as a storage.RefusedError when it is the server refusing the rows
// themselves; other errors (the connection, the server failing) as they are.
func refused(err error) error {
	if ex, ok := errors.AsType[*proto.Exception](err); ok && dataErrorCodes[ex.Code] {
		return &storage.RefusedError{Code: "ClickHouse code " + strconv.Itoa(int(ex.Code)), Err: err}
	}
	return err
}

// unstored returns events without those whose id is stored already and without repeats of an
// id. The lookup bounds the sorting key by the batch's organizations, projects and time span,
// so it reads the granules the batch would be written next to, not the table.
func (s *Store) unstored(ctx context.Context, evs []events.Event) ([]events.Event, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	seen := make(map[string]bool, len(evs))
	orgs, projects := map[string]bool{}, map[string]bool{}
	var ids []string
	lo, hi := evs[0].CreatedAt, evs[0].CreatedAt
	for _, ev := range evs {
		if !seen[ev.ID] {
			seen[ev.ID] = true
			ids = append(ids, ev.ID)
		}
		orgs[ev.OrgID], projects[ev.ProjectID] = true, true
		lo, hi = minTime(lo, ev.CreatedAt), maxTime(hi, ev.CreatedAt)
	}
	stored, err := s.storedIDs(ctx, slices.Collect(maps.Keys(orgs)), slices.Collect(maps.Keys(projects)), lo, hi, ids)
	if err != nil {
		return nil, err
	}
	for _, id := range stored {
		seen[id] = false
	}
	out := make([]events.Event, 0, len(evs))
	for _, ev := range evs {
		if seen[ev.ID] {
			seen[ev.ID] = false
			out = append(out, ev)
		}
	}
	return out, nil
}

// inQueryText is the most organizations or projects storedIDs writes into its query's text, which
// the server caps (max_query_size, 256 KiB).
const inQueryText = 2000

// storedIDs returns which of ids event_log holds among the rows of orgs and projects created in
// [lo, hi]. Organizations and projects narrow the sorting key's range; more than inQueryText of
// them are left out, the time span still narrows it.
//
// The ids go to the server as an external table (batch_ids), in the native protocol's columns
// rather than in the query's text: one query a batch whatever its size, and none of the parsing
// of thousands of quoted literals, which made the lookup as costly as the insert it guards
// (5,000 ids against 500,000 rows: 30–36 ms in three queries of text, 11–12 ms this way; the
// insert 45–80 ms).
func (s *Store) storedIDs(ctx context.Context, orgs, projects []string, lo, hi time.Time, ids []string) ([]string, error) {
	batch, err := ext.NewTable("batch_ids", ext.Column("id", "String"))
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if err := batch.Append(id); err != nil {
			return nil, err
		}
	}
	var where conditions
	for _, f := range []struct {
		column string
		in     []string
	}{{"org_id", orgs}, {"project_id", projects}} {
		if len(f.in) <= inQueryText {
			where.add("has(?, "+f.column+")", f.in)
		}
	}
	where.add("created_at >= fromUnixTimestamp64Micro(?, 'UTC') AND created_at <= fromUnixTimestamp64Micro(?, 'UTC')", lo.UnixMicro(), hi.UnixMicro())
	where.add("id IN batch_ids")
	return column[string](ch.Context(ctx, ch.WithExternalTable(batch)), s.conn, "SELECT DISTINCT id FROM event_log WHERE "+where.sql(), where.args...)
}

// column reads the single column of query's rows.
func column[T any](ctx context.Context, conn driver.Conn, query string, args ...any) ([]T, error) {
	rows, err := conn.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }()
	var out []T
	for rows.Next() {
		var v T
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// insert sends rows rows of an INSERT as one block, given column by column (the driver appends a
// column at once instead of converting row by row).
func (s *Store) insert(ctx context.Context, query string, rows int, columns ...any) error {
	if rows < asyncInsertBelow {
		ctx = ch.Context(ctx, ch.WithAsync(true))
	} else {
		ctx = ch.Context(ctx, ch.WithSettings(ch.Settings{"async_insert": 0}))
	}
	batch, err := s.conn.PrepareBatch(ctx, query)
	if err != nil {
		return err
	}
	defer func() { _ = batch.Close() }()
	for i, col := range columns {
		if err := batch.Column(i).Append(col); err != nil {
			return err
		}
	}
	return batch.Send()
}

// QueryEvents has the semantics of storage/postgres.EventLog.QueryEvents: newest first (oldest
// first with Ascending), ties by id, Since inclusive, To exclusive, Total over every match as
// q.Total asks, storage.ErrBadCursor for a foreign cursor.
func (s *Store) QueryEvents(ctx context.Context, q storage.EventQuery) (_ storage.EventPage, err error) {
	defer func() { err = unavailable(err) }()
	if q.ProjectID == "" {
		return storage.EventPage{}, errors.New("query events: project id required")
	}
	limit := storage.PageSize(q.Limit)
	where := eventQueryFilter(q)
	// The total and the page are two queries of their own: run side by side, the call waits
	// for the longer rather than for both.
	var page storage.EventPage
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) {
		if q.Total == storage.TotalEstimate {
			page.Total, err = s.estimate(gctx, q, where)
		} else {
			page.Total, err = s.count(gctx, "event_log", where, q.Total)
		}
		return err
	})
	g.Go(func() (err error) {
		page.Events, err = s.pageEvents(gctx, q, where, limit+1)
		return err
	})
	if err := g.Wait(); err != nil {
		return storage.EventPage{}, fmt.Errorf("query events: %w", err)
	}
	page.Events, page.NextCursor = storage.TrimPage(page.Events, limit, events.Event.CursorKey)
	return page, nil
}

// pageWindows are the spans of time a page reads from where it starts (the cursor, the range's
// near end, or the project's newest or oldest hour), one after the other, until it has its rows;
// past the last it reads the rest of the range. A page bounded in time reads the partitions and
// parts of its span only; an unbounded one reads a granule of every part the project has rows in
// (measured at 100 M events in 35 parts: 0.6–1.3 s for a first page, 0.05 s within a day).
// The first is a day, not an hour: the server reads a window in order and stops at the page's
// last row, so a wider one costs little more than a narrower, while a window too narrow for the
// page costs a query more (at 20 M events, first pages of a busy project, a project at random and
// one workflow: p99 25, 42, 56 ms starting with an hour; 17, 23, 22 ms starting with a day).
var pageWindows = []time.Duration{24 * time.Hour, 8 * 24 * time.Hour, 64 * 24 * time.Hour}

// pageEvents returns the first want distinct events matching where past q's cursor, in q's
// order, reading pageWindows one after the other.
//
// A patient filter reads the range in one query instead, which the server answers from the
// projection event_log_by_patient (0022): the patient's events stored together, newest first,
// so the page reads one granule per part and stops (measured at 20 M events, the page of one
// patient of the busy project: p50 192–199 → 39–51 ms, p99 241 → 62–70 ms). Windows would
// each read a little of the same run and analyse every part's indexes again. The other
// resources (agents, workflows, deployments) are few per project and dense, and keep the
// windows (one query: no faster).
func (s *Store) pageEvents(ctx context.Context, q storage.EventQuery, where conditions, want int) ([]events.Event, error) {
	windows := pageWindows
	if q.PatientID != "" {
		windows = nil
	}
	ctx = ch.Context(ctx, ch.WithSettings(projectionFor(q)))
	var start time.Time
	if len(windows) > 0 {
		var err error
		if start, err = s.pageStart(ctx, q); err != nil {
			return nil, err
		}
	}
	var out []events.Event
	var near time.Time // where the last window ended (zero: the range's own bound)
	for i := 0; ; i++ {
		// far is the window's other end, zero past the last window or past the range's end.
		var far time.Time
		if i < len(windows) && !start.IsZero() {
			if q.Ascending {
				if far = start.Add(windows[i]); !q.To.IsZero() && !far.Before(q.To) {
					far = time.Time{}
				}
			} else if far = start.Add(-windows[i]); !q.Since.IsZero() && !far.After(q.Since) {
				far = time.Time{}
			}
		}
		w := where.clone()
		if q.Ascending {
			w.between("created_at", near, far)
		} else {
			w.between("created_at", far, near)
		}
		query, args, err := eventsInOrder(q, w)
		if err != nil {
			return nil, err
		}
		got, err := distinctPage(ctx, s.conn, query, args, want-len(out), scanEvent)
		if err != nil {
			return nil, err
		}
		if out = append(out, got...); len(out) >= want || far.IsZero() {
			return out, nil
		}
		near = far
	}
}

// pageStart is the time q's page starts from: its cursor's, else its range's near end, else
// the hour after the project's newest event (the hour of its oldest, ascending); zero when the
// project has none. That hour comes from the project's span (0023_event_spans.sql, one row),
// else from the hourly sums, which read every hour the project has. A span behind the log (a
// purge since, a backfill cut short) costs a wider first window, never a row: the first window
// is open on its near side.
func (s *Store) pageStart(ctx context.Context, q storage.EventQuery) (time.Time, error) {
	if q.Cursor != "" {
		at, _, err := storage.DecodeCursor(q.Cursor)
		return at, err
	}
	bound, span, sums := q.To, "max(last_hour) + INTERVAL 1 HOUR", "max(hour) + INTERVAL 1 HOUR"
	if q.Ascending {
		bound, span, sums = q.Since, "min(first_hour)", "min(hour)"
	}
	if !bound.IsZero() {
		return bound, nil
	}
	where := eventFilter(q.OrgID, q.ProjectID, "", nil, time.Time{}, time.Time{})
	for _, from := range []struct{ edge, table string }{{span, spansTable}, {sums, countsTable}} {
		var at time.Time
		var n uint64
		if err := s.conn.QueryRow(ctx, "SELECT "+from.edge+", count() FROM "+from.table+" WHERE "+where.sql(), where.args...).Scan(&at, &n); err != nil {
			return time.Time{}, err
		}
		if n > 0 {
			return at.UTC(), nil
		}
	}
	return time.Time{}, nil
}

// projectionFor is the setting that says where the events of q are read from, in order: the
// patient's run of event_log_by_patient (0022) when q filters on a patient, else the table
// itself. Every projection of event_log matches a project's rows as the table's sorting key does,
// and on such a tie the server may pick one, which it cannot read newest first (0003).
func projectionFor(q storage.EventQuery) ch.Settings {
	if q.PatientID != "" {
		return ch.Settings{"preferred_optimize_projection_name": patientProjection}
	}
	return ch.Settings{"optimize_use_projections": 0}
}

// patientProjection is event_log's projection ordered by patient (0022_event_log_by_patient.sql).
const patientProjection = "event_log_by_patient"

// eventQueryFilter is the WHERE clause of q's filters, its cursor aside.
func eventQueryFilter(q storage.EventQuery) conditions {
	where := eventFilter(q.OrgID, q.ProjectID, q.Type, q.Types, q.Since, q.To)
	for _, f := range []struct{ column, id string }{
		{"patient_id", q.PatientID}, {"agent_id", q.AgentID}, {"workflow_id", q.WorkflowID}, {"deployment_id", q.DeploymentID},
	} {
		if f.id != "" {
			where.add(f.column+" = ?", f.id)
		}
	}
	return where
}

// eventsInOrder is the SELECT of the events matching where past q's cursor, in q's order,
// without LIMIT.
func eventsInOrder(q storage.EventQuery, where conditions) (string, []any, error) {
	if q.Cursor != "" {
		at, id, err := storage.DecodeCursor(q.Cursor)
		if err != nil {
			return "", nil, err
		}
		where.after("created_at", at, id, q.Ascending)
	}
	order := "DESC"
	if q.Ascending {
		order = "ASC"
	}
	return `SELECT id, org_id, project_id, type, source, severity, payload, created_at
FROM event_log WHERE ` + where.sql() + ` ORDER BY created_at ` + order + `, id ` + order, where.args, nil
}

// ExportEvents has the semantics of storage/postgres.EventLog.ExportEvents: one SELECT in the
// sorting key's order, which the server reads in order and streams block by block; copies not
// merged yet are adjacent and skipped, as pages skip them.
func (s *Store) ExportEvents(ctx context.Context, q storage.EventQuery, emit func([]events.Event) error) error {
	if q.ProjectID == "" {
		return errors.New("export events: project id required")
	}
	query, args, err := eventsInOrder(q, eventQueryFilter(q))
	if err != nil {
		return err
	}
	rows, err := s.conn.Query(ch.Context(ctx, ch.WithSettings(projectionFor(q))), query, args...)
	if err != nil {
		return unavailable(fmt.Errorf("export events: %w", err))
	}
	defer func() { _ = rows.Close() }()
	chunk := make([]events.Event, 0, storage.ExportChunk)
	var last string
	for rows.Next() {
		id, ev, err := scanEvent(rows)
		if err != nil {
			return unavailable(fmt.Errorf("export events: %w", err))
		}
		if id == last {
			continue
		}
		last = id
		if chunk = append(chunk, ev); len(chunk) == storage.ExportChunk {
			// emit's errors are the client's (a download it stopped reading), not the store's.
			if err := emit(chunk); err != nil {
				return err
			}
			chunk = chunk[:0]
		}
	}
	if err := rows.Err(); err != nil {
		return unavailable(fmt.Errorf("export events: %w", err))
	}
	if len(chunk) > 0 {
		return emit(chunk)
	}
	return nil
}

// eventFilter is the WHERE clause of the filters event queries and aggregations share. The
// organization comes first: it leads the sorting key.
func eventFilter(orgID, projectID, typ string, types []string, from, to time.Time) conditions {
	var where conditions
	if orgID != "" {
		where.add("org_id = ?", orgID)
	}
	if projectID != "" {
		where.add("project_id = ?", projectID)
	}
	if typ != "" {
		where.add("type = ?", typ)
	}
	if len(types) > 0 {
		exact, prefixes := storage.SplitTypePatterns(types)
		switch {
		case prefixes == nil:
			where.add("has(?, type)", exact)
		case slices.Contains(prefixes, ""):
		default:
			where.add("(has(?, type) OR arrayExists(p -> startsWith(type, p), ?))", exact, prefixes)
		}
	}
	where.between("created_at", from, to)
	return where
}

func scanEvent(rows driver.Rows) (string, events.Event, error) {
	var ev events.Event
	var payload string
	if err := rows.Scan(&ev.ID, &ev.OrgID, &ev.ProjectID, &ev.Type, &ev.Source, &ev.Severity, &payload, &ev.CreatedAt); err != nil {
		return "", ev, err
	}
	ev.Payload = []byte(payload)
	ev.CreatedAt = ev.CreatedAt.UTC()
	return ev.ID, ev, nil
}

// count counts the distinct rows of table matching where, as mode asks. FINAL collapses the
// copies no merge has collapsed yet; it is cheap where they cannot be, in a partition of one
// part. The estimate counts without FINAL: exact once parts have merged, over by the copies
// not merged yet.
func (s *Store) count(ctx context.Context, table string, where conditions, mode storage.TotalMode) (int64, error) {
	final := " FINAL"
	switch mode {
	case storage.TotalNone:
		return 0, nil
	case storage.TotalEstimate:
		final = ""
	}
	var n uint64
	if err := s.conn.QueryRow(ctx, "SELECT count() FROM "+table+final+" WHERE "+where.sql(), where.args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count: %w", err)
	}
	return int64(n), nil
}

// distinctPage returns the first want distinct rows of query, which must order rows by their
// (time, id) sorting key, either way, and leave LIMIT to distinctPage. The copies of a row share
// that key, so they come one after the other: distinctPage keeps the first of each. The server
// reads the table in key order and stops after LIMIT rows, so a page costs what the page reads,
// not what the project holds, as FINAL would (it collapses copies over every matching row before
// sorting). When copies leave fewer than want distinct rows, it asks again for more.
func distinctPage[T any](ctx context.Context, conn driver.Conn, query string, args []any, want int,
	scan func(driver.Rows) (string, T, error)) ([]T, error) {
	for n := want; ; n *= 4 {
		out, read, err := distinct(ctx, conn, query+" LIMIT "+strconv.Itoa(n), args, scan)
		if err != nil || len(out) >= want || read < n {
			return out[:min(len(out), want)], err
		}
	}
}

// distinct runs query and returns its rows without adjacent copies (equal ids), and how many it read.
func distinct[T any](ctx context.Context, conn driver.Conn, query string, args []any,
	scan func(driver.Rows) (string, T, error)) ([]T, int, error) {
	rows, err := conn.Query(ctx, query, args...)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = rows.Close() }()
	var out []T
	var last string
	read := 0
	for rows.Next() {
		id, v, err := scan(rows)
		if err != nil {
			return nil, 0, err
		}
		if read == 0 || id != last {
			out = append(out, v)
		}
		read++
		last = id
	}
	return out, read, rows.Err()
}

// AppendAudit inserts records in one batch; copies of a stored id collapse as events do.
func (s *Store) AppendAudit(ctx context.Context, records []storage.AuditRecord) error {
	if len(records) == 0 {
		return nil
	}
	n := len(records)
	id, org, key, mode, ip, agent, op, outcome, failure, credential := make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	at := make([]time.Time, n)
	resources, patients := make([][]string, n), make([][]string, n)
	status := make([]uint16, n)
	latency, patientsOmitted, resourcesOmitted := make([]uint32, n), make([]uint32, n), make([]uint32, n)
	truncated := make([]bool, n)
	for i, r := range records {
		id[i], org[i], key[i], mode[i], ip[i], agent[i], op[i], outcome[i] = r.ID, r.OrgID, r.KeyID, r.Mode, r.ClientIP, r.UserAgent, r.Operation, r.Outcome
		failure[i], credential[i] = r.AuthFailure, r.Credential
		at[i] = r.Time.UTC()
		resources[i], patients[i] = nonNil(r.ResourceIDs), nonNil(r.PatientIDs)
		status[i], latency[i] = uint16(r.Status), uint32(max(r.LatencyMs, 0))
		truncated[i] = r.Truncated
		patientsOmitted[i], resourcesOmitted[i] = uint32(max(r.PatientIDsOmitted, 0)), uint32(max(r.ResourceIDsOmitted, 0))
	}
	err := s.insert(ctx, `INSERT INTO audit_log (id, time, org_id, key_id, mode, client_ip, user_agent, operation,
resource_ids, patient_ids, outcome, status, latency_ms, truncated, patient_ids_omitted, resource_ids_omitted,
auth_failure, credential)`, n, id, at, org, key, mode, ip, agent, op, resources, patients, outcome, status, latency,
		truncated, patientsOmitted, resourcesOmitted, failure, credential)
	if err != nil {
		return fmt.Errorf("append audit: %w", refused(err))
	}
	return nil
}

// QueryAudit has the semantics of storage/postgres.AuditLog.QueryAudit: newest first, From
// inclusive, To exclusive, PatientID matching any of a record's patient ids.
func (s *Store) QueryAudit(ctx context.Context, q storage.AuditQuery) (_ storage.AuditPage, err error) {
	defer func() { err = unavailable(err) }()
	limit := storage.PageSize(q.Limit)
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
	if page.Total, err = s.count(ctx, "audit_log", where, q.Total); err != nil {
		return storage.AuditPage{}, fmt.Errorf("query audit: %w", err)
	}
	if q.Cursor != "" {
		at, id, err := storage.DecodeCursor(q.Cursor)
		if err != nil {
			return storage.AuditPage{}, err
		}
		where.after("time", at, id, false)
	}
	page.Records, err = distinctPage(ctx, s.conn, `SELECT id, time, org_id, key_id, mode, client_ip, user_agent, operation,
resource_ids, patient_ids, outcome, status, latency_ms, truncated, patient_ids_omitted, resource_ids_omitted,
auth_failure, credential
FROM audit_log WHERE `+where.sql()+` ORDER BY time DESC, id DESC`, where.args, limit+1, scanAudit)
	if err != nil {
		return storage.AuditPage{}, fmt.Errorf("query audit: %w", err)
	}
	page.Records, page.NextCursor = storage.TrimPage(page.Records, limit, storage.AuditRecord.CursorKey)
	return page, nil
}

func scanAudit(rows driver.Rows) (string, storage.AuditRecord, error) {
	var r storage.AuditRecord
	var status uint16
	var latency, patientsOmitted, resourcesOmitted uint32
	if err := rows.Scan(&r.ID, &r.Time, &r.OrgID, &r.KeyID, &r.Mode, &r.ClientIP, &r.UserAgent, &r.Operation,
		&r.ResourceIDs, &r.PatientIDs, &r.Outcome, &status, &latency,
		&r.Truncated, &patientsOmitted, &resourcesOmitted, &r.AuthFailure, &r.Credential); err != nil {
		return "", r, err
	}
	r.Time = r.Time.UTC()
	r.Status, r.LatencyMs = int(status), int(latency)
	r.PatientIDsOmitted, r.ResourceIDsOmitted = int(patientsOmitted), int(resourcesOmitted)
	return r.ID, r, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
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

// after keeps the rows past the cursor (at, id): before it newest first, after it with
// ascending. The bound on column alone is implied by the tuple comparison, but ClickHouse prunes
// partitions and granules only on it, not on the tuple.
func (c *conditions) after(column string, at time.Time, id string, ascending bool) {
	cmp, tuple := "<=", "<"
	if ascending {
		cmp, tuple = ">=", ">"
	}
	c.add(column+" "+cmp+" fromUnixTimestamp64Micro(?, 'UTC')", at.UnixMicro())
	c.add("("+column+", id) "+tuple+" (fromUnixTimestamp64Micro(?, 'UTC'), ?)", at.UnixMicro(), id)
}

func (c conditions) clone() conditions {
	return conditions{parts: slices.Clone(c.parts), args: slices.Clone(c.args)}
}

// between keeps the rows whose column is in [from, to); a zero bound leaves that side open.
func (c *conditions) between(column string, from, to time.Time) {
	if !from.IsZero() {
		c.add(column+" >= fromUnixTimestamp64Micro(?, 'UTC')", from.UnixMicro())
	}
	if !to.IsZero() {
		c.add(column+" < fromUnixTimestamp64Micro(?, 'UTC')", to.UnixMicro())
	}
}

func (c *conditions) sql() string {
	if len(c.parts) == 0 {
		return "1"
	}
	return strings.Join(c.parts, " AND ")
}
