-- Where each project's events start and end: the hour of its oldest and of its newest event.
-- A page without a cursor or a range bound reads back from the hour after the project's newest
-- event (storage/clickhouse.pageStart, then widening windows of time); that hour came from the
-- hourly sums (0021), which read every hour the project has, ~70,000 rows for a busy one: 13 ms
-- of a first page's 26 at 20 M events. Here it is one row per project once parts merge.
--
-- The view adds each inserted block's bounds; AggregatingMergeTree keeps the least first and
-- the greatest last hour when parts merge, and readers take min/max themselves until then.
-- Copies of an event change neither bound. A purge leaves a project's first hour where it was:
-- a span wider than the log costs a page an empty window, never a row (the first window a page
-- reads is open on its near side). Rows stored before this view existed are spanned once by the
-- Open that creates it (storage/clickhouse.backfillSpans); min and max are idempotent, so that
-- pass and the view may both see an insert.
CREATE TABLE IF NOT EXISTS event_spans
(
    org_id     LowCardinality(String),
    project_id String,
    first_hour SimpleAggregateFunction(min, DateTime('UTC')),
    last_hour  SimpleAggregateFunction(max, DateTime('UTC'))
)
ENGINE = AggregatingMergeTree
ORDER BY (org_id, project_id);
CREATE MATERIALIZED VIEW IF NOT EXISTS event_spans_mv TO event_spans AS
SELECT org_id, project_id, toDateTime(toStartOfHour(min(created_at)), 'UTC') AS first_hour, toDateTime(toStartOfHour(max(created_at)), 'UTC') AS last_hour
FROM event_log
GROUP BY org_id, project_id;
