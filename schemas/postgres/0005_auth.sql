-- JWT signing keys: at most one active (unretired) key at a time, so nodes that start together
-- and each find none can all insert one with ON CONFLICT DO NOTHING and agree on the survivor.
-- Retired keys still verify tokens for one token lifetime after retired_at, then can be deleted.
create unique index jwt_signing_keys_one_active on jwt_signing_keys ((true)) where retired_at is null;
