-- FHIR versions of patients (the FHIR base's vread and _history, api/fhir). version_id counts the
-- writes of a patient (create is 1, each update adds 1); patient_versions keeps every version as
-- it was served (the rendered FHIR Patient). Patients written before this migration are at
-- version 1 with no stored version: vread of version 1 serves them as they are now.
alter table patients add column version_id integer not null default 1;

create table patient_versions (
    patient_id  text not null references patients (id),
    version_id  integer not null,
    resource    jsonb not null,
    updated_at  timestamptz not null,
    primary key (patient_id, version_id)
);
