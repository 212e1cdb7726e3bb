-- carehub core entities. Every tenant-owned row carries org_id so each query can filter by the
-- caller's organization without a join; ids are prefix + lowercase ULID (DECISIONS §1).

create table organizations (
    id              text primary key,
    name            text not null,
    slug            text not null unique,
    type            text not null check (type in ('health_system', 'clinic', 'payer', 'developer', 'research')),
    plan            text not null check (plan in ('starter', 'growth', 'enterprise')),
    fhir_base       text,
    hipaa_compliant boolean not null default false,
    member_count    integer not null default 0 check (member_count >= 0),
    created_at      timestamptz not null default now()
);
create index organizations_created on organizations (created_at, id);

create table projects (
    id         text primary key,
    org_id     text not null references organizations (id),
    name       text not null,
    created_at timestamptz not null default now()
);
create index projects_org on projects (org_id, created_at, id);

-- API keys: only the SHA-256 of the key is stored. A platform key has no organization and sees all.
create table api_keys (
    id            text primary key,
    org_id        text references organizations (id),
    platform      boolean not null default false,
    name          text not null default '',
    mode          text not null check (mode in ('live', 'test')),
    prefix        text not null,
    last4         text not null,
    hash          bytea not null unique,
    scopes        text[] not null default '{}',
    ip_allowlist  cidr[] not null default '{}',
    status        text not null default 'active' check (status in ('active', 'rotated', 'revoked')),
    rotated_at    timestamptz,
    expires_at    timestamptz,
    replaced_by   text references api_keys (id),
    revoked_at    timestamptz,
    last_used_at  timestamptz,
    created_at    timestamptz not null default now(),
    check (platform or org_id is not null)
);
create index api_keys_org on api_keys (org_id, created_at);

-- JWT signing keys (Ed25519), shared by every node.
create table jwt_signing_keys (
    kid         text primary key,
    private_key bytea not null,
    public_key  bytea not null,
    created_at  timestamptz not null default now(),
    retired_at  timestamptz
);

create table publishers (
    id         text primary key,
    name       text not null,
    email      text not null,
    org_id     text references organizations (id),
    verified   boolean not null default false,
    created_at timestamptz not null default now()
);
create index publishers_org on publishers (org_id);

-- Marketplace catalogue: visible to every tenant once APPROVED (or DEPRECATED); drafts and
-- submissions are visible to their submitting organization and the platform operator.
create table assets (
    id                text primary key,
    publisher_id      text not null references publishers (id),
    submitted_by_org  text references organizations (id),
    name              text not null,
    description       text not null,
    type              text not null check (type in ('MODEL', 'AGENT', 'CONNECTOR', 'DATASET', 'SOLUTION', 'APP')),
    category          text not null,
    version           text not null,
    pricing_type      text not null check (pricing_type in ('FREE', 'USAGE_BASED', 'SUBSCRIPTION', 'ENTERPRISE')),
    cost_per_request  double precision,
    monthly_fee       double precision,
    annual_fee        double precision,
    free_tier_limit   integer,
    fhir_resources    text[] not null default '{}',
    score_overall     integer not null default 0,
    score_security    integer not null default 0,
    score_privacy     integer not null default 0,
    score_clinical    integer not null default 0,
    hipaa_compliant   boolean not null default false,
    fda_cleared       boolean not null default false,
    badges            text[] not null default '{}',
    rating            double precision,
    downloads         integer not null default 0,
    status            text not null check (status in ('DRAFT', 'UNDER_REVIEW', 'APPROVED', 'REJECTED', 'DEPRECATED')),
    runtime           text,             -- built-in skill served by deployments/agents (news2, qsofa, vitals_trend)
    documentation_url text,
    support_email     text,
    review_notes      text,
    created_at        timestamptz not null default now(),
    updated_at        timestamptz not null default now()
);
create index assets_type on assets (type, status);
create index assets_category on assets (category);
create index assets_status on assets (status, created_at desc, id);
create index assets_rating on assets (rating);
create index assets_badges on assets using gin (badges);
create index assets_fhir on assets using gin (fhir_resources);
create index assets_publisher on assets (publisher_id);

create table installations (
    id           text primary key,
    org_id       text not null references organizations (id),
    project_id   text not null references projects (id),
    asset_id     text not null references assets (id),
    status       text not null default 'installed',
    config       jsonb,
    installed_at timestamptz not null default now()
);
create index installations_project on installations (project_id, installed_at);
create index installations_asset on installations (asset_id);

create table deployments (
    id              text primary key,
    org_id          text not null references organizations (id),
    project_id      text not null references projects (id),
    installation_id text not null references installations (id),
    environment     text not null,
    status          text not null check (status in ('PENDING', 'RUNNING', 'DEGRADED', 'STOPPED', 'FAILED')),
    status_reason   text,
    replicas        integer not null default 1 check (replicas between 1 and 16),
    endpoint        text,
    hipaa_mode      boolean not null default false,
    deployed_at     timestamptz not null default now(),
    updated_at      timestamptz not null default now()
);
create index deployments_project on deployments (project_id, deployed_at);
create index deployments_installation on deployments (installation_id);
create index deployments_status on deployments (status) where status in ('PENDING', 'RUNNING', 'DEGRADED');

