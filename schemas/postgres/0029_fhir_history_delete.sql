-- FHIR history and delete (issue 52, api/fhir/history.go, processors/patients/history.go).
--
-- A deleted patient leaves the patients table, so that every reader of patients (REST, GraphQL,
-- agents, workflows, intake) stops seeing it without a filter of its own; what FHIR keeps of it
-- is its history: every version in patient_versions, ending in a tombstone (deleted, no
-- resource). The versions therefore carry the tenancy and test-mode columns the readers scope
-- by, and no longer reference patients. The keys of observations, encounters and reports stay:
-- a patient with clinical data is not deleted (409, FHIR's referential integrity).
alter table patient_versions
    drop constraint patient_versions_patient_id_fkey,
    add column org_id text,
    add column synthetic boolean,
    add column deleted boolean not null default false,
    alter column resource drop not null;

update patient_versions v set org_id = p.org_id, synthetic = p.synthetic from patients p where p.id = v.patient_id;

-- Writers of versions (processors/patients.recordVersion) name only the patient: the scope
-- columns follow from it.
create function patient_versions_scope() returns trigger
language plpgsql as $$
begin
    if new.org_id is null or new.synthetic is null then
        select p.org_id, p.synthetic into new.org_id, new.synthetic from patients p where p.id = new.patient_id;
    end if;
    return new;
end
$$;

create trigger patient_versions_scope before insert on patient_versions
    for each row execute function patient_versions_scope();

alter table patient_versions
    alter column org_id set not null,
    alter column synthetic set not null,
    add constraint patient_versions_tombstone check (deleted = (resource is null));

-- Type and system history: an organization's versions, newest first.
create index patient_versions_org_updated on patient_versions (org_id, updated_at desc);
