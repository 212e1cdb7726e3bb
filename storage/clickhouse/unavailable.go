package clickhouse

import (
	"context"
	"errors"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"

	"carehub/kernel/fault"
)

// Dependency is the name /readyz and the 503 answers give this store.
const Dependency = "clickhouse"

// unavailable returns err classified as fault.KindUnavailable when it says the server could
// not be reached or the connection to it broke (refused, reset, closed, timed out, no
// connection free in time): the caller answers 503 naming ClickHouse, not 500, and the client
// retries. An answer of the server (an exception), a cancelled request and a classified error
// are returned as they are.
func unavailable(err error) error {
	if err == nil || fault.As(err) != nil || errors.Is(err, context.Canceled) {
		return err
	}
	if _, ok := errors.AsType[*proto.Exception](err); ok {
		return err
	}
	if fault.Disconnected(err) || errors.Is(err, ch.ErrAcquireConnTimeout) || errors.Is(err, ch.ErrConnectionClosed) {
		return &fault.Error{Kind: fault.KindUnavailable, Err: err,
			Message: "the event and audit log store (ClickHouse) is unavailable; retry later",
			Details: map[string]any{"dependency": Dependency}}
	}
	return err
}

// Ping reports whether the server answers: the node's readiness check.
func (s *Store) Ping(ctx context.Context) error {
	return unavailable(s.conn.Ping(ctx))
}
