-- Time-ordered indexes of the tables written at stream speed, in ascending order.
--
-- Rows arrive in time order, so each new entry of an index led by (group, time desc, id desc)
-- goes before every other entry of its group, to the left of where the last one went. A b-tree
-- leaf that fills up splits in half, and the left half, which takes the next entries, splits
-- again: the right half is never written to again. After one subscription's webhook load,
-- event_log_project was 50.6 % full and webhook_deliveries_webhook 51.7 %, against 85-90 % for
-- the ascending indexes beside them (pgstattuple). Twice the pages meant twice the page splits,
-- each logged with half a page, and twice the new pages the files grow by.
--
-- In ascending order the entries go to their group's right end. Postgres packs the rightmost
-- leaf of an index to its fillfactor (90 %) when it splits, so the index led by time alone
-- (audit_log_time) and the group that sorts last in the others (an installation's only project,
-- organization or subscription, or the newest subscription, ids being ULIDs) fill their pages.
-- A busy group in the middle of the key range still splits in half, as before: Postgres packs
-- such a range only for entries no wider than two int8s (nbtsplitloc.c, _bt_afternewitemoff).
-- Nothing is worse either way. A b-tree is read in both directions, so the pages newest first
-- (order by created_at desc, id desc) read these indexes backwards, and every query keeps its
-- plan (TestQueryEventsPlans).
--
-- Rebuilding an index holds the table's writes until it is built (this file runs in one
-- transaction). All three tables are written by Kafka consumers (the event log's, the audit
-- log's, the webhook dispatcher's), which wait and then go on from their committed offsets; a
-- redelivery asked for over the API waits with them. Where the event log and the audit log
-- live in ClickHouse these two Postgres tables are empty; webhook_deliveries holds the
-- deliveries of its retention period in every installation.

drop index event_log_project;
create index event_log_project on event_log (project_id, created_at, id) include (org_id);
drop index event_log_project_type;
create index event_log_project_type on event_log (project_id, type, created_at, id) include (org_id);
drop index event_log_patient;
create index event_log_patient on event_log (project_id, (payload->>'patientId'), created_at, id)
    where (payload->>'patientId') is not null;
drop index event_log_agent;
create index event_log_agent on event_log (project_id, (payload->>'agentId'), created_at, id)
    where (payload->>'agentId') is not null;
drop index event_log_workflow;
create index event_log_workflow on event_log (project_id, (coalesce(payload->>'workflowId', payload->>'workflow_id')), created_at, id)
    where (coalesce(payload->>'workflowId', payload->>'workflow_id')) is not null;
drop index event_log_deployment;
create index event_log_deployment on event_log (project_id, (payload->>'deploymentId'), created_at, id)
    where (payload->>'deploymentId') is not null;

drop index audit_log_org_time;
create index audit_log_org_time on audit_log (org_id, time, id);
drop index audit_log_key_time;
create index audit_log_key_time on audit_log (key_id, time, id);
drop index audit_log_operation_time;
create index audit_log_operation_time on audit_log (operation, time, id);
drop index audit_log_time;
create index audit_log_time on audit_log (time, id);
drop index audit_log_auth_failures;
create index audit_log_auth_failures on audit_log (time, id) where auth_failure <> '';

drop index webhook_deliveries_webhook;
create index webhook_deliveries_webhook on webhook_deliveries (webhook_id, created_at, id);
