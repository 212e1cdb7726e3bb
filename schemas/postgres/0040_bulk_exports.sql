-- FHIR Bulk Data exports (issue 57; processors/patients bulk.go): a kick-off makes a job, a runner
-- on a processors node writes its NDJSON files part by part, each part with the job's position
-- in one transaction, so a node killed mid-export leaves a job the next runner resumes where the
-- last part ended. The requester's credential is kept by id and its scopes as asked; the runner
-- checks the key is still usable before each part.
create table bulk_exports (
    id               text primary key,
    org_id           text        not null,
    key_id           text        not null,
    mode             text        not null,
    scopes           text[]      not null,
    level            text        not null check (level in ('system', 'patient', 'group')),
    group_id         text,
    patients         text[],                          -- a Group export's members, read at kick-off
    request          text        not null,
    types            text[]      not null,            -- the types to export, in order
    filters          jsonb       not null default '{}', -- _typeFilter: type → the parsed search
    since            timestamptz,
    transaction_time timestamptz not null,
    status           text        not null default 'in-progress'
        check (status in ('in-progress', 'completed', 'failed', 'cancelled')),
    position         jsonb       not null default '{}', -- {"type": index in types, "after": keyset position}
    written          bigint      not null default 0,    -- resources written so far
    omitted          text[]      not null default '{}', -- types the credential may not read
    error            text,
    lease_until      timestamptz,
    created_at       timestamptz not null default now(),
    completed_at     timestamptz,
    expires_at       timestamptz
);
create index bulk_exports_pending on bulk_exports (created_at) where status = 'in-progress';
create index bulk_exports_expiry on bulk_exports (expires_at) where expires_at is not null;

create table bulk_export_files (
    export_id   text    not null references bulk_exports (id) on delete cascade,
    type        text    not null,
    part        integer not null,
    count       integer not null,
    patient_ids text[]  not null, -- the patients the part holds: its download's audit record names them
    ndjson      bytea   not null,
    primary key (export_id, type, part)
);
