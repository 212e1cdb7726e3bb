-- Device observation ingest (ingest/observations, processors/observations, DECISIONS §3 and §7).
--
-- Idempotency-Key replay for POST /v1/observations. The generic idempotency_keys table of
-- 0001_core is keyed and filled by a middleware that buffers the request; observation intake
-- streams bodies of up to 16 MiB (NDJSON) and must reserve the key before it has read the body,
-- so it keeps keys of its own here: a row is reserved (status_code null, locked_until set) when a
-- request with a new key starts, and completed with the request hash and the answer when it
-- ends. A reservation whose request died (locked_until passed) or a row older than 24 h is taken
-- over by the next request with the same key; the sweeper deletes rows older than 24 h.
create table ingest_idempotency (
    org_id       text not null,               -- '' for the platform operator
    key          text not null,
    request_hash bytea,                       -- SHA-256 of content type and body; null while reserved
    status_code  integer,                     -- null while reserved
    response     bytea,                       -- the JSON body answered
    locked_until timestamptz,                 -- lease of the request in progress
    created_at   timestamptz not null default now(),
    primary key (org_id, key)
);
create index ingest_idempotency_created on ingest_idempotency (created_at);

