-- The newest observation of a code for a patient (the agents' skills, LLM agents' facts, the
-- workflow step latest_vitals, models scoring the stream: processors/agents Latest) is one
-- index probe per (patient, code) when the index orders ties of effective_at by id, as those
-- reads do. Without id, a patient whose readings share a timestamp (a device's batch) was read
-- whole on every probe, and `distinct on` read every reading of the patient: the scorer's
-- batch read grew with the history it scored (issue 54).
create index observations_patient_code_latest on observations (patient_id, loinc, effective_at desc, id desc);
drop index observations_patient_code;
