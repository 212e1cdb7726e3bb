package clickhouse

import (
	"context"
	"fmt"
	"math"
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

// AggregateEvents has the semantics of storage/postgres.EventLog.AggregateEvents. It reads the
// table FINAL, so copies not merged yet are counted once; the range prunes partitions and the
// organization (and project) the sorting key, so it reads the matching rows' columns only.
// Percentiles are exact (quantilesExactInclusive, as Postgres's percentile_cont).
func (s *Store) AggregateEvents(ctx context.Context, q storage.AggregateQuery) ([]storage.AggregateRow, error) {
	key, ok := groupColumns[q.GroupBy]
	if !ok {
		return nil, fmt.Errorf("aggregate events: unknown grouping %q", q.GroupBy)
	}
	where := eventFilter(q.OrgID, q.ProjectID, "", q.Types, q.From, q.To)
	if len(q.Severities) > 0 {
		where.add("has(?, severity)", q.Severities)
	}
	bucket := "toDateTime64(0, 6, 'UTC')"
	var args []any
	if q.Bucket != storage.BucketNone {
		fn, ok := bucketFunctions[q.Bucket]
		if !ok {
			return nil, fmt.Errorf("aggregate events: unknown bucket %q", q.Bucket)
		}
		loc := "UTC"
		if q.Location != nil {
			loc = q.Location.String()
		}
		bucket = fn + "(created_at, ?)"
		args = append(args, loc)
	}
	measure := "toUInt64(0), [0., 0., 0.]"
	if q.Latency {
		measure = "count(run_ms), quantilesExactInclusive(0.5, 0.9, 0.99)(run_ms)"
	}
	query := fmt.Sprintf(`SELECT toDateTime64(%s, 6, 'UTC') AS b, %s AS k, count(), %s
FROM event_log FINAL WHERE %s GROUP BY b, k ORDER BY b, k`, bucket, key, measure, where.sql())
	rows, err := s.conn.Query(ctx, query, append(args, where.args...)...)
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

func finite(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return f
}

// PurgeEvents deletes orgID's events created before before with a lightweight DELETE (rows are
// masked at once and removed when parts merge) and returns how many matched. The deployment-wide
// TTL (WithRetention) drops whole expired parts on its own; this serves organizations that keep
// less than it.
func (s *Store) PurgeEvents(ctx context.Context, orgID string, before time.Time) (int64, error) {
	return s.purge(ctx, "event_log", "created_at", orgID, before)
}

// PurgeAudit deletes orgID's audit records older than before, as PurgeEvents does.
func (s *Store) PurgeAudit(ctx context.Context, orgID string, before time.Time) (int64, error) {
	return s.purge(ctx, "audit_log", "time", orgID, before)
}

func (s *Store) purge(ctx context.Context, table, column, orgID string, before time.Time) (int64, error) {
	var where conditions
	where.add("org_id = ?", orgID)
	where.add(column+" < fromUnixTimestamp64Micro(?, 'UTC')", before.UnixMicro())
	n, err := s.count(ctx, table, where, storage.TotalEstimate)
	if err != nil || n == 0 {
		return 0, err
	}
	if err := s.conn.Exec(ctx, "DELETE FROM "+table+" WHERE "+where.sql(), where.args...); err != nil {
		return 0, fmt.Errorf("purge %s: %w", table, err)
	}
	return n, nil
}
