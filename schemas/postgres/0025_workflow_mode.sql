-- The mode of the credential that created a workflow (docs/SECURITY.md, "Test mode through
-- triggers"). A run an event triggers has no caller, so it takes this mode: a workflow a test
-- key created runs in test mode and reaches only synthetic patients. Workflows created before
-- this column existed keep 'live', the mode their triggered runs always had.
alter table workflows
    add column mode text not null default 'live' check (mode in ('live', 'test'));
