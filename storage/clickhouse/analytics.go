package clickhouse

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"carehub/storage"
)

// groupColumns are the columns of the AggregateQuery groupings (status is materialized from the
// payload by 0020_analysts.sql).
var groupColumns = map[string]string{
	storage.GroupNone:     "''",
	storage.GroupType:     "toString(type)",
	storage.GroupSeverity: "toString(severity)",
	storage.GroupProject:  "project_id",
	storage.GroupStatus:   "toString(status)",
}

// bucketFunctions are the ClickHouse functions that start each bucket, in a time zone.
var bucketFunctions = map[string]string{
	storage.BucketMinute: "toStartOfMinute",
	storage.BucketHour:   "toStartOfHour",
	storage.BucketDay:    "toStartOfDay",
}

// countsTable holds the hourly sums of 0021_event_counts.sql.
const countsTable = "event_counts_hourly"

// countsSelect counts event_log's rows per key of countsTable; the view of 0021_event_counts.sql
// selects the same.
const countsSelect = `SELECT org_id, project_id, toStartOfHour(created_at) AS hour, type, severity, JSONExtractString(payload, 'status') AS status, count() AS events
FROM event_log FINAL WHERE `

// AggregateEvents has the semantics of storage/postgres.EventLog.AggregateEvents.
//
// Counts come from the hourly sums (event_counts_hourly) for the whole hours of the range, when
// the query allows it (see hourly), and from event_log FINAL (copies not merged yet counted
// once) for the rest: the minutes before the range's first whole hour and after its last, or the
// whole range otherwise. The range prunes partitions and the organization (and project) the
// sorting key of either table. Percentiles are exact (quantilesExactInclusive, as Postgres's
// percentile_cont), from event_log.
func (s *Store) AggregateEvents(ctx context.Context, q storage.AggregateQuery) (_ []storage.AggregateRow, err error) {
	defer func() { err = unavailable(err) }()
	key, ok := groupColumns[q.GroupBy]
	if !ok {
		return nil, fmt.Errorf("aggregate events: unknown grouping %q", q.GroupBy)
	}
	fn, ok := bucketFunctions[q.Bucket]
	if !ok && q.Bucket != storage.BucketNone {
		return nil, fmt.Errorf("aggregate events: unknown bucket %q", q.Bucket)
	}
	loc := "UTC"
	if q.Location != nil {
		loc = q.Location.String()
	}
	// Private events: their status under RedactedKey, their run time unmeasured (only event_log
	// is read then: hourly says why). keyArgs and runArgs are the arguments of key and runTime.
	runTime := "run_ms"
	var keyArgs, runArgs []any
	if q.Private != nil {
		private, privateArgs := privateExpr(q.Private)
		if q.GroupBy == storage.GroupStatus {
			key = fmt.Sprintf("if(%s, '%s', %s)", private, storage.RedactedKey, key)
			keyArgs = privateArgs
		}
		runTime = fmt.Sprintf("if(%s, NULL, run_ms)", private)
		runArgs = privateArgs
	}
	// sub is one SELECT of (bucket b, key k, count c[, measures]) over table's rows in [from, to).
	var selects []string
	var args []any
	sub := func(table, timeColumn, count string, m measure, from, to time.Time) {
		bucket := "toDateTime64(0, 6, 'UTC')"
		if q.Bucket != storage.BucketNone {
			bucket = fn + "(" + timeColumn + ", ?)"
			args = append(args, loc)
		}
		// In the order of their placeholders: bucket, key, measure, where.
		args = append(args, keyArgs...)
		args = append(args, m.args...)
		where := eventFilter(q.OrgID, q.ProjectID, "", q.Types, time.Time{}, time.Time{})
		if len(q.Severities) > 0 {
			where.add("has(?, severity)", q.Severities)
		}
		where.between(timeColumn, from, to)
		selects = append(selects, fmt.Sprintf("SELECT toDateTime64(%s, 6, 'UTC') AS b, %s AS k, %s AS c, %s FROM %s WHERE %s GROUP BY b, k",
			bucket, key, count, m.sql, table, where.sql()))
		args = append(args, where.args...)
	}
	var query string
	if parts, ok := hourly(q); ok {
		for _, p := range parts {
			sub(p.table, p.column, p.count, noMeasure, p.from, p.to)
		}
		query = "SELECT b, k, sum(c), any(m), any(p) FROM (" + strings.Join(selects, " UNION ALL ") + ") GROUP BY b, k ORDER BY b, k"
	} else {
		m := noMeasure
		if q.Latency {
			m = measure{sql: fmt.Sprintf("count(%[1]s) AS m, quantilesExactInclusive(0.5, 0.9, 0.99)(%[1]s) AS p", runTime),
				args: append(slices.Clone(runArgs), runArgs...)} // runTime is in it twice
		}
		sub("event_log FINAL", "created_at", "count()", m, q.From, q.To)
		query = selects[0] + " ORDER BY b, k"
	}
	rows, err := s.conn.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("aggregate events: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []storage.AggregateRow
	for rows.Next() {
		var r storage.AggregateRow
		var count, measured uint64
		var p []float64
		if err := rows.Scan(&r.Bucket, &r.Key, &count, &measured, &p); err != nil {
			return nil, fmt.Errorf("aggregate events: %w", err)
		}
		r.Count, r.Measured = int64(count), int64(measured)
		if measured > 0 {
			r.P50, r.P90, r.P99 = finite(p[0]), finite(p[1]), finite(p[2])
		}
		if q.Bucket == storage.BucketNone {
			r.Bucket = time.Time{}
		} else {
			r.Bucket = r.Bucket.UTC()
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("aggregate events: %w", err)
	}
	return out, nil
}

// measure is the measures (m, p) of a SELECT of AggregateEvents, and its arguments.
type measure struct {
	sql  string
	args []any
}

// noMeasure is the measure of a query without percentiles.
var noMeasure = measure{sql: "toUInt64(0) AS m, [0., 0., 0.] AS p"}

// privateExpr is the condition of the events whose payload values p keeps from the reader, and
// its arguments. The payload is kept as published, so a key may spell "patient" with \u
// escapes: a payload holding one counts as naming a patient.
func privateExpr(p *storage.Private) (string, []any) {
	return `((has(?, toString(type)) OR positionCaseInsensitive(payload, 'patient') > 0 OR positionCaseInsensitive(payload, 'subject') > 0
	OR position(payload, '\\u') > 0) AND NOT has(?, toString(type)))`, []any{append([]string{}, p.Types...), append([]string{}, p.Open...)}
}

// hourly splits q's range as the hourly sums can answer it (rangeParts), and says whether they
// can: not for percentiles (the sums hold counts only) nor minute buckets, nor statuses of private
// events (the sums do not know which events name a patient), and for hour or day buckets only
// in a zone whose offset from UTC is whole hours across the range (a UTC hour then lies in one
// bucket; Asia/Kolkata's do not).
func hourly(q storage.AggregateQuery) ([]rangePart, bool) {
	if q.Latency || q.Bucket == storage.BucketMinute || (q.Private != nil && q.GroupBy == storage.GroupStatus) {
		return nil, false
	}
	if q.Bucket != storage.BucketNone && !wholeHourZone(q.Location, q.From, q.To) {
		return nil, false
	}
	return rangeParts(q.From, q.To, "event_log FINAL")
}

// rangePart is a part of a time range and how to count its events: from the hourly sums or
// from events (table, event_log with or without FINAL).
type rangePart struct {
	table, column, count string
	from, to             time.Time
}

// rangeParts splits [from, to) (a zero bound: open) into its whole UTC hours, counted from the
// hourly sums, and the minutes before the first and after the last, counted from events; ok is
// false when the range holds no whole hour.
func rangeParts(from, to time.Time, events string) (parts []rangePart, ok bool) {
	var lo, hi time.Time
	if !from.IsZero() {
		if lo = from.UTC().Truncate(time.Hour); lo.Before(from) {
			lo = lo.Add(time.Hour)
		}
	}
	if !to.IsZero() {
		hi = to.UTC().Truncate(time.Hour)
	}
	if !lo.IsZero() && !hi.IsZero() && !lo.Before(hi) {
		return nil, false
	}
	parts = append(parts, rangePart{countsTable, "hour", "sum(events)", lo, hi})
	if !from.IsZero() && from.Before(lo) {
		parts = append(parts, rangePart{events, "created_at", "count()", from, lo})
	}
	if !to.IsZero() && hi.Before(to) {
		parts = append(parts, rangePart{events, "created_at", "count()", hi, to})
	}
	return parts, true
}

// estimate is TotalEstimate of q: the hourly sums over the whole hours of its range and
// event_log without FINAL over the rest (or over all of it, for a range within one hour or a
// resource filter, which the sums do not know). Exact but for copies of the edges not merged yet.
func (s *Store) estimate(ctx context.Context, q storage.EventQuery, where conditions) (int64, error) {
	parts, ok := rangeParts(q.Since, q.To, "event_log")
	if !ok || q.PatientID != "" || q.AgentID != "" || q.WorkflowID != "" || q.DeploymentID != "" {
		return s.count(ctx, "event_log", where, storage.TotalEstimate)
	}
	var selects []string
	var args []any
	for _, p := range parts {
		w := eventFilter(q.OrgID, q.ProjectID, q.Type, q.Types, time.Time{}, time.Time{})
		w.between(p.column, p.from, p.to)
		selects = append(selects, "SELECT "+p.count+" AS c FROM "+p.table+" WHERE "+w.sql())
		args = append(args, w.args...)
	}
	var n uint64
	if err := s.conn.QueryRow(ctx, "SELECT sum(c) FROM ("+strings.Join(selects, " UNION ALL ")+")", args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("estimate: %w", err)
	}
	return int64(n), nil
}

// wholeHourZone reports whether loc's offset from UTC is a whole number of hours at every day
// of [from, to) (zero: from 1970, to a year from now). Offsets change at most a few times a year
// and stay for months, so a daily look finds each.
func wholeHourZone(loc *time.Location, from, to time.Time) bool {
	if loc == nil || loc == time.UTC {
		return true
	}
	if epoch := time.Unix(0, 0); from.Before(epoch) {
		from = epoch
	}
	if to.IsZero() {
		to = time.Now().AddDate(1, 0, 0)
	}
	for t := from; t.Before(to.Add(24 * time.Hour)); t = t.Add(24 * time.Hour) {
		if _, offset := t.In(loc).Zone(); offset%3600 != 0 {
			return false
		}
	}
	return true
}

func finite(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return f
}

// PurgeEvents deletes orgID's events created before before and returns how many matched. The
// deployment-wide TTL (Config.EventRetention, Config.AuditRetention) drops whole expired parts
// on its own; this serves organizations that keep less than it.
//
// It is a mutation that rewrites the parts holding such events, projections included, and
// returns when it is done. A lightweight DELETE (a mask, removed when parts merge) was faster,
// but the projections kept the masked rows and a read through them returned them: measured on
// ClickHouse 26.7 with lightweight_mutation_projection_mode 'rebuild', a purged patient's events
// were still on the patient's page (event_log_by_patient, 0022). testEventPurge checks it.
func (s *Store) PurgeEvents(ctx context.Context, orgID string, before time.Time) (int64, error) {
	return s.purge(ctx, "event_log", "created_at", orgID, before,
		"ALTER TABLE event_log DELETE WHERE %s SETTINGS mutations_sync = 1")
}

// PurgeAudit deletes orgID's audit records older than before, as PurgeEvents does, with a
// lightweight DELETE (rows are masked at once and removed when parts merge): audit_log has no
// projection.
func (s *Store) PurgeAudit(ctx context.Context, orgID string, before time.Time) (int64, error) {
	return s.purge(ctx, "audit_log", "time", orgID, before, "DELETE FROM audit_log WHERE %s")
}

// purge deletes orgID's rows of table older than before with statement, a format whose %s is
// the condition.
func (s *Store) purge(ctx context.Context, table, column, orgID string, before time.Time, statement string) (int64, error) {
	var where conditions
	where.add("org_id = ?", orgID)
	where.add(column+" < fromUnixTimestamp64Micro(?, 'UTC')", before.UnixMicro())
	n, err := s.count(ctx, table, where, storage.TotalEstimate)
	if err != nil || n == 0 {
		return 0, err
	}
	if err := s.conn.Exec(ctx, fmt.Sprintf(statement, where.sql()), where.args...); err != nil {
		return 0, fmt.Errorf("purge %s: %w", table, err)
	}
	if table == "event_log" {
		if err := s.purgeCounts(ctx, orgID, before); err != nil {
			return 0, fmt.Errorf("purge %s: %w", table, err)
		}
	}
	return n, nil
}

// purgeCounts deletes orgID's hourly sums of the hours before before and counts again the hour
// before cuts through, from the events left in it. Purges cut through hours long past, where no
// event arrives meanwhile.
func (s *Store) purgeCounts(ctx context.Context, orgID string, before time.Time) error {
	hour := before.UTC().Truncate(time.Hour)
	upTo := hour
	if hour.Before(before) {
		upTo = hour.Add(time.Hour)
	}
	if err := s.conn.Exec(ctx, "DELETE FROM "+countsTable+" WHERE org_id = ? AND hour < fromUnixTimestamp64Micro(?, 'UTC')",
		orgID, upTo.UnixMicro()); err != nil {
		return err
	}
	if upTo.Equal(hour) {
		return nil
	}
	return s.conn.Exec(ctx, "INSERT INTO "+countsTable+" "+countsSelect+`org_id = ? AND created_at >= fromUnixTimestamp64Micro(?, 'UTC')
AND created_at < fromUnixTimestamp64Micro(?, 'UTC') GROUP BY ALL`, orgID, hour.UnixMicro(), upTo.UnixMicro())
}
