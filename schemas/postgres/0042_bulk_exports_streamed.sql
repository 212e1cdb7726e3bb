-- Bulk Data files are written in the FHIR base's JSON form by the runner (kernel/fhirjson), so a
-- download serves them as stored. Files written before hold the stores' own form and are put in
-- FHIR form when they are read, until their retention ends.
alter table bulk_export_files add column fhir_form boolean not null default false;

-- A part is up to 16 MiB of NDJSON, written once and read once: pglz, TOAST's default, spent
-- more time compressing and expanding it than the export spent reading the stores. lz4 where
-- the server has it (PostgreSQL 14 and later, built with it), no compression otherwise.
do $$
begin
    alter table bulk_export_files alter column ndjson set compression lz4;
exception when feature_not_supported or invalid_parameter_value then
    alter table bulk_export_files alter column ndjson set storage external;
end
$$;

-- The runner holding a job's lease: each of its writes names it, so a runner that lost its lease
-- (paused past it while another took the job up) writes nothing more of the job.
alter table bulk_exports add column lease_token text;
