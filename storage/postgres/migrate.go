package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/schemas"
)

// ErrChecksumMismatch is returned (wrapped, naming the file) by Migrate and Pending when a
// migration that is already applied no longer matches its file. Applied migrations are
// immutable: change the schema with a new file.
var ErrChecksumMismatch = errors.New("applied migration changed")

// migrationLock is the pg_advisory_xact_lock key that serializes migrations across carehub
// instances sharing a database ("carehub!" in ASCII).
const migrationLock int64 = 0x6361726568756221

// Migrate applies carehub's pending migrations (schemas.Postgres, postgres/*.sql). See
// MigrateFS.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (applied int, err error) {
	return MigrateFS(ctx, pool, schemas.Postgres, "postgres", logger)
}

// Pending lists carehub's migrations not applied yet, for readiness checks. See PendingFS.
func Pending(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	return PendingFS(ctx, pool, schemas.Postgres, "postgres")
}

// MigrateFS applies the migrations in dir of fsys (files *.sql, in lexical order of name;
// a file's version is its name without .sql) that the database has not applied, and returns
// how many it applied.
//
// Each file runs in its own transaction together with its row in schema_migrations, so a
// file is applied entirely or not at all; a file therefore cannot use statements that refuse
// to run in a transaction (CREATE INDEX CONCURRENTLY). Statement timeouts are lifted for it.
//
// It is safe to run from several instances at once: each file's transaction first takes an
// advisory lock and checks again whether another instance applied the file meanwhile.
//
// Before applying anything it compares each applied migration's recorded SHA-256 with its
// file and fails with ErrChecksumMismatch on a difference. Versions the database has but
// fsys lacks (a newer carehub migrated it) are logged, not fatal, so that rolling back a
// deploy works.
func MigrateFS(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, dir string, logger *slog.Logger) (applied int, err error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	migs, err := loadMigrations(fsys, dir)
	if err != nil {
		return 0, err
	}
	if err := ensureMigrationsTable(ctx, pool); err != nil {
		return 0, err
	}
	done, err := appliedMigrations(ctx, pool)
	if err != nil {
		return 0, err
	}
	if err := verify(migs, done); err != nil {
		return 0, err
	}
	if unknown := unknownVersions(migs, done); len(unknown) > 0 {
		logger.Warn("database has migrations this carehub does not know; it was migrated by a newer version",
			"versions", unknown)
	}
	for _, m := range migs {
		if _, ok := done[m.version]; ok {
			continue
		}
		begin := time.Now()
		ran, err := applyMigration(ctx, pool, m)
		if err != nil {
			return applied, err
		}
		if ran {
			applied++
			logger.Info("applied migration", "version", m.version, "duration", time.Since(begin))
		}
	}
	return applied, nil
}

// PendingFS lists, in order, the versions in dir of fsys that the database has not applied.
// It fails with ErrChecksumMismatch as MigrateFS does.
func PendingFS(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, dir string) ([]string, error) {
	migs, err := loadMigrations(fsys, dir)
	if err != nil {
		return nil, err
	}
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass('schema_migrations') IS NOT NULL").Scan(&exists); err != nil {
		return nil, fmt.Errorf("pending migrations: %w", err)
	}
	done := map[string]string{}
	if exists {
		if done, err = appliedMigrations(ctx, pool); err != nil {
			return nil, err
		}
	}
	if err := verify(migs, done); err != nil {
		return nil, err
	}
	pending := []string{}
	for _, m := range migs {
		if _, ok := done[m.version]; !ok {
			pending = append(pending, m.version)
		}
	}
	return pending, nil
}

type migration struct {
	version  string
	sql      string
	checksum string // hex SHA-256 of the file
}

func loadMigrations(fsys fs.FS, dir string) ([]migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var migs []migration
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read migrations: %w", err)
		}
		sum := sha256.Sum256(b)
		migs = append(migs, migration{
			version:  strings.TrimSuffix(e.Name(), ".sql"),
			sql:      string(b),
			checksum: hex.EncodeToString(sum[:]),
		})
	}
	// fs.ReadDir sorts, but an fs.FS implementing ReadDirFS is only asked to.
	slices.SortFunc(migs, func(a, b migration) int { return strings.Compare(a.version, b.version) })
	return migs, nil
}

func ensureMigrationsTable(ctx context.Context, pool *pgxpool.Pool) error {
	// Under the lock: concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := lockMigrations(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    text PRIMARY KEY,
			checksum   text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now()
		)`)
		return err
	})
	return wrapErr("create schema_migrations", err)
}

func lockMigrations(ctx context.Context, tx pgx.Tx) error {
	// Waiting for another instance's long migration is not a slow statement.
	if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = 0"); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrationLock)
	return err
}

// appliedMigrations returns version → checksum of the applied migrations.
func appliedMigrations(ctx context.Context, pool *pgxpool.Pool) (map[string]string, error) {
	rows, err := pool.Query(ctx, "SELECT version, checksum FROM schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	done := map[string]string{}
	var version, checksum string
	_, err = pgx.ForEachRow(rows, []any{&version, &checksum}, func() error {
		done[version] = checksum
		return nil
	})
	return done, wrapErr("read schema_migrations", err)
}

func verify(migs []migration, done map[string]string) error {
	var errs []error
	for _, m := range migs {
		if sum, ok := done[m.version]; ok && sum != m.checksum {
			errs = append(errs, mismatch(m, sum))
		}
	}
	return errors.Join(errs...)
}

func mismatch(m migration, applied string) error {
	return fmt.Errorf("migration %s: %w: the file's sha256 is %.12s…, the applied one's %.12s…; restore the file and add a new migration instead",
		m.version, ErrChecksumMismatch, m.checksum, applied)
}

func unknownVersions(migs []migration, done map[string]string) []string {
	var unknown []string
	for v := range done {
		if !slices.ContainsFunc(migs, func(m migration) bool { return m.version == v }) {
			unknown = append(unknown, v)
		}
	}
	slices.Sort(unknown)
	return unknown
}

// applyMigration runs m and records it in one transaction, unless another instance applied
// it while this one waited for the lock. It reports whether it ran m.
func applyMigration(ctx context.Context, pool *pgxpool.Pool, m migration) (ran bool, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := lockMigrations(ctx, tx); err != nil {
			return err
		}
		var sum string
		err := tx.QueryRow(ctx, "SELECT checksum FROM schema_migrations WHERE version = $1", m.version).Scan(&sum)
		switch {
		case err == nil && sum != m.checksum:
			return mismatch(m, sum)
		case err == nil:
			return nil
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		// No arguments: pgx sends it with the simple protocol, which runs a file of
		// several statements.
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, checksum, applied_at) VALUES ($1, $2, now())",
			m.version, m.checksum); err != nil {
			return err
		}
		ran = true
		return nil
	})
	if err != nil && !errors.Is(err, ErrChecksumMismatch) {
		err = fmt.Errorf("migration %s: %w", m.version, err)
	}
	return ran && err == nil, err
}
