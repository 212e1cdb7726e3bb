-- Webhook signing secrets sealed at rest (processors/webhooks/seal.go). A secret is sealed with
-- AES-GCM under a key derived from the node's server sealing key (kernel/sealing), which never
-- enters the database, with the subscription's id as associated data: a reader of the database
-- learns no secret, and a sealed secret copied into another row does not open there.
--
-- SQL cannot seal, so the secrets stored in clear before this migration stay in secret and
-- previous_secret until a node starts: it seals them into the new columns and clears the old
-- ones (webhooks.SealStoredSecrets). New rows are written sealed only. A row has a current secret
-- in one form or the other.
alter table webhooks
    alter column secret drop not null,
    add column secret_sealed          bytea,
    add column previous_secret_sealed bytea,
    add constraint webhooks_secret_present check (secret is not null or secret_sealed is not null);
