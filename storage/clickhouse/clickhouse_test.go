package clickhouse_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"carehub/storage"
	"carehub/storage/clickhouse"
	"carehub/storage/storagetest"
)

// EnvURL points the tests at a ClickHouse server; without it they skip.
const EnvURL = "CAREHUB_CLICKHOUSE_URL"

// newStore opens a store on a database of its own, dropped when the test ends.
func newStore(t *testing.T) *clickhouse.Store {
	t.Helper()
	raw := os.Getenv(EnvURL)
	if raw == "" {
		t.Skip("no ClickHouse server: set " + EnvURL + " (e.g. clickhouse://default:@localhost:9000/default) to run the ClickHouse conformance suites")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts, err := ch.ParseDSN(raw)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := ch.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	db := "carehub_test_" + hex.EncodeToString(b)
	if err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db); err != nil {
			t.Errorf("drop %s: %v", db, err)
		}
	})
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + db
	store, err := clickhouse.Open(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return store
}

func skipWithoutServer(t *testing.T) {
	if os.Getenv(EnvURL) == "" {
		t.Skip("no ClickHouse server: set " + EnvURL + " (e.g. clickhouse://default:@localhost:9000/default) to run the ClickHouse conformance suite")
	}
}

func TestEventLogConformance(t *testing.T) {
	skipWithoutServer(t)
	storagetest.TestEventLog(t, func(t *testing.T) storage.EventLog { return newStore(t) })
}

func TestAuditLogConformance(t *testing.T) {
	skipWithoutServer(t)
	storagetest.TestAuditLog(t, func(t *testing.T) storage.AuditLog { return newStore(t) })
}
