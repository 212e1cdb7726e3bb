-- LLM agents (issue 54; processors/agents llm.go): an agent whose skill is 'llm' sends its
-- instructions and the patient's context to the deployment it is bound to, an
-- OpenAI-compatible chat backend.
alter table agents add column deployment_id text references deployments (id),
    add column instructions text not null default '';
