-- Event log and audit log in ClickHouse (production). storage/clickhouse runs these statements
-- on Open; each is idempotent (IF NOT EXISTS). Statements are separated by semicolons at line
-- ends.
--
-- Dedupe: the Kafka writers deliver at least once, so a row may be inserted twice.
-- ReplacingMergeTree collapses rows with equal sorting keys when parts merge, and the queries
-- read with FINAL, which applies the same collapse at read time to parts not merged yet, so
-- results are exact at once. An event's sorting key (org, project, created_at, id) is fixed by
-- its envelope, so two copies of one event id always share it, and the partition (by month of
-- created_at). Insert-deduplication tokens were the alternative; they cover only a retried
-- identical block, not an event re-published inside a different batch.

CREATE TABLE IF NOT EXISTS event_log
(
    id         String,
    org_id     LowCardinality(String),
    project_id String,
    type       LowCardinality(String),
    source     LowCardinality(String),
    severity   LowCardinality(String),
    payload    String CODEC(ZSTD(3)),
    created_at DateTime64(6, 'UTC'),
    logged_at  DateTime64(6, 'UTC') DEFAULT now64(6),
    INDEX event_log_type type TYPE set(256) GRANULARITY 4
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(created_at)
ORDER BY (org_id, project_id, created_at, id);

CREATE TABLE IF NOT EXISTS audit_log
(
    id           String,
    time         DateTime64(6, 'UTC'),
    org_id       LowCardinality(String),
    key_id       String,
    mode         LowCardinality(String),
    client_ip    String,
    user_agent   String,
    operation    LowCardinality(String),
    resource_ids Array(String),
    patient_ids  Array(String),
    outcome      LowCardinality(String),
    status       UInt16,
    latency_ms   UInt32,
    logged_at    DateTime64(6, 'UTC') DEFAULT now64(6),
    INDEX audit_log_key key_id TYPE bloom_filter GRANULARITY 4,
    INDEX audit_log_operation operation TYPE set(1024) GRANULARITY 4,
    INDEX audit_log_patients patient_ids TYPE bloom_filter GRANULARITY 4
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(time)
ORDER BY (org_id, time, id);
