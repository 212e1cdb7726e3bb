-- Event log and audit log in ClickHouse (production). storage/clickhouse runs these statements
-- on Open; each is idempotent (IF NOT EXISTS). Statements are separated by semicolons at line
-- ends.
--
-- Reads. The API pages one project's events (one organization's audit records) newest first,
-- optionally by type (operation, key, patient) and from a time; it counts every match; analysts
-- scan an organization or project over a time range. So the sorting key is (org, project, time,
-- id): a project's events are contiguous and in time order, a page is read backwards in key
-- order and stops after its rows, and a time range prunes partitions and granules. The type is
-- not in the key: a page without a type filter, the common one, would then have to merge every
-- type's run; a skip index serves the type filter instead.
--
-- Dedupe. The Kafka writers deliver at least once, so a row may be inserted twice.
-- ReplacingMergeTree collapses rows with equal sorting keys when parts merge; an event's key is
-- fixed by its envelope, so two copies of one id always share it, and the partition. Until parts
-- merge, reads collapse copies themselves (storage/clickhouse): pages skip adjacent copies,
-- counts use FINAL. Insert-deduplication tokens were the alternative; they cover only a retried
-- identical block, not an event re-published inside a different batch.
--
-- Partitions are months of the row's own time: a time range prunes whole months, and retention
-- drops whole parts. min_age_to_force_merge_* merges a month that stopped receiving rows (every
-- part an hour old) into one part, so its copies are gone and FINAL has nothing to merge there.
--
-- Retention. ttl_only_drop_parts makes a TTL drop whole parts (a month at most) instead of
-- rewriting them row by row. No TTL is set here: storage/clickhouse.WithRetention sets one
-- (ALTER TABLE … MODIFY TTL) when the deployment configures it. HIPAA asks six years of audit.
--
-- Codecs. Times within a project increase, so Delta shrinks them to small numbers before ZSTD;
-- payloads are JSON and compress well with ZSTD(3); low-cardinality strings are dictionaries.

CREATE TABLE IF NOT EXISTS event_log
(
    id         String CODEC(ZSTD(1)),
    org_id     LowCardinality(String),
    project_id String CODEC(ZSTD(1)),
    type       LowCardinality(String),
    source     LowCardinality(String),
    severity   LowCardinality(String),
    payload    String CODEC(ZSTD(3)),
    created_at DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    logged_at  DateTime64(6, 'UTC') DEFAULT now64(6) CODEC(Delta, ZSTD(1)),
    INDEX event_log_type type TYPE set(256) GRANULARITY 1
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(created_at)
ORDER BY (org_id, project_id, created_at, id)
SETTINGS ttl_only_drop_parts = 1, min_age_to_force_merge_seconds = 3600, min_age_to_force_merge_on_partition_only = 1;

CREATE TABLE IF NOT EXISTS audit_log
(
    id           String CODEC(ZSTD(1)),
    time         DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    org_id       LowCardinality(String),
    key_id       String CODEC(ZSTD(1)),
    mode         LowCardinality(String),
    client_ip    String CODEC(ZSTD(1)),
    user_agent   LowCardinality(String),
    operation    LowCardinality(String),
    resource_ids Array(String) CODEC(ZSTD(1)),
    patient_ids  Array(String) CODEC(ZSTD(1)),
    outcome      LowCardinality(String),
    status       UInt16,
    latency_ms   UInt32,
    logged_at    DateTime64(6, 'UTC') DEFAULT now64(6) CODEC(Delta, ZSTD(1)),
    INDEX audit_log_key key_id TYPE bloom_filter GRANULARITY 1,
    INDEX audit_log_operation operation TYPE set(1024) GRANULARITY 1,
    INDEX audit_log_patients patient_ids TYPE bloom_filter GRANULARITY 1
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(time)
ORDER BY (org_id, time, id)
SETTINGS ttl_only_drop_parts = 1, min_age_to_force_merge_seconds = 3600, min_age_to_force_merge_on_partition_only = 1;
