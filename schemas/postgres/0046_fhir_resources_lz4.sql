-- A generic resource (a Synthea Claim, ExplanationOfBenefit, Encounter …) is often past TOAST's
-- 2 KB threshold, and pglz, TOAST's default, was the largest single part of Postgres's time in a
-- transaction import: 15 % of it, compressing each resource twice (the current row and its
-- version). lz4 compresses at several times pglz's speed. Where the server has no lz4, pglz
-- stays. Values stored before keep their compression until they are rewritten.
do $$
begin
    alter table fhir_resources alter column resource set compression lz4;
    alter table fhir_resource_versions alter column resource set compression lz4;
exception when feature_not_supported or invalid_parameter_value then
    null;
end
$$;
