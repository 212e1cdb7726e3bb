-- A model fetched from a URL (issue 54; processors/marketplace fetch.go) records where it came
-- from; its content is pinned by the sha256 the publisher gave, as an uploaded one is by its own.
alter table asset_models add column source_url text;
