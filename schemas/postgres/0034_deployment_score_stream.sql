-- Models on the stream (issue 54; processors/deployments scorer.go): a deployment whose model
-- scores its organization's observations as they arrive, emitting deployment.prediction events.
alter table deployments add column score_stream boolean not null default false;
