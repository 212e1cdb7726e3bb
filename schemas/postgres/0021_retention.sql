-- Per-organization retention of the event log and the audit log (issue 17). The platform operator
-- sets it (PUT /v1/organizations/{id}/retention); the retention job (processors/retention) purges
-- each organization's older rows from whichever store holds them. A null column keeps that log
-- forever; an organization without a row keeps both forever. The audit floor (six years, HIPAA)
-- is checked here too, so no writer can go below it.
create table org_retention (
    org_id      text primary key references organizations (id),
    event_days  integer check (event_days >= 1),
    audit_days  integer check (audit_days >= 2192),
    updated_at  timestamptz not null default now(),
    -- when the job last purged this organization, and what it removed (the operator's view)
    purged_at       timestamptz,
    events_purged   bigint not null default 0,
    audit_purged    bigint not null default 0
);
