-- FHIR topic-based Subscriptions, the R4 backport (issue 57; processors/fhirsubs). A subscription
-- names a topic of carehub's catalogue, its filters and a channel; the notifier, a consumer group
-- on the events topic, numbers each matching event per subscription (fhir_subscription_counters)
-- and keeps it in fhir_subscription_events, where $events reads it back and the deliverer sends
-- it. The creator's key, mode and scopes are kept: notifications carry what that credential may
-- read. The counter has a table of its own so that numbering and delivery, which update their
-- rows hundreds of times a second, never wait on each other's row locks.
create table fhir_subscriptions (
    id                 text primary key,
    org_id             text        not null references organizations (id),
    key_id             text        not null,
    mode               text        not null check (mode in ('live', 'test')),
    scopes             text[]      not null,
    topic              text        not null,
    filters            jsonb       not null default '{}', -- {"patient": "pat_…", "code": "8867-4"}
    criteria           text        not null default '',   -- the filter criteria as written
    reason             text        not null default '',
    channel            text        not null check (channel in ('rest-hook', 'websocket')),
    endpoint           text        not null default '',
    headers            bytea,                             -- channel.header, sealed (they hold credentials)
    secret             bytea,                             -- the whsec_ signing secret, sealed
    content            text        not null check (content in ('empty', 'id-only', 'full-resource')),
    heartbeat_seconds  integer     not null default 0,
    timeout_seconds    integer     not null default 10,
    max_count          integer     not null default 20,
    status             text        not null check (status in ('requested', 'active', 'error', 'off')),
    delivered_through  bigint      not null default 0,    -- rest-hook: the last event a receiver took
    failures           integer     not null default 0,    -- consecutive failed attempts
    last_error         text        not null default '',
    next_attempt_at    timestamptz not null default now(),
    last_sent_at       timestamptz,
    lease_until        timestamptz,
    created_at         timestamptz not null default now(),
    deleted_at         timestamptz
);
create index fhir_subscriptions_org on fhir_subscriptions (org_id, created_at) where deleted_at is null;
-- The deliverer's work: rest-hook subscriptions with a handshake, events or a heartbeat due.
create index fhir_subscriptions_due on fhir_subscriptions (next_attempt_at)
    where deleted_at is null and channel = 'rest-hook' and status <> 'off';

-- events_since_start: the number of the last event numbered.
create table fhir_subscription_counters (
    subscription_id    text   primary key references fhir_subscriptions (id) on delete cascade,
    events_since_start bigint not null default 0
);

-- Bumped in the transaction that creates or deletes a subscription: the notifier reloads its
-- copy when this changed, not before every batch.
create table fhir_subscription_generation (
    one        boolean primary key default true check (one),
    generation bigint  not null
);
insert into fhir_subscription_generation (generation) values (0);

create table fhir_subscription_events (
    subscription_id text        not null references fhir_subscriptions (id) on delete cascade,
    number          bigint      not null,
    event_id        text        not null,  -- the platform event it came from: numbered once
    focus_type      text        not null,
    focus_id        text        not null,
    patient_id      text        not null,
    occurred_at     timestamptz not null,
    primary key (subscription_id, number),
    unique (subscription_id, event_id)
);
-- The sweep's: events past the retention (processors/fhirsubs/sweep.go).
create index fhir_subscription_events_age on fhir_subscription_events (occurred_at);
