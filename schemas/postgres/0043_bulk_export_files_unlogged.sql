-- A Bulk Data file is derived data, written once, read once or twice within its retention, and
-- made again from the stores at any time. WAL-logging it wrote each file twice (a 1,000-
-- patient export is hundreds of megabytes of NDJSON). Unlogged, a PostgreSQL crash or a failover to a
-- standby empties the table: a job whose files are fewer than it counted is run again from its
-- start (processors/patients bulk_lost.go), and its status answers in progress meanwhile.
alter table bulk_export_files set unlogged;
