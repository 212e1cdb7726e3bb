-- Every FHIR R4 resource type beyond the typed four (issue 52, docs/FHIR.md "Resource types beyond
-- the typed four"; processors/patients/resources.go). Patient and Observation keep their typed
-- tables: Observations are the hot device path (intake, Kafka, the writer's COPY) and Patients
-- carry carehub's own columns (risk level, programs). Everything else a clinical record holds
-- (Encounter, Condition, Procedure, MedicationRequest, Claim, …, and the directory resources
-- Organization, Practitioner, Location, Medication) is one generic store: the resource as
-- served in jsonb, and beside it the values its common search parameters read, extracted on
-- write into plain columns and arrays so that every search is an index lookup, not a jsonb walk.
--
-- A row belongs to one organization (tenancy) and, for patient data, to one patient: patient_id
-- is the Patient it is about (subject, patient, beneficiary), and synthetic is that patient's
-- flag (a patient's flag never changes), so test mode needs no join. Directory resources have no
-- patient; their synthetic flag is the writer's mode (a test key's writes are test data).
-- Ids are unique per organization and type: PUT may create a resource under an id the client
-- chose, and one tenant's id must neither block nor reveal another's.
create table fhir_resources (
    org_id        text not null references organizations (id),
    type          text not null,
    id            text not null,
    version_id    integer not null default 1,
    synthetic     boolean not null,
    patient_id    text references patients (id),
    resource      jsonb not null,          -- as served: id, meta.versionId, meta.lastUpdated set
    last_updated  timestamptz not null,
    deleted       boolean not null default false,
    -- Extracted search values (tokens are 'system|code', and '|code' for any system).
    refs          text[] not null default '{}',  -- every relative reference it holds: 'Type/id'
    codes         text[] not null default '{}',  -- code (or the type's code element)
    categories    text[] not null default '{}',  -- category (Encounter: class)
    identifiers   text[] not null default '{}',  -- identifier
    status        text[] not null default '{}',  -- status, or the codes of clinicalStatus
    date_from     timestamptz,                   -- the type's date element as [from, to)
    date_to       timestamptz,
    primary key (org_id, type, id)
);
create index fhir_resources_patient on fhir_resources (patient_id, type, last_updated) where patient_id is not null;
create index fhir_resources_updated on fhir_resources (org_id, type, last_updated, id);
create index fhir_resources_date on fhir_resources (org_id, type, date_from);
create index fhir_resources_refs on fhir_resources using gin (refs);
create index fhir_resources_codes on fhir_resources using gin (codes);
create index fhir_resources_categories on fhir_resources using gin (categories);
create index fhir_resources_identifiers on fhir_resources using gin (identifiers);

-- Every version as it was served (vread, _history); a deletion is a version without a resource
-- (the row in fhir_resources stays, deleted, so that its id and history remain). The current
-- version is also in fhir_resources.
create table fhir_resource_versions (
    org_id        text not null,
    type          text not null,
    id            text not null,
    version_id    integer not null,
    resource      jsonb,
    last_updated  timestamptz not null,
    deleted       boolean not null default false,
    check (deleted = (resource is null)),
    primary key (org_id, type, id, version_id),
    foreign key (org_id, type, id) references fhir_resources (org_id, type, id) on delete cascade
);

-- The encounters carehub's integrations and demo data write (the typed table, read by GraphQL)
-- in the generic store's shape, so that FHIR Encounter reads and searches see them beside the
-- Encounters written on the FHIR base.
create view fhir_typed_encounters as
select e.org_id, 'Encounter'::text as type, e.id, 1 as version_id, p.synthetic, e.patient_id,
       jsonb_strip_nulls(jsonb_build_object('resourceType', 'Encounter', 'id', e.id, 'status', e.status,
           'class', e.class, 'subject', e.subject, 'period', e.period,
           'meta', jsonb_build_object('versionId', '1',
               'lastUpdated', to_char(e.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')))) as resource,
       e.created_at as last_updated, false as deleted,
       array['Patient/' || e.patient_id] as refs, '{}'::text[] as codes,
       array_remove(array[(e.class->>'system') || '|' || (e.class->>'code'), '|' || (e.class->>'code')], null) as categories,
       '{}'::text[] as identifiers, array[e.status] as status,
       (e.period->>'start')::timestamptz as date_from,
       coalesce((e.period->>'end')::timestamptz, 'infinity'::timestamptz) as date_to
from encounters e join patients p on p.id = e.patient_id;
