package postgres_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

// scratchDSN returns the DSN of a test database whose search_path is an empty schema, where
// schema_migrations and the test migrations' tables are created away from carehub's own.
func scratchDSN(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	dsn := pgtest.NewDSN(t)
	admin, err := postgres.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA scratch"); err != nil {
		t.Fatal(err)
	}
	return withParams(dsn, "search_path", "scratch")
}

// scratch returns a pool on a scratchDSN database.
func scratch(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := postgres.Connect(context.Background(), scratchDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// migrations builds a test migration directory "m".
func migrations(files map[string]string) fstest.MapFS {
	fsys := fstest.MapFS{}
	for name, sql := range files {
		fsys["m/"+name] = &fstest.MapFile{Data: []byte(sql)}
	}
	return fsys
}

var base = map[string]string{
	// 0010 sorts after 0002 by name; it needs 0002's table and 0002 needs 0001's.
	"0010_c.sql":   "ALTER TABLE b ADD COLUMN note text;",
	"0001_a.sql":   "CREATE TABLE a (id int PRIMARY KEY);\nINSERT INTO a VALUES (1);",
	"0002_b.sql":   "-- several statements in one file\nCREATE TABLE b (id int PRIMARY KEY, a_id int REFERENCES a);\nINSERT INTO b VALUES (1, 1);",
	"0003_e.sql":   "-- nothing but a comment\n",
	"README.md":    "not a migration",
	"sub/0000.sql": "this is not SQL and must not be read",
}

func TestMigrateFS(t *testing.T) {
	ctx := context.Background()
	pool := scratch(t)
	fsys := migrations(base)

	pending, err := postgres.PendingFS(ctx, pool, fsys, "m")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"0001_a", "0002_b", "0003_e", "0010_c"}
	if !slices.Equal(pending, want) {
		t.Fatalf("pending before = %v, want %v", pending, want)
	}

	applied, err := postgres.MigrateFS(ctx, pool, fsys, "m", nil)
	if err != nil || applied != 4 {
		t.Fatalf("MigrateFS = %d, %v; want 4 applied", applied, err)
	}
	var note *string
	if err := pool.QueryRow(ctx, "SELECT note FROM b WHERE id = 1").Scan(&note); err != nil {
		t.Fatalf("all files applied in order: %v", err)
	}

	rows := recorded(t, pool)
	for _, v := range want {
		sum := sha256.Sum256([]byte(base[v+".sql"]))
		if rows[v] != hex.EncodeToString(sum[:]) {
			t.Errorf("schema_migrations[%s] = %q, want the file's sha256", v, rows[v])
		}
	}
	if len(rows) != len(want) {
		t.Errorf("schema_migrations = %v, want %v", slices.Sorted(maps.Keys(rows)), want)
	}

	t.Run("idempotent", func(t *testing.T) {
		applied, err := postgres.MigrateFS(ctx, pool, fsys, "m", nil)
		if err != nil || applied != 0 {
			t.Fatalf("second MigrateFS = %d, %v; want 0, nil", applied, err)
		}
		if pending, err := postgres.PendingFS(ctx, pool, fsys, "m"); err != nil || len(pending) != 0 {
			t.Fatalf("pending after = %v, %v", pending, err)
		}
	})

	t.Run("new file", func(t *testing.T) {
		more := migrations(with(base, "0011_d.sql", "CREATE TABLE d (id int);"))
		if pending, err := postgres.PendingFS(ctx, pool, more, "m"); err != nil || !slices.Equal(pending, []string{"0011_d"}) {
			t.Fatalf("pending = %v, %v; want [0011_d]", pending, err)
		}
		if applied, err := postgres.MigrateFS(ctx, pool, more, "m", nil); err != nil || applied != 1 {
			t.Fatalf("MigrateFS = %d, %v; want 1", applied, err)
		}
	})

	t.Run("file unknown to an older binary", func(t *testing.T) {
		// A rollback to a carehub that lacks 0011_d must still start.
		if applied, err := postgres.MigrateFS(ctx, pool, fsys, "m", nil); err != nil || applied != 0 {
			t.Fatalf("MigrateFS = %d, %v; want 0, nil", applied, err)
		}
	})

	t.Run("changed file refused", func(t *testing.T) {
		changed := with(base, "0002_b.sql", base["0002_b.sql"]+"\nCREATE INDEX b_a ON b (a_id);")
		changed = with(changed, "0012_f.sql", "CREATE TABLE f (id int);")
		applied, err := postgres.MigrateFS(ctx, pool, migrations(changed), "m", nil)
		if !errors.Is(err, postgres.ErrChecksumMismatch) || applied != 0 {
			t.Fatalf("MigrateFS with a changed applied file = %d, %v; want ErrChecksumMismatch", applied, err)
		}
		if !strings.Contains(err.Error(), "0002_b") {
			t.Errorf("error does not name the file: %v", err)
		}
		if _, ok := recorded(t, pool)["0012_f"]; ok {
			t.Error("applied a new file despite the mismatch")
		}
		if _, err := postgres.PendingFS(ctx, pool, migrations(changed), "m"); !errors.Is(err, postgres.ErrChecksumMismatch) {
			t.Errorf("PendingFS = %v; want ErrChecksumMismatch", err)
		}
	})
}

func TestMigrateFSFailureRollsBackFile(t *testing.T) {
	ctx := context.Background()
	pool := scratch(t)
	fsys := migrations(map[string]string{
		"0001_ok.sql":     "CREATE TABLE ok (id int);",
		"0002_broken.sql": "CREATE TABLE half (id int);\nSELECT * FROM no_such_table;",
		"0003_later.sql":  "CREATE TABLE later (id int);",
	})
	applied, err := postgres.MigrateFS(ctx, pool, fsys, "m", nil)
	if err == nil || applied != 1 || !strings.Contains(err.Error(), "0002_broken") {
		t.Fatalf("MigrateFS = %d, %v; want 1 applied and an error naming 0002_broken", applied, err)
	}
	var half, later bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass('half') IS NOT NULL, to_regclass('later') IS NOT NULL").Scan(&half, &later); err != nil {
		t.Fatal(err)
	}
	if half || later {
		t.Errorf("table half exists: %v, later exists: %v; want the failed file rolled back and nothing after it", half, later)
	}
	if pending, err := postgres.PendingFS(ctx, pool, fsys, "m"); err != nil || !slices.Equal(pending, []string{"0002_broken", "0003_later"}) {
		t.Errorf("pending = %v, %v", pending, err)
	}
}

