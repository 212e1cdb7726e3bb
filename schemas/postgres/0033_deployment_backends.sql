-- External inference servers (issue 54; processors/deployments backend.go). A deployment may send
-- its invocations to a server that speaks a standard protocol (the Open Inference Protocol v2:
-- KServe, Triton, MLServer, OpenVINO) instead of running a model itself. backend is
-- {protocol, url, model, version}; the Authorization header value the server wants is sealed
-- (AES-256-GCM under a key derived from the server sealing key, bound to the deployment's id), so
-- a reader of the database does not learn it.
alter table deployments add column backend jsonb, add column backend_credential bytea;
