-- Webhook deliveries and their attempts (processors/webhooks, DECISIONS §5).
--
-- One delivery per (subscription, event), written by the dispatcher's Kafka consumer before it
-- commits its offset; the unique key makes a re-consumed event a no-op. The delivery worker pool
-- claims due deliveries a subscription at a time ("lanes"), marks them delivering under a lease
-- held by the claiming dispatcher, and returns them to pending (with the next attempt time),
-- succeeded or failed as attempts finish. A dispatcher that dies mid-attempt leaves its rows
-- delivering with a lease that stops being renewed; the next claim after the lease expires
-- returns them to pending, so they are sent again, with the same webhook-id.

-- Subscription lookups by the dispatcher (per project, every non-deleted subscription) and by
-- the claimer (subscriptions that may be attempted).
create index webhooks_deliverable on webhooks (status) where deleted_at is null and status in ('active', 'failing');

create table webhook_deliveries (
    id              text primary key,                 -- dlv_ + ULID
    -- seq orders a subscription's deliveries as the dispatcher consumed their events (Kafka
    -- partition order, which is per project): lanes are sent in seq order.
    seq             bigint generated always as identity,
    org_id          text not null,
    webhook_id      text not null references webhooks (id),
    event_id        text not null,
    event_type      text not null,
    event_created_at timestamptz not null,
    -- The exact bytes that are signed and sent: {event, timestamp, org_id, project_id, payload}.
    -- bytea, not jsonb, because jsonb would re-serialize it and break the signature.
    body            bytea not null,
    status          text not null default 'pending'
                    check (status in ('pending', 'delivering', 'succeeded', 'failed', 'cancelled')),
    attempt_count   integer not null default 0,       -- attempts recorded, over every (re)delivery
    schedule_pos    integer not null default 0,       -- attempts in the current retry schedule
    next_attempt_at timestamptz not null default now(),
    lease_owner     text,                             -- the dispatcher holding a delivering row
    lease_until     timestamptz,
    last_attempt_at timestamptz,
    last_status_code integer,
    completed_at    timestamptz,                      -- when it became succeeded or failed
    created_at      timestamptz not null default now(),
    updated_at      timestamptz not null default now(),
    unique (webhook_id, event_id)
);
-- A lane: a subscription's due deliveries in order.
create index webhook_deliveries_lane on webhook_deliveries (webhook_id, seq) where status = 'pending';
-- Whether a subscription has a due delivery, and when its earliest one is due.
create index webhook_deliveries_due on webhook_deliveries (webhook_id, next_attempt_at) where status = 'pending';
-- Leases: lane exclusivity, renewal and expiry.
create index webhook_deliveries_leased on webhook_deliveries (webhook_id, lease_until) where status = 'delivering';
-- Listings, newest first, and Recover (failed since a time).
create index webhook_deliveries_webhook on webhook_deliveries (webhook_id, created_at desc, id desc);
-- Retention of finished deliveries.
create index webhook_deliveries_completed on webhook_deliveries (completed_at) where completed_at is not null;

create table webhook_attempts (
    id             text primary key,                  -- att_ + ULID
    delivery_id    text not null references webhook_deliveries (id) on delete cascade,
    webhook_id     text not null,
    org_id         text not null,
    status_code    integer,                           -- null when no response (refused, timeout)
    latency_ms     integer not null,
    error          text,
    response_body  text,                              -- trimmed to 1 KiB
    attempted_at   timestamptz not null default now()
);
create index webhook_attempts_delivery on webhook_attempts (delivery_id, attempted_at, id);
