package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/storage"
)

// runTimeExpr is an event's run time in milliseconds: the payload's latencyMs (agent sessions),
// durationMs or duration_ms (workflow runs) when it is a JSON number, else null. Published
// payloads are free-form, so a field that is not a number is not measured rather than an error.
const runTimeExpr = `coalesce(
	case when jsonb_typeof(payload->'latencyMs') = 'number' then (payload->>'latencyMs')::float8 end,
	case when jsonb_typeof(payload->'durationMs') = 'number' then (payload->>'durationMs')::float8 end,
	case when jsonb_typeof(payload->'duration_ms') = 'number' then (payload->>'duration_ms')::float8 end)`

// groupExprs are the SQL expressions of the AggregateQuery groupings.
var groupExprs = map[string]string{
	storage.GroupNone:     "''",
	storage.GroupType:     "type",
	storage.GroupSeverity: "severity",
	storage.GroupProject:  "project_id",
	storage.GroupStatus:   "coalesce(payload->>'status', '')",
}

// AggregateEvents counts the events matching q per time bucket (date_trunc in q.Location) and
// group key, ordered by bucket then key; with q.Latency it adds percentile_cont of the run time.
func (l *EventLog) AggregateEvents(ctx context.Context, q storage.AggregateQuery) ([]storage.AggregateRow, error) {
	rows, err := l.aggregateEvents(ctx, q)
	return rows, unavailable(err)
}

func (l *EventLog) aggregateEvents(ctx context.Context, q storage.AggregateQuery) ([]storage.AggregateRow, error) {
	key, ok := groupExprs[q.GroupBy]
	if !ok {
		return nil, fmt.Errorf("aggregate events: unknown grouping %q", q.GroupBy)
	}
	where := eventFilter(q.OrgID, q.ProjectID, "", q.Types, q.From, q.To)
	if len(q.Severities) > 0 {
		where.add("severity = any($%d)", q.Severities)
	}
	bucket := "to_timestamp(0)"
	switch q.Bucket {
	case storage.BucketNone:
	case storage.BucketMinute, storage.BucketHour, storage.BucketDay:
		where.args = append(where.args, locationName(q.Location))
		bucket = fmt.Sprintf("date_trunc('%s', created_at, $%d)", q.Bucket, len(where.args))
	default:
		return nil, fmt.Errorf("aggregate events: unknown bucket %q", q.Bucket)
	}
	runTime := runTimeExpr
	if q.Private != nil && (q.GroupBy == storage.GroupStatus || q.Latency) { // else no payload value is read
		private := privateExpr(q.Private, &where.args)
		if q.GroupBy == storage.GroupStatus {
			key = fmt.Sprintf("case when %s then '%s' else %s end", private, storage.RedactedKey, key)
		}
		runTime = fmt.Sprintf("case when %s then null else %s end", private, runTime)
	}
	measure := "0::bigint, '{0,0,0}'::float8[]"
	if q.Latency {
		measure = "count(" + runTime + "), coalesce(percentile_cont(array[0.5, 0.9, 0.99]) within group (order by " +
			runTime + "), '{0,0,0}')"
	}
	sql := fmt.Sprintf("select %s, %s, count(*), %s from event_log where %s group by 1, 2 order by 1, 2",
		bucket, key, measure, where.sql())
	rows, err := l.pool.Query(ctx, sql, where.args...)
	if err != nil {
		return nil, fmt.Errorf("aggregate events: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (storage.AggregateRow, error) {
		var r storage.AggregateRow
		var p []float64
		if err := row.Scan(&r.Bucket, &r.Key, &r.Count, &r.Measured, &p); err != nil {
			return r, err
		}
		r.P50, r.P90, r.P99 = p[0], p[1], p[2]
		if q.Bucket == storage.BucketNone {
			r.Bucket = time.Time{}
		} else {
			r.Bucket = r.Bucket.UTC()
		}
		return r, nil
	})
	if err != nil {
		return nil, fmt.Errorf("aggregate events: %w", err)
	}
	return out, nil
}

// privateExpr is the condition of the events whose payload values p keeps from the reader, its
// arguments appended to args. Whether a payload names a patient is the stored column
// names_patient (schemas/postgres/0030), worked out once when the event is stored rather than
// on every row of every query.
func privateExpr(p *storage.Private, args *[]any) string {
	// Never nil: "= any(null)" is null, and "not null" would let every event through.
	*args = append(*args, append([]string{}, p.Types...), append([]string{}, p.Open...))
	n := len(*args)
	return fmt.Sprintf("((type = any($%d) or names_patient) and not type = any($%d))", n-1, n)
}

func locationName(loc *time.Location) string {
	if loc == nil {
		return "UTC"
	}
	return loc.String()
}

// purgeBatch is how many rows one retention DELETE removes: small enough that a purge of
// millions of rows never holds long locks or one huge transaction.
const purgeBatch = 10_000

// PurgeEvents deletes orgID's events created before before, purgeBatch rows per statement, and
// returns how many it deleted. The table is not partitioned (0002_eventlog.sql says why), so
// retention is a batched DELETE on the (org_id, created_at) index of 0020_analysts.sql.
func (l *EventLog) PurgeEvents(ctx context.Context, orgID string, before time.Time) (int64, error) {
	return purge(ctx, l.pool, "event_log", "created_at", orgID, before)
}

// PurgeAudit deletes orgID's audit records older than before, as PurgeEvents does.
func (l *AuditLog) PurgeAudit(ctx context.Context, orgID string, before time.Time) (int64, error) {
	return purge(ctx, l.pool, "audit_log", "time", orgID, before)
}

func purge(ctx context.Context, pool *pgxpool.Pool, table, column, orgID string, before time.Time) (int64, error) {
	sql := fmt.Sprintf(`delete from %[1]s where id in (
	select id from %[1]s where org_id = $1 and %[2]s < $2 order by %[2]s limit %[3]d)`, table, column, purgeBatch)
	var total int64
	for {
		tag, err := pool.Exec(ctx, sql, orgID, before)
		if err != nil {
			return total, fmt.Errorf("purge %s: %w", table, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < purgeBatch {
			return total, nil
		}
	}
}
