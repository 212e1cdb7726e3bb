package ws

import "context"

// connKey is the context key under which an operation's context carries its connection.
type connKey struct{}

// CloseSlow closes the connection that runs the operation of ctx (the context Executor.Execute
// received, or one derived from it) with 4008 "Subscriber too slow", as if its send queue had
// stayed full. An executor calls it when its event source dropped an operation for falling
// behind: ending the operation with complete would tell the client its results are over, and a
// graphql-ws client would not ask again, while 4008 makes it reconnect with back-off and
// resubscribe. The operation's results still queued are not sent. CloseSlow reports whether it
// closed the connection: it does nothing for a context of no connection, nor once ctx is done
// (the operation was stopped, or the connection is closing anyway).
func CloseSlow(ctx context.Context) bool {
	c, ok := ctx.Value(connKey{}).(*conn)
	if !ok || ctx.Err() != nil {
		return false
	}
	c.slow("the operation's event source dropped it")
	return true
}
