package postgres

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Session defaults that Connect sets unless the DSN sets them.
const (
	// StatementTimeout ends any statement that runs longer: a request path never waits on
	// the database for longer than this. Migrate lifts it for its own transactions.
	StatementTimeout = 30 * time.Second
	// IdleInTransactionTimeout ends a session that holds a transaction open while doing
	// nothing, which would otherwise keep its locks and hold back vacuum.
	IdleInTransactionTimeout = time.Minute
)

// Connect returns a pool for dsn (URL or keyword/value form, as pgx accepts) once a
// connection has answered a ping. Unless the DSN sets them (pool_max_conns, or a runtime
// parameter of the same name), it uses at most max(8, 4×GOMAXPROCS) connections and sets
// application_name=carehub, statement_timeout and idle_in_transaction_session_timeout.
// The caller closes the pool.
func Connect(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's parse errors redact the password.
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		// Most of carehub's work is short queries while a request or a consumer batch
		// waits; a few connections per core keep the CPUs busy without queuing in the server.
		cfg.MaxConns = int32(max(8, 4*runtime.GOMAXPROCS(0)))
	}
	if !strings.Contains(dsn, "pool_max_conn_lifetime_jitter") {
		// Connections opened together (at start) should not all be recycled together.
		cfg.MaxConnLifetimeJitter = cfg.MaxConnLifetime / 10
	}
	params := cfg.ConnConfig.RuntimeParams
	for k, v := range map[string]string{
		"application_name":                    "carehub",
		"statement_timeout":                   durationParam(StatementTimeout),
		"idle_in_transaction_session_timeout": durationParam(IdleInTransactionTimeout),
	} {
		if _, set := params[k]; !set {
			params[k] = v
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to postgres: %w", onceEach(err))
	}
	return pool, nil
}

// onceEach names each distinct cause of a failed connect once: with sslmode=prefer (the
// default) pgx dials every address twice, with TLS and without, and reports both identical
// dial errors.
func onceEach(err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return err
	}
	joined, ok := ce.Unwrap().(interface{ Unwrap() []error })
	if !ok {
		return err
	}
	var causes []string
	for _, e := range joined.Unwrap() {
		if msg := e.Error(); !slices.Contains(causes, msg) {
			causes = append(causes, msg)
		}
	}
	return &connectError{msg: fmt.Sprintf("failed to connect to `user=%s database=%s`: %s", ce.Config.User, ce.Config.Database,
		strings.Join(causes, "; ")), err: err}
}

// connectError is a ConnectError with a shorter message; errors.As still finds the original.
type connectError struct {
	msg string
	err error
}

func (e *connectError) Error() string { return e.msg }
func (e *connectError) Unwrap() error { return e.err }

// durationParam formats d as a PostgreSQL time setting in milliseconds.
func durationParam(d time.Duration) string {
	return fmt.Sprintf("%dms", d.Milliseconds())
}
