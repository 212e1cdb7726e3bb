package pgtest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestNewIsolatesTests(t *testing.T) {
	ctx := context.Background()
	a, b := pgtest.New(t), pgtest.New(t)
	if _, err := a.Exec(ctx, "CREATE TABLE only_in_a (v int); INSERT INTO schema_migrations (version, checksum) VALUES ('only_in_a', '')"); err != nil {
		t.Fatal(err)
	}
	var dbA, dbB string
	var tableInB bool
	var rowsInB int
	if err := a.QueryRow(ctx, "SELECT current_database()").Scan(&dbA); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRow(ctx, "SELECT current_database(), to_regclass('only_in_a') IS NOT NULL, (SELECT count(*) FROM schema_migrations WHERE version = 'only_in_a')").Scan(&dbB, &tableInB, &rowsInB); err != nil {
		t.Fatal(err)
	}
	if dbA == dbB || tableInB || rowsInB != 0 {
		t.Fatalf("databases %s and %s share state: table visible %v, rows %d", dbA, dbB, tableInB, rowsInB)
	}
}

func TestNewIsMigrated(t *testing.T) {
	pending, err := postgres.Pending(context.Background(), pgtest.New(t))
	if err != nil || len(pending) != 0 {
		t.Fatalf("Pending = %v, %v; want none", pending, err)
	}
}

func TestNewDropsDatabaseAfterTest(t *testing.T) {
	ctx := context.Background()
	var name string
	t.Run("user", func(t *testing.T) {
		dsn := pgtest.NewDSN(t)
		// Left open on purpose: the drop must not wait for it.
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil {
			t.Fatal(err)
		}
	})
	var exists bool
	if err := pgtest.New(t).QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("database %s outlived its test", name)
	}
}

func TestNewInParallel(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	for i := range 6 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			var db string
			if err := pgtest.New(t).QueryRow(context.Background(), "SELECT current_database()").Scan(&db); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[db] {
				t.Errorf("database %s handed out twice", db)
			}
			seen[db] = true
		})
	}
}

// BenchmarkNewDSN measures the per-test cost of a cloned, migrated database (the drops
// happen after the timing, when the benchmark ends).
func BenchmarkNewDSN(b *testing.B) {
	for b.Loop() {
		pgtest.NewDSN(b)
	}
}
