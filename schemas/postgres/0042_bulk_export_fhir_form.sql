-- Bulk Data files are written in the FHIR base's JSON form by the runner (kernel/fhirjson), so a
-- download serves them as stored. Files written before hold the stores' own form and are put in
-- FHIR form when they are read, until their retention ends.
alter table bulk_export_files add column fhir_form boolean not null default false;