// Migrations may take longer than the pool's statement timeout.
func TestMigrateFSLiftsStatementTimeout(t *testing.T) {
	ctx := context.Background()
	pool, err := postgres.Connect(ctx, withParams(scratchDSN(t), "statement_timeout", "100ms"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	fsys := migrations(map[string]string{"0001_slow.sql": "SELECT pg_sleep(0.5);"})
	if applied, err := postgres.MigrateFS(ctx, pool, fsys, "m", nil); err != nil || applied != 1 {
		t.Fatalf("MigrateFS = %d, %v", applied, err)
	}
}

// Several instances starting at once: every file runs exactly once. Each file would fail if
// run twice (CREATE TABLE without IF NOT EXISTS), and sleeps to widen the window.
func TestMigrateFSConcurrent(t *testing.T) {
	ctx := context.Background()
	dsn := scratchDSN(t)
	fsys := migrations(map[string]string{
		"0001_a.sql": "CREATE TABLE a (id int); SELECT pg_sleep(0.2);",
		"0002_b.sql": "CREATE TABLE b (id int); SELECT pg_sleep(0.1);",
		"0003_c.sql": "ALTER TABLE a ADD COLUMN c int;",
	})
	var pools []*pgxpool.Pool
	for range 2 {
		pool, err := postgres.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		pools = append(pools, pool)
	}
	// schema_migrations exists already, so the race is over the files themselves.
	if _, err := postgres.MigrateFS(ctx, pools[0], migrations(map[string]string{"README.md": ""}), "m", nil); err != nil {
		t.Fatal(err)
	}
	const instances = 6
	var (
		wg    sync.WaitGroup
		total = make([]int, instances)
		errs  = make([]error, instances)
	)
	for i := range instances {
		wg.Go(func() {
			total[i], errs[i] = postgres.MigrateFS(ctx, pools[i%2], fsys, "m", nil)
		})
	}
	wg.Wait()
	sum := 0
	for i := range instances {
		if errs[i] != nil {
			t.Errorf("instance %d: %v", i, errs[i])
		}
		sum += total[i]
	}
	if sum != 3 {
		t.Errorf("applied %d files in all, want 3", sum)
	}
	if rows := recorded(t, pools[0]); len(rows) != 3 {
		t.Errorf("schema_migrations = %v", rows)
	}
}

// pgtest's databases are clones of a template migrated with carehub's own migrations.
func TestMigrateCarehubSchema(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.New(t)
	pending, err := postgres.Pending(ctx, pool)
	if err != nil || len(pending) != 0 {
		t.Fatalf("Pending = %v, %v; want none", pending, err)
	}
	if len(recorded(t, pool)) == 0 {
		t.Fatal("no migration recorded")
	}
	if applied, err := postgres.Migrate(ctx, pool, nil); err != nil || applied != 0 {
		t.Fatalf("Migrate = %d, %v; want 0, nil", applied, err)
	}
}

func TestPendingWithoutMigrationsTable(t *testing.T) {
	ctx := context.Background()
	pool := scratch(t)
	pending, err := postgres.PendingFS(ctx, pool, migrations(base), "m")
	if err != nil || len(pending) != 4 {
		t.Fatalf("PendingFS = %v, %v; want all 4", pending, err)
	}
}

// recorded returns version → checksum from schema_migrations.
func recorded(t *testing.T, pool *pgxpool.Pool) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT version, checksum FROM schema_migrations")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]string{}
	for rows.Next() {
		var v, sum string
		if err := rows.Scan(&v, &sum); err != nil {
			t.Fatal(err)
		}
		got[v] = sum
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

func with(files map[string]string, name, sql string) map[string]string {
	out := maps.Clone(files)
	out[name] = sql
	return out
}
