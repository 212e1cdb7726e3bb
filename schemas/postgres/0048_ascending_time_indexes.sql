-- Time-ordered indexes of the tables written at stream speed, in ascending order.
--
-- Their rows arrive in time order, so each new entry of an index led by (group, time desc, id
-- desc) goes before every other entry of its group: to the left of the page it lands on. A
-- b-tree page that fills up is split in half unless the entry goes at its right end (the
-- rightmost page, or a group's ever-increasing tail, nbtsplitloc.c), so these indexes stayed
-- half full: after one webhook load, event_log_project 50.6 % and webhook_deliveries_webhook
-- 51.7 % of their leaf pages used, against 85-90 % for the ascending ones beside them
-- (pgstattuple). Twice the pages meant twice the page splits, each one logged with half a page,
-- and twice the new pages the table's files grow by.
--
-- In ascending order the same entries go to their group's right end. A b-tree is read in
-- either direction, so the pages newest first (order by created_at desc, id desc) read the same
-- index backwards, and every query keeps its plan.
--
-- Rebuilding an index holds the table's writes until it is built (this file runs in one
-- transaction). All three tables are written by Kafka consumers (the event log's, the audit
-- log's, the webhook dispatcher's), which wait and then go on from their committed offsets; a
-- redelivery asked for over the API waits with them. A production event log lives in
-- ClickHouse, so there these Postgres tables are small.

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
