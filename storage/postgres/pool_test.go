package postgres_test

import (
	"context"
	"errors"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

func TestConnect(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewDSN(t)

	tests := []struct {
		name     string
		dsn      string
		maxConns int32
		settings map[string]string
	}{
		{
			name:     "defaults",
			dsn:      dsn,
			maxConns: int32(max(8, 4*runtime.GOMAXPROCS(0))),
			settings: map[string]string{
				"application_name":                    "carehub",
				"statement_timeout":                   "30s",
				"idle_in_transaction_session_timeout": "1min",
			},
		},
		{
			name:     "DSN wins",
			dsn:      withParams(dsn, "application_name", "ingest", "statement_timeout", "5s", "pool_max_conns", "3"),
			maxConns: 3,
			settings: map[string]string{
				"application_name":                    "ingest",
				"statement_timeout":                   "5s",
				"idle_in_transaction_session_timeout": "1min",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool, err := postgres.Connect(ctx, tt.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			if got := pool.Config().MaxConns; got != tt.maxConns {
				t.Errorf("MaxConns = %d, want %d", got, tt.maxConns)
			}
			for name, want := range tt.settings {
				var got string
				if err := pool.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Errorf("%s = %q, want %q", name, got, want)
				}
			}
		})
	}
}

func TestConnectStatementTimeoutApplies(t *testing.T) {
	ctx := context.Background()
	pool, err := postgres.Connect(ctx, withParams(pgtest.NewDSN(t), "statement_timeout", "50ms"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, err = pool.Exec(ctx, "SELECT pg_sleep(2)")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" { // query_canceled
		t.Fatalf("pg_sleep(2) with a 50ms timeout: %v", err)
	}
}

func TestConnectFailsWithoutServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := postgres.Connect(ctx, "host=/nonexistent port=5432 user=carehub dbname=x sslmode=disable")
	if err == nil {
		pool.Close()
		t.Fatal("Connect succeeded without a server")
	}
}

// withParams adds keyword=value settings to dsn, in either of its forms: CAREHUB_TEST_DATABASE_URL
// may be a URL.
func withParams(dsn string, kv ...string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		for i := 0; i+1 < len(kv); i += 2 {
			q.Set(kv[i], kv[i+1])
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	var b strings.Builder
	b.WriteString(dsn)
	for i := 0; i+1 < len(kv); i += 2 {
		b.WriteString(" " + kv[i] + "=" + kv[i+1])
	}
	return b.String()
}
