-- Model artifacts (issue 54; processors/marketplace models.go). A MODEL asset's version can carry
-- a model that carehub serves itself: an ONNX file, checked loadable by the embedded ONNX Runtime
-- when it is attached, stored once by its SHA-256 (content-addressed) and immutable: a version
-- keeps the model it was given, and a new model is a new version.
create table model_artifacts (
    sha256      text primary key,              -- lowercase hex of the file's SHA-256
    format      text not null check (format in ('onnx')),
    size_bytes  bigint not null,
    signature   jsonb not null,                -- inputs and outputs (name, element type, shape), metadata
    content     bytea not null,
    created_at  timestamptz not null default now()
);

create table asset_models (
    asset_id    text not null references assets (id) on delete cascade,
    version     text not null,                 -- the asset's version when the model was attached
    sha256      text not null references model_artifacts (sha256),
    attached_by text not null,                 -- the API key id
    attached_at timestamptz not null default now(),
    primary key (asset_id, version)
);
