-- Event log and audit log, the Postgres implementation (the embedded default; production keeps
-- them in ClickHouse, schemas/clickhouse/). Writers are Kafka consumers that may deliver a record
-- twice, so both tables are idempotent by id: inserts use ON CONFLICT (id) DO NOTHING.
--
-- Not partitioned: a partitioned table's primary key must include the partition key, which
-- would make idempotency depend on a re-delivered event carrying the same created_at as well as
-- the same id; and monthly partitions need a job that creates them ahead of time. The Postgres
-- log serves single-node installations, where plain b-tree indexes keep reads fast at millions
-- of rows (storage/postgres benchmarks) and retention is a batched DELETE by created_at.

create table event_log (
    id         text primary key,          -- evt_ + ULID
    org_id     text not null,
    project_id text not null,
    type       text not null,
    source     text not null,
    severity   text not null,
    payload    jsonb not null,
    created_at timestamptz not null,
    logged_at  timestamptz not null default now()
);

-- Newest first per project, ties by id: the keyset order of GET /v1/events and the events query.
-- org_id is a covering column rather than the leading key so that a platform-operator query
-- (no org filter) uses the same index, and so that count(*) of a page's matches, org filter
-- included, is an index-only scan.
create index event_log_project on event_log (project_id, created_at desc, id desc) include (org_id);
-- The same order within one type (the `type` filter).
create index event_log_project_type on event_log (project_id, type, created_at desc, id desc) include (org_id);
-- A project belongs to one organization: without this the planner multiplies the selectivity
-- of project_id and org_id as if independent and underestimates every tenant query.
create statistics event_log_project_org (dependencies) on project_id, org_id from event_log;

create table audit_log (
    id           text primary key,        -- req_ + ULID, the request id
    time         timestamptz not null,
    org_id       text not null,           -- '' for the platform operator
    key_id       text not null,
    mode         text not null,
    client_ip    text not null,
    user_agent   text not null,
    operation    text not null,
    resource_ids text[] not null default '{}',
    patient_ids  text[] not null default '{}',
    outcome      text not null,
    status       integer not null,
    latency_ms   integer not null,
    logged_at    timestamptz not null default now()
);

create index audit_log_org_time on audit_log (org_id, time desc, id desc);
create index audit_log_key_time on audit_log (key_id, time desc, id desc);
create index audit_log_operation_time on audit_log (operation, time desc, id desc);
create index audit_log_patients on audit_log using gin (patient_ids);
-- Platform-operator reads across organizations, and retention.
create index audit_log_time on audit_log (time desc, id desc);
