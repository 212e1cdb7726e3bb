package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Querier is a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Scalar runs sql, which answers one row of one column, and returns the value read into T; an
// error (no row included) fails t.
func Scalar[T any](t testing.TB, q Querier, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := q.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s %v: %v", sql, args, err)
	}
	return v
}
