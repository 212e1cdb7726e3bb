package clickhouse

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// readRetry is the store's connection: a read (Query, QueryRow) that fails before its first
// row because the pooled connection it was given is broken runs once more, on another
// connection (clickhouse-go closes a connection released with an error). database/sql does the
// same for a bad pooled connection; clickhouse-go's native pool does not. Reads only: a SELECT
// repeated changes nothing, an INSERT or an ALTER might.
//
// Seen in CI (2026-11-29, the ClickHouse suite): a page of GET /v1/events failed with "failed to
// read first block packet … use of closed network connection" on the node's first connection,
// and the request answered 500. The cause inside the driver was not found.
type readRetry struct{ driver.Conn }

func (c readRetry) Query(ctx context.Context, query string, args ...any) (driver.Rows, error) {
	rows, err := c.Conn.Query(ctx, query, args...)
	if broken(ctx, err) {
		return c.Conn.Query(ctx, query, args...)
	}
	return rows, err
}

func (c readRetry) QueryRow(ctx context.Context, query string, args ...any) driver.Row {
	row := c.Conn.QueryRow(ctx, query, args...)
	if broken(ctx, row.Err()) {
		return c.Conn.QueryRow(ctx, query, args...)
	}
	return row
}

// broken reports whether err says the connection failed, rather than the query or ctx.
func broken(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() == nil && (errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))
}
