package postgres

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"carehub/kernel/fault"
)

// Dependency is the name /readyz and the 503 answers give this store.
const Dependency = "postgres"

// unavailable returns err classified as fault.KindUnavailable when it says the server could not
// be reached or the connection to it broke (refused, reset, closed, timed out): the event and
// audit log's readers answer 503 naming Postgres, not 500, as they do naming ClickHouse. An
// answer of the server (a PgError), a cancelled request and a classified error are returned as
// they are.
func unavailable(err error) error {
	if err == nil || fault.As(err) != nil || errors.Is(err, context.Canceled) {
		return err
	}
	if _, ok := errors.AsType[*pgconn.PgError](err); ok {
		return err
	}
	_, connectErr := errors.AsType[*pgconn.ConnectError](err)
	_, netErr := errors.AsType[net.Error](err)
	if connectErr || netErr || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return &fault.Error{Kind: fault.KindUnavailable, Err: err,
			Message: "the event and audit log store (Postgres) is unavailable; retry later",
			Details: map[string]any{"dependency": Dependency}}
	}
	return err
}
