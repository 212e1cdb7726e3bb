-- Whether an event's payload may name a patient, worked out once when the event is stored. The
-- analysts' statistics redact the payload values of such events for readers who may not see
-- patients (issue 51, finding 8), and tested every row's payload as text on every query: an
-- hour of large events made each statistics query read and match gigabytes, and a loop of them
-- took the store's CPU from every tenant (issue 51's soak). The rule is the same: a key or value
-- that spells "patient" or "subject", whatever its case and however its key was escaped
-- (jsonb's text form decodes escapes). Adding a stored generated column rewrites the table once.
alter table event_log
    add column names_patient boolean generated always as (payload::text ~* '(patient|subject)') stored;
