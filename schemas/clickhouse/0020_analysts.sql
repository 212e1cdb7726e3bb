-- Analysts' queries on the event log (issue 17). Kept in a file of its own, after whatever the
-- table layout files (0001…) make of event_log: every statement here is idempotent and adds
-- columns and skip indexes only, so it applies to any sorting key or partitioning.
--
-- Resource ids, status and run time are read out of the JSON payload once, when a part is
-- written (MATERIALIZED: not in SELECT *, computed from payload for parts written before this
-- file), instead of parsing every payload of a range on every query.
ALTER TABLE event_log ADD COLUMN IF NOT EXISTS patient_id String MATERIALIZED JSONExtractString(payload, 'patientId') CODEC(ZSTD(1));
ALTER TABLE event_log ADD COLUMN IF NOT EXISTS agent_id String MATERIALIZED JSONExtractString(payload, 'agentId') CODEC(ZSTD(1));
ALTER TABLE event_log ADD COLUMN IF NOT EXISTS workflow_id String MATERIALIZED if(JSONHas(payload, 'workflowId'), JSONExtractString(payload, 'workflowId'), JSONExtractString(payload, 'workflow_id')) CODEC(ZSTD(1));
ALTER TABLE event_log ADD COLUMN IF NOT EXISTS deployment_id String MATERIALIZED JSONExtractString(payload, 'deploymentId') CODEC(ZSTD(1));
ALTER TABLE event_log ADD COLUMN IF NOT EXISTS status LowCardinality(String) MATERIALIZED JSONExtractString(payload, 'status');
-- The run time in milliseconds: latencyMs (agent sessions), durationMs or duration_ms (workflow
-- runs) when the field is a JSON number, else NULL (not measured).
ALTER TABLE event_log ADD COLUMN IF NOT EXISTS run_ms Nullable(Float64) MATERIALIZED multiIf(JSONType(payload, 'latencyMs') IN ('Int64', 'UInt64', 'Double'), JSONExtractFloat(payload, 'latencyMs'), JSONType(payload, 'durationMs') IN ('Int64', 'UInt64', 'Double'), JSONExtractFloat(payload, 'durationMs'), JSONType(payload, 'duration_ms') IN ('Int64', 'UInt64', 'Double'), JSONExtractFloat(payload, 'duration_ms'), NULL);
-- A resource filter reads only the granules that hold its id.
ALTER TABLE event_log ADD INDEX IF NOT EXISTS event_log_patient patient_id TYPE bloom_filter GRANULARITY 1;
ALTER TABLE event_log ADD INDEX IF NOT EXISTS event_log_agent agent_id TYPE bloom_filter GRANULARITY 1;
ALTER TABLE event_log ADD INDEX IF NOT EXISTS event_log_workflow workflow_id TYPE bloom_filter GRANULARITY 1;
ALTER TABLE event_log ADD INDEX IF NOT EXISTS event_log_deployment deployment_id TYPE bloom_filter GRANULARITY 1;
