-- The clinical runtime (processors/agents, processors/workflows, processors/deployments): async
-- agent sessions and workflow runs as leased work, clinical reports, and deployment invocation
-- counts.

-- Async agent sessions are a Postgres work queue. A worker claims a QUEUED session, or a RUNNING
-- one whose lease ran out (its worker died), with FOR UPDATE SKIP LOCKED and moves it to RUNNING
-- with a lease; attempts counts the claims, so a session that keeps killing its worker ends
-- FAILED instead of looping. Sync sessions are written once, finished, and never hold a lease.
alter table agent_sessions
    add column attempts    integer not null default 0,
    add column lease_until timestamptz,
    add column run_id      text;  -- the workflow run whose run_agent step made the session

-- Workflow runs are executed by the runner consumer group. lease_owner and lease_until say which
-- runner executes a RUNNING run and until when it has promised to renew; a run whose lease ran
-- out is re-queued by the sweeper (attempts counts the claims). mode is the credential mode that
-- started the run: a test-mode run never reads a real patient. trigger_event_id is the event
-- that started a triggered run (one run per workflow and event); trigger_depth counts how many
-- runs caused it, through the events they emitted, so trigger chains end.
alter table workflow_runs
    add column attempts         integer not null default 0,
    add column lease_owner      text,
    add column lease_until      timestamptz,
    add column mode             text not null default 'live' check (mode in ('live', 'test')),
    add column trigger_event_id text,
    add column trigger_depth    integer not null default 0;
create unique index workflow_runs_trigger_event on workflow_runs (workflow_id, trigger_event_id)
    where trigger_event_id is not null;
create index workflow_runs_lease on workflow_runs (lease_until) where status = 'RUNNING';
create index agent_sessions_run on agent_sessions (run_id) where run_id is not null;

-- Clinical reports: a score that qualifies (NEWS2 >= 5 or a single red parameter, qSOFA
-- positive) from an agent session or a workflow's create_alert step is kept as a FHIR R4
-- RiskAssessment and announced by diagnostic.result_ready.
create table reports (
    id         text primary key,  -- rpt_ + ULID
    org_id     text not null references organizations (id),
    project_id text not null references projects (id),
    patient_id text not null references patients (id),
    session_id text references agent_sessions (id),
    run_id     text references workflow_runs (id),
    code       text not null,     -- the assessment: news2, qsofa
    severity   text not null check (severity in ('NONE', 'LOW', 'MEDIUM', 'HIGH', 'CRITICAL')),
    conclusion text not null,
    resource   jsonb not null,    -- the FHIR RiskAssessment
    created_at timestamptz not null default now()
);
create index reports_patient on reports (patient_id, created_at desc);
create index reports_session on reports (session_id) where session_id is not null;
create index reports_run on reports (run_id) where run_id is not null;

-- Invocation outcomes of deployments, counted per node in 10-second buckets: each api node adds
-- its counts (upsert), the deployment controller sums a window of buckets to decide DEGRADED and
-- recovery. Rows older than an hour are deleted by the controller.
create table deployment_invocations (
    deployment_id text not null references deployments (id),
    bucket        timestamptz not null,
    node_id       text not null,
    succeeded     bigint not null default 0,
    failed        bigint not null default 0,
    primary key (deployment_id, bucket, node_id)
);
create index deployment_invocations_bucket on deployment_invocations (bucket);
