-- Analysts' queries on the event log (issue 17): resource filters, organization-wide ranges and
-- per-organization retention (EventLog.PurgeEvents).
--
-- Resource filters match the ids an event's payload names. Each has an expression index led by
-- the project and ordered as pages are, so a page of one patient's (agent's, workflow's,
-- deployment's) events reads only its rows; partial on the id being present, which a filter
-- `expr = $1` implies, so events that name no such resource cost nothing.
create index event_log_patient on event_log (project_id, (payload->>'patientId'), created_at desc, id desc)
    where (payload->>'patientId') is not null;
create index event_log_agent on event_log (project_id, (payload->>'agentId'), created_at desc, id desc)
    where (payload->>'agentId') is not null;
create index event_log_workflow on event_log (project_id, (coalesce(payload->>'workflowId', payload->>'workflow_id')), created_at desc, id desc)
    where (coalesce(payload->>'workflowId', payload->>'workflow_id')) is not null;
create index event_log_deployment on event_log (project_id, (payload->>'deploymentId'), created_at desc, id desc)
    where (payload->>'deploymentId') is not null;

-- Organization-wide aggregations over a time range, and retention (a batched DELETE of one
-- organization's oldest rows).
create index event_log_org_time on event_log (org_id, created_at);
