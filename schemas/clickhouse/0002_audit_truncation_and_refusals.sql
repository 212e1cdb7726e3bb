-- Audit records state what they leave out and record refused credentials; see
-- schemas/postgres/0009_audit_truncation_and_refusals.sql for the meaning of the columns.
ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS truncated Bool DEFAULT false;
ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS patient_ids_omitted UInt32 DEFAULT 0;
ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS resource_ids_omitted UInt32 DEFAULT 0;
ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS auth_failure LowCardinality(String) DEFAULT '';
ALTER TABLE audit_log ADD COLUMN IF NOT EXISTS credential String DEFAULT '';