create table agents (
    id              text primary key,
    org_id          text not null references organizations (id),
    project_id      text not null references projects (id),
    name            text not null,
    description     text not null default '',
    run_mode        text not null default 'sync' check (run_mode in ('sync', 'async')),
    status          text not null default 'active',
    skill           text not null default 'news2',
    installation_id text references installations (id),
    created_at      timestamptz not null default now()
);
create index agents_project on agents (project_id, created_at);

create table patients (
    id          text primary key,
    org_id      text not null references organizations (id),
    synthetic   boolean not null default true,
    name        jsonb not null default '[]',
    gender      text,
    birth_date  text,
    address     jsonb,
    telecom     jsonb,
    risk_level  text,
    programs    text[] not null default '{}',
    resource    jsonb,                -- the FHIR Patient as last written, for REST reads
    created_at  timestamptz not null default now(),
    updated_at  timestamptz not null default now()
);
create index patients_org on patients (org_id, id);
create index patients_risk on patients (org_id, risk_level);
create index patients_programs on patients using gin (programs);

create table agent_sessions (
    id           text primary key,
    org_id       text not null references organizations (id),
    project_id   text not null references projects (id),
    agent_id     text not null references agents (id),
    patient_id   text not null,
    status       text not null check (status in ('QUEUED', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED')),
    input        jsonb,
    output       jsonb,
    error        text,
    latency_ms   integer,
    tokens_used  integer,
    started_at   timestamptz not null default now(),
    completed_at timestamptz,
    updated_at   timestamptz not null default now()
);
create index agent_sessions_agent on agent_sessions (agent_id, started_at desc);
create index agent_sessions_open on agent_sessions (status) where status in ('QUEUED', 'RUNNING');

create table workflows (
    id          text primary key,
    org_id      text not null references organizations (id),
    project_id  text not null references projects (id),
    name        text not null,
    description text not null default '',
    status      text not null default 'ACTIVE' check (status in ('ACTIVE', 'PAUSED', 'ARCHIVED')),
    steps       text[] not null,
    triggers    text[] not null default '{}',
    created_at  timestamptz not null default now(),
    updated_at  timestamptz not null default now()
);
create index workflows_project on workflows (project_id, created_at);

create table workflow_runs (
    id           text primary key,
    org_id       text not null references organizations (id),
    project_id   text not null references projects (id),
    workflow_id  text not null references workflows (id),
    status       text not null check (status in ('QUEUED', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED')),
    trigger      text not null default 'manual',
    input        jsonb,
    output       jsonb,
    error        text,
    duration_ms  integer,
    started_at   timestamptz not null default now(),
    completed_at timestamptz,
    updated_at   timestamptz not null default now()
);
create index workflow_runs_workflow on workflow_runs (workflow_id, started_at desc);
create index workflow_runs_open on workflow_runs (status) where status in ('QUEUED', 'RUNNING');

-- FHIR Observations. loinc is the first LOINC coding, denormalized for the per-code lookups agents
-- and the REST reads make; value/unit mirror valueQuantity.
create table observations (
    id           text primary key,
    org_id       text not null references organizations (id),
    patient_id   text not null references patients (id),
    status       text not null,
    code         jsonb not null,
    loinc        text,
    subject      jsonb not null,
    value        double precision,
    unit         text,
    effective_at timestamptz,
    device_type  text,
    resource     jsonb,
    received_at  timestamptz,
    stored_at    timestamptz not null default now()
);
create index observations_patient on observations (patient_id, effective_at desc, id);
create index observations_patient_code on observations (patient_id, loinc, effective_at desc);

create table encounters (
    id          text primary key,
    org_id      text not null references organizations (id),
    patient_id  text not null references patients (id),
    status      text not null,
    class       jsonb not null,
    subject     jsonb not null,
    period      jsonb,
    created_at  timestamptz not null default now()
);
create index encounters_patient on encounters (patient_id, created_at desc);

create table webhooks (
    id                         text primary key,
    org_id                     text not null references organizations (id),
    project_id                 text not null references projects (id),
    url                        text not null,
    events                     text[] not null,
    status                     text not null default 'active' check (status in ('active', 'paused', 'failing', 'disabled')),
    secret                     text not null,
    previous_secret            text,
    previous_secret_expires_at timestamptz,
    failure_count              integer not null default 0,
    last_delivered_at          timestamptz,
    deleted_at                 timestamptz,
    created_at                 timestamptz not null default now(),
    updated_at                 timestamptz not null default now()
);
create index webhooks_project on webhooks (project_id, created_at) where deleted_at is null;

-- Transactional outbox: a service writes its entity change and its events here in one
-- transaction; the relay publishes unsent rows in seq order and marks them sent after the broker
-- acknowledges.
create table outbox (
    seq        bigserial primary key,
    event_id   text not null unique,
    topic      text not null,
    key        text not null,
    value      jsonb not null,
    created_at timestamptz not null default now(),
    sent_at    timestamptz
);
create index outbox_unsent on outbox (seq) where sent_at is null;

-- Idempotency-Key replay (DECISIONS §3): per credential's organization, 24 h.
create table idempotency_keys (
    org_id        text not null,
    key           text not null,
    request_hash  bytea not null,
    status_code   integer,
    response      bytea,
    created_at    timestamptz not null default now(),
    primary key (org_id, key)
);
create index idempotency_keys_created on idempotency_keys (created_at);
