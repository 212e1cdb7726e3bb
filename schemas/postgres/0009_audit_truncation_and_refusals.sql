-- Audit records state what they leave out and record refused credentials (issue 13).
--
-- A record keeps at most 10,000 patient ids and 1,000 other ids (processors/access/recorder.go).
-- truncated says a call touched more; the *_omitted columns count the distinct ids left out
-- (exact up to ten times the cap, a lower bound beyond).
--
-- A refused credential (401) is recorded too: auth_failure says why (missing, malformed,
-- unknown_key, revoked, expired, invalid_token) and credential names what was presented without
-- the secret (a key's prefix and last four, or "jwt"). Such records carry the key's organization
-- when the key exists, '' otherwise (the platform operator's view).
alter table audit_log
    add column truncated            boolean not null default false,
    add column patient_ids_omitted  integer not null default 0,
    add column resource_ids_omitted integer not null default 0,
    add column auth_failure         text not null default '',
    add column credential           text not null default '';

-- Failed authentications are looked for on their own (an attack in progress, a client still
-- using a revoked key); they are rare, so a partial index stays small.
create index audit_log_auth_failures on audit_log (time desc, id desc) where auth_failure <> '';
