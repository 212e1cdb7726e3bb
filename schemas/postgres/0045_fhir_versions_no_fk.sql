-- A version row is written by the statement after its resource's, in the same transaction, by
-- the one function that writes them (processors/patients store), and the only delete of a
-- resource (RemoveTransaction, the FHIR base's undo) deletes its versions in the same statement.
-- The foreign key protected nothing more, and its check was most of a Synthea transaction's
-- Postgres time: 26.8 of 38 s over 13,433 versions (pg_stat_statements), 2 ms a check against
-- 10 µs for the patients and organizations keys of the same rows. Its plan, cached by each
-- connection when the table was small, read the table rather than its key, so each check cost
-- more as the store grew. Without it a 4-client Synthea load stored 2.3 times as many Bundles.
alter table fhir_resource_versions drop constraint fhir_resource_versions_org_id_type_id_fkey;
