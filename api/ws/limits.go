package ws

import (
	"context"
	"errors"
	"fmt"
	"sync"

	gqlerrors "github.com/graph-gophers/graphql-go/errors"

	"carehub/kernel/config"
)

// Owner is implemented by an Executor whose sockets are limited per credential: Owner names
// the credential an authenticated socket counts against, from the context Authenticate
// returned (an API key's id; a JWT counts against its parent key). "" counts against none.
type Owner interface {
	Owner(ctx context.Context) string
}

// Limits caps what one credential, and all of them together, hold of a node's sockets
// (docs/LIMITS.md). Zero fields take the defaults; negative ones are refused.
type Limits struct {
	// SocketsPerKey caps the authenticated sockets one credential (Owner) holds open at once
	// (default 100); a connection_init beyond it closes the socket with 4013.
	SocketsPerKey int
	// OperationsPerKey caps the operations one credential runs at once over all its sockets
	// (default 500); a subscribe beyond it gets an error message (RATE_LIMITED).
	OperationsPerKey int
	// Operations caps the operations running at once on the node, every credential's together
	// (default 10000); a subscribe beyond it gets an error message (RATE_LIMITED). With each
	// operation's own send and execution buffers it bounds the memory one event can take.
	Operations int
	// QueueBytes bounds the bytes in one socket's send queue (default 4 MiB), beside its
	// SubscriberBuffer messages: an operation that finds no room waits SlowConsumerTimeout and
	// then closes the socket with 4008. A message larger than the bound waits for an empty queue.
	QueueBytes int64
}

// Defaults of Limits.
const (
	DefaultSocketsPerKey    = 100
	DefaultOperationsPerKey = 500
	DefaultOperations       = 10000
	DefaultQueueBytes       = 4 << 20
)

// WithDefaults returns l with its zero fields set to the defaults.
func (l Limits) WithDefaults() Limits {
	config.Default(&l.SocketsPerKey, DefaultSocketsPerKey)
	config.Default(&l.OperationsPerKey, DefaultOperationsPerKey)
	config.Default(&l.Operations, DefaultOperations)
	config.Default(&l.QueueBytes, DefaultQueueBytes)
	return l
}

// Validate refuses negative fields.
func (l Limits) Validate() error {
	if l.SocketsPerKey < 0 || l.OperationsPerKey < 0 || l.Operations < 0 || l.QueueBytes < 0 {
		return errors.New("ws: socket and operation limits must not be negative (0: the default)")
	}
	return nil
}

// counts holds a Handler's sockets and operations per owner and in all, against its Limits.
type counts struct {
	lim     Limits
	mu      sync.Mutex
	sockets map[string]int
	ops     map[string]int
	total   int
}

func newCounts(lim Limits) *counts {
	return &counts{lim: lim, sockets: make(map[string]int), ops: make(map[string]int)}
}

// openSocket counts a socket of owner; false when owner is at SocketsPerKey.
func (n *counts) openSocket(owner string) bool {
	if owner == "" {
		return true
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sockets[owner] >= n.lim.SocketsPerKey {
		return false
	}
	n.sockets[owner]++
	return true
}

func (n *counts) closeSocket(owner string) {
	if owner == "" {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	decrement(n.sockets, owner)
}

// startOperation counts an operation of owner, or returns the error that refuses it.
func (n *counts) startOperation(owner string) *gqlerrors.QueryError {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.total >= n.lim.Operations {
		return tooManyOperations("on this server", "node", n.lim.Operations)
	}
	if owner != "" && n.ops[owner] >= n.lim.OperationsPerKey {
		return tooManyOperations("for this credential", "key", n.lim.OperationsPerKey)
	}
	n.total++
	if owner != "" {
		n.ops[owner]++
	}
	return nil
}

func (n *counts) endOperation(owner string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.total--
	if owner != "" {
		decrement(n.ops, owner)
	}
}

// decrement lowers m[k], deleting it at zero so that the maps hold only owners with sockets.
func decrement(m map[string]int, k string) {
	if m[k] <= 1 {
		delete(m, k)
		return
	}
	m[k]--
}

// tooManyOperations is the error message of a subscribe past a limit; per names the limit
// (connection, key or node) for a client that backs off differently for each.
func tooManyOperations(where, per string, limit int) *gqlerrors.QueryError {
	return &gqlerrors.QueryError{
		Message:    fmt.Sprintf("too many operations %s (limit %d)", where, limit),
		Extensions: map[string]any{"code": "RATE_LIMITED", "limit": limit, "per": per},
	}
}
