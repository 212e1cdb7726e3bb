// Package postgres is carehub's Postgres plumbing: the managed local cluster of the embedded
// default, the connection pool, and the schema migrations.
//
// File map:
//
//	local.go       StartLocal: a cluster under the data dir, run with the system's initdb/pg_ctl
//	local_dir.go   where that cluster lives when carehub runs as root (postgres user, traversal)
//	postmaster.go  postmaster.pid: readiness, stale lock files after a crash
//	proc_*.go      what /proc says about a postmaster: alive, zombie, or a reused pid
//	pool.go        Connect: pgxpool with carehub's settings
//	migrate.go     Migrate, Pending: schemas/postgres/*.sql, tracked in schema_migrations
//	pgtest/        the test environment: one cluster per test package, a cloned database per test
package postgres
