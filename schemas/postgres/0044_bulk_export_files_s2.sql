-- A part is now stored as the runner compressed it (S2's block format, klauspost/compress/s2),
-- and expanded when it is downloaded. Stored as NDJSON, even with TOAST's lz4, its bytes were
-- the larger part of an export's Postgres time beyond the stores' own read: a Synthea part of
-- 16 MiB is about 1 MiB in S2, which costs the runner about half a millisecond a MiB. Parts
-- stored before stay as they are ('identity') until their retention ends.
alter table bulk_export_files add column coding text not null default 'identity'
    check (coding in ('identity', 's2'));

-- Compressed already: TOAST is not to try again.
alter table bulk_export_files alter column ndjson set storage external;
