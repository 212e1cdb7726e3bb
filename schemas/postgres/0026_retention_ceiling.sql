-- A ceiling on retention days (docs/SECURITY.md, "Retention arithmetic"): 100 years, as
-- processors/retention.MaxDays. A larger number put the purge's cut-off outside the stores' time
-- range, where it wrapped around into the future. NOT VALID: rows written before keep working
-- (the job holds their days to the ceiling); every new write is checked.
alter table org_retention
    add constraint org_retention_event_days_max check (event_days <= 36500) not valid,
    add constraint org_retention_audit_days_max check (audit_days <= 36500) not valid;
