// Package postgres is carehub's Postgres plumbing (the managed local cluster of the embedded
// default, the connection pool, the schema migrations) and the stores that live in Postgres
// alone whatever the deployment: API keys and JWT signing keys, and the Postgres event and audit
// log of the embedded default.
//
// File map:
//
//	local.go       StartLocal: a cluster under the data dir, run with the system's initdb/pg_ctl
//	local_dir.go   where that cluster lives when carehub runs as root (postgres user, traversal)
//	postmaster.go  postmaster.pid: readiness, stale lock files after a crash
//	proc_*.go      what /proc says about a postmaster: alive, zombie, or a reused pid
//	pool.go        Connect: pgxpool with carehub's settings
//	migrate.go     Migrate, Pending: schemas/postgres/*.sql, tracked in schema_migrations
//	apikeys.go     APIKeys: API keys stored as hashes; create, rotate, revoke, lookup
//	signingkeys.go SigningKeys: the Ed25519 keys JWTs are signed with, shared by every node
//	keychanges.go  key changes announced by NOTIFY and followed by every node's key cache
//	eventlog.go    EventLog, AuditLog: the storage.EventLog and AuditLog contracts on Postgres
//	analytics.go   the event log's aggregations (statistics, group-by) on Postgres
//	patients.go    SyntheticPatients: which patients are synthetic, for the PHI guard
//	pgtest/        the test environment: one cluster per test package, a cloned database per test
package postgres
