-- Pre-aggregated event counts (issue 17): the analysts' counts per hour or day, per type,
-- severity, project or status, read from hourly sums instead of every event of the range.
--
-- event_counts_hourly holds, per organization, project, UTC hour, type, severity and payload
-- status, how many events were stored. The materialized view adds each insert into event_log to
-- it as the block is written; SummingMergeTree adds rows with equal keys up when parts merge, so
-- readers sum(events) and never need FINAL. storage/clickhouse.AggregateEvents reads it when the
-- query allows (hour or day buckets in a zone whose offsets are whole hours, no run-time
-- percentiles) and reads event_log only for the parts of the range that are not whole hours.
--
-- Exactness. The view counts the rows inserted, so an event stored twice would be counted
-- twice, while event_log collapses its copies. storage/clickhouse.AppendEvents therefore inserts
-- only events whose id is not stored yet (and each id of a batch once): the sums stay equal to
-- the distinct events. PurgeEvents deletes the sums of the hours it purges and recounts the hour
-- the purge cuts through; a TTL (WithRetention) is set on both tables alike.
--
-- Backfill. Rows stored before this view existed are counted once by the Open that creates it
-- (storage/clickhouse/backfill.go), a month at a time:
--   INSERT INTO <stage> SELECT org_id, project_id, toStartOfHour(created_at), type, severity,
--   status, count() FROM event_log FINAL WHERE <month> AND logged_at < <the cut> GROUP BY ALL
-- then ALTER TABLE <stage> MOVE PARTITION <month> TO TABLE event_counts_hourly. Each step is
-- recorded in event_counts_backfill, so an Open killed partway resumes where it stopped, with
-- the same cut, and no month is counted twice or left out. The cut is taken right after the view
-- is created: rows inserted by another node in the milliseconds between the two would be counted
-- twice, so migrate before writers start on a store that already holds events.
--
-- Size: one row per project, hour and (type, severity, status) seen in that hour. A busy project
-- (thousands of events an hour) shrinks a hundredfold; a quiet one (tens an hour) by two or three.
CREATE TABLE IF NOT EXISTS event_counts_hourly
(
    org_id     LowCardinality(String),
    project_id String CODEC(ZSTD(1)),
    hour       DateTime('UTC') CODEC(Delta, ZSTD(1)),
    type       LowCardinality(String),
    severity   LowCardinality(String),
    status     LowCardinality(String),
    events     UInt64
)
ENGINE = SummingMergeTree(events)
PARTITION BY toYYYYMM(hour)
ORDER BY (org_id, project_id, hour, type, severity, status)
SETTINGS ttl_only_drop_parts = 1;
-- A month that stopped receiving rows is merged into one part an hour after its last insert, as
-- event_log's are (0001): an estimated total, a first page's start and every count read a granule
-- range of each part, and the sums arrive in many small parts. Measured at 100 M events, the
-- busy project's estimated total went from p50 32–35 / p99 41–54 ms (25 parts) to 23–28 / 35–43
-- (6). Set apart so that it also reaches tables created before it.
ALTER TABLE event_counts_hourly MODIFY SETTING min_age_to_force_merge_seconds = 3600, min_age_to_force_merge_on_partition_only = 1;
CREATE MATERIALIZED VIEW IF NOT EXISTS event_counts_hourly_mv TO event_counts_hourly AS
SELECT org_id, project_id, toStartOfHour(created_at) AS hour, type, severity, JSONExtractString(payload, 'status') AS status, count() AS events
FROM event_log
GROUP BY org_id, project_id, hour, type, severity, status;
