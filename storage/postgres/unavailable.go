package postgres

import (
	"context"
	"errors"

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
	if _, connectErr := errors.AsType[*pgconn.ConnectError](err); connectErr || fault.Disconnected(err) {
		return &fault.Error{Kind: fault.KindUnavailable, Err: err,
			Message: "the event and audit log store (Postgres) is unavailable; retry later",
			Details: map[string]any{"dependency": Dependency}}
	}
	return err
}
