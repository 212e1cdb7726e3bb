-- Idempotency-Key on every mutation (DECISIONS §3; processors/idempotency, api/idempotency).
--
-- The idempotency_keys table of 0001_core was never used; it is replaced. A key belongs to one
-- credential (organization and API key id, a JWT's parent key) so that two tenants, or two keys
-- of one tenant, never share or read each other's answers. The key itself is not stored: key_hash
-- is derived from it, and the recorded results and answer are sealed (AES-256-GCM) under another
-- key derived from it, so the table's rows reveal neither patient data nor the secrets that
-- create answers carry (API keys, webhook secrets) to whoever reads the database without the
-- client's Idempotency-Key.
--
-- A row is claimed by the request that runs the key (owner, with a lease it renews), answered
-- (status_code and response) when that request ends with an answer worth replaying, and taken
-- over by a retry with the same request when its request died before answering. Each
-- transaction the request commits writes its step row in the same transaction as its effect, so
-- a retry after a crash replays the steps that committed instead of repeating them. Rows older
-- than 24 hours are expired: a request treats them as absent and the sweeper deletes them.
drop table idempotency_keys;

create table idempotency_keys (
    org_id       text not null,             -- '' for the platform operator
    key_id       text not null,             -- the credential's API key id
    key_hash     bytea not null,            -- derived from the Idempotency-Key and the two above
    request_hash bytea not null,            -- SHA-256 of method, path, query and body
    owner        text,                      -- the running request's token; null when not running
    locked_until timestamptz,               -- that request's lease
    status_code  integer,                   -- null until answered
    response     bytea,                     -- the sealed answer (status, headers, body, resource ids)
    created_at   timestamptz not null default now(),
    primary key (org_id, key_id, key_hash)
);
create index idempotency_keys_created on idempotency_keys (created_at);

create table idempotency_steps (
    org_id   text not null,
    key_id   text not null,
    key_hash bytea not null,
    step     integer not null,              -- 0, 1, … in the order the request runs them
    result   bytea not null,                -- sealed: what the transaction returned to its caller
    primary key (org_id, key_id, key_hash, step),
    foreign key (org_id, key_id, key_hash) references idempotency_keys on delete cascade
);
