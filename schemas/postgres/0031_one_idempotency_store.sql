-- One owner for Idempotency-Key (storage/idempotency, issue 53): the observation intake's keys
-- move into idempotency_keys. The intake streams bodies of up to 16 MiB and reserves its key
-- before it has read the body, so a row may now be claimed before its request's hash is known:
-- request_hash is null while such a reservation runs, and set with the answer.
--
-- ingest_idempotency kept the key and the answer in plain text, per organization; its rows cannot
-- be carried over (idempotency_keys names a key by a hash derived from the key, the credential and
-- the server sealing key). Dropping it forgets the observation keys of the last 24 hours: a
-- client retrying across the upgrade with a key it used before runs its request again (readings
-- that carry a device identifier are still stored once: the observation writer's client-id rule).
alter table idempotency_keys alter column request_hash drop not null;
drop table ingest_idempotency;
