-- Patient data on webhooks (DECISIONS §2, processors/phi). A subscription carries patient fields
-- only as far as the credential that last configured it (created or updated it) could read them:
-- patient_scopes holds the patient scopes that credential held (read:patients,
-- read:observations) and patient_mode its mode (a test credential: synthetic patients only). The
-- dispatcher decides what each attempt sends from these columns, so a subscription re-pointed by
-- a credential that may not read patient data never sends any, not even of deliveries recorded
-- before the change.
--
-- Subscriptions made before this migration have no record of who made them: they default to no
-- patient scopes (every delivery redacted) until a credential that may read patient data updates
-- them. Failing closed costs a receiver patient fields until an administrator re-saves its
-- subscription; failing open would keep sending patient data on a grant nobody can vouch for.
alter table webhooks
    add column patient_scopes text[] not null default '{}',
    add column patient_mode   text   not null default 'test' check (patient_mode in ('live', 'test'));
