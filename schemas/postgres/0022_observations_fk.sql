-- The observation writer's hot path (issue 20, processors/observations). The two foreign keys of
-- observations ran a lookup and a row lock on organizations and on patients for every row the
-- writer copies: about 40 % of Postgres's time storing a chunk. The writer now checks each
-- chunk's patients once, in the chunk's transaction (select … for key share: the lock the foreign
-- key took, so a concurrent delete of the patient waits for the chunk), and stores an
-- observation only when its patient exists and belongs to its organization; organizations
-- follow through patients.org_id. What the keys also gave, that a patient with observations
-- cannot be deleted, this trigger keeps, at the cost of one index probe per deleted patient.
alter table observations
    drop constraint observations_org_id_fkey,
    drop constraint observations_patient_id_fkey;

create function patients_keep_observed() returns trigger
language plpgsql as $$
begin
    if exists (select 1 from observations o join deleted_patients d on o.patient_id = d.id) then
        raise foreign_key_violation using
            message = 'delete on table "patients" violates the observations of a patient',
            detail = 'Observations still refer to a deleted patient.';
    end if;
    return null;
end
$$;

create trigger patients_keep_observed after delete on patients
    referencing old table as deleted_patients
    for each statement execute function patients_keep_observed();
