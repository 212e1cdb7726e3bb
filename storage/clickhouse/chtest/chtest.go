// Package chtest gives tests a ClickHouse database of their own on the server named by
// CAREHUB_CLICKHOUSE_URL (for example the one deploy/local/clickhouse/clickhouse.sh runs; `make
// test-clickhouse` sets it). Without the variable there is no server and Real is false: the
// storage/clickhouse suites skip and whole-node tests (e2e/servertest) keep the event and
// audit log in Postgres.
//
//	url := chtest.NewURL(t) // an empty database, dropped when the test ends
package chtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
)

// EnvURL names the environment variable that points tests at a ClickHouse server: a URL of its
// native protocol, clickhouse://user:password@host:port/database (the database is replaced).
const EnvURL = "CAREHUB_CLICKHOUSE_URL"

// Real reports whether tests run against a ClickHouse server (EnvURL is set).
func Real() bool { return os.Getenv(EnvURL) != "" }

// NewURL creates an empty database on the server and returns the server's URL with that
// database, for storage/clickhouse.Open or the node's --clickhouse-url. The database is dropped
// when t ends. Without EnvURL the test is skipped.
func NewURL(t testing.TB) string {
	t.Helper()
	raw := os.Getenv(EnvURL)
	if raw == "" {
		t.Skip("no ClickHouse server: set " + EnvURL + " (`make clickhouse-up`, then the URL `deploy/local/clickhouse/clickhouse.sh url` prints)")
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("chtest: %s: %v", EnvURL, err)
	}
	db := "carehub_test_" + randomHex(6)
	admin(t, raw, "CREATE DATABASE "+db)
	t.Cleanup(func() { admin(t, raw, "DROP DATABASE IF EXISTS "+db+" SYNC") })
	u.Path = "/" + db
	return u.String()
}

// admin runs one statement on the server's default database.
func admin(t testing.TB, dsn, stmt string) {
	t.Helper()
	opts, err := ch.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("chtest: %s: %v", EnvURL, err)
	}
	conn, err := ch.Open(opts)
	if err != nil {
		t.Fatalf("chtest: %v", err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := conn.Exec(ctx, stmt); err != nil {
		t.Fatalf("chtest: %s: %v", stmt, err)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
