package ws

import (
	"context"
	"errors"
	"fmt"
	"sync"

	gqlerrors "github.com/graph-gophers/graphql-go/errors"

	"carehub/kernel/config"
)

// Owner is implemented by an Executor whose sockets are limited per credential and per
// organization: Owner names the credential an authenticated socket counts against, from the
// context Authenticate returned (an API key's id; a JWT counts against its parent key), and
// the organization the credential belongs to. "" counts against none.
type Owner interface {
	Owner(ctx context.Context) (key, org string)
}

// owner is who a socket counts against.
type owner struct{ key, org string }

// Limits caps what one credential, and all of them together, hold of a node's sockets
// (docs/LIMITS.md). Zero fields take the defaults; negative ones are refused.
type Limits struct {
	// SocketsPerKey caps the authenticated sockets one credential (Owner) holds open at once
	// (default 100); a connection_init beyond it closes the socket with 4013.
	SocketsPerKey int
	// OperationsPerKey caps the operations one credential runs at once over all its sockets
	// (default 500); a subscribe beyond it gets an error message (RATE_LIMITED).
	OperationsPerKey int
	// SocketsPerOrg and OperationsPerOrg cap the same for all the credentials of one
	// organization together (defaults 500 and 1000): keys are cheap to make, so without them an
	// organization's twenty keys hold twenty times a key's share.
	SocketsPerOrg    int
	OperationsPerOrg int
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
	DefaultSocketsPerOrg    = 500
	DefaultOperationsPerOrg = 1000
	DefaultOperations       = 10000
	DefaultQueueBytes       = 4 << 20
)

// WithDefaults returns l with its zero fields set to the defaults.
func (l Limits) WithDefaults() Limits {
	config.Default(&l.SocketsPerKey, DefaultSocketsPerKey)
	config.Default(&l.OperationsPerKey, DefaultOperationsPerKey)
	config.Default(&l.SocketsPerOrg, DefaultSocketsPerOrg)
	config.Default(&l.OperationsPerOrg, DefaultOperationsPerOrg)
	config.Default(&l.Operations, DefaultOperations)
	config.Default(&l.QueueBytes, DefaultQueueBytes)
	return l
}

// Validate refuses negative fields.
func (l Limits) Validate() error {
	if l.SocketsPerKey < 0 || l.OperationsPerKey < 0 || l.SocketsPerOrg < 0 || l.OperationsPerOrg < 0 ||
		l.Operations < 0 || l.QueueBytes < 0 {
		return errors.New("ws: socket and operation limits must not be negative (0: the default)")
	}
	return nil
}

// counts holds a Handler's sockets and operations per credential, per organization and in
// all, against its Limits.
type counts struct {
	lim     Limits
	mu      sync.Mutex
	sockets map[string]int // by key, and by "org:"+org
	ops     map[string]int // likewise
	total   int
}

func newCounts(lim Limits) *counts {
	return &counts{lim: lim, sockets: make(map[string]int), ops: make(map[string]int)}
}

// orgKey is an organization's entry in the counts' maps, apart from any key id.
func orgKey(org string) string { return "org:" + org }

// openSocket counts a socket of o; false when its key or organization is at its limit.
func (n *counts) openSocket(o owner) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if (o.key != "" && n.sockets[o.key] >= n.lim.SocketsPerKey) ||
		(o.org != "" && n.sockets[orgKey(o.org)] >= n.lim.SocketsPerOrg) {
		return false
	}
	n.add(n.sockets, o, 1)
	return true
}

func (n *counts) closeSocket(o owner) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.add(n.sockets, o, -1)
}

// startOperation counts an operation of o, or returns the error that refuses it.
func (n *counts) startOperation(o owner) *gqlerrors.QueryError {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.total >= n.lim.Operations:
		return tooManyOperations("on this server", "node", n.lim.Operations)
	case o.key != "" && n.ops[o.key] >= n.lim.OperationsPerKey:
		return tooManyOperations("for this credential", "key", n.lim.OperationsPerKey)
	case o.org != "" && n.ops[orgKey(o.org)] >= n.lim.OperationsPerOrg:
		return tooManyOperations("for this organization", "organization", n.lim.OperationsPerOrg)
	}
	n.total++
	n.add(n.ops, o, 1)
	return nil
}

func (n *counts) endOperation(o owner) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.total--
	n.add(n.ops, o, -1)
}

// add adds d to o's key and organization entries of m.
func (n *counts) add(m map[string]int, o owner, d int) {
	if o.key != "" {
		adjust(m, o.key, d)
	}
	if o.org != "" {
		adjust(m, orgKey(o.org), d)
	}
}

// adjust adds d to m[k], deleting it at zero so that the maps hold only owners with sockets.
func adjust(m map[string]int, k string, d int) {
	if m[k]+d <= 0 {
		delete(m, k)
		return
	}
	m[k] += d
}

// tooManyOperations is the error message of a subscribe past a limit; per names the limit
// (connection, key, organization or node) for a client that backs off differently for each.
func tooManyOperations(where, per string, limit int) *gqlerrors.QueryError {
	return &gqlerrors.QueryError{
		Message:    fmt.Sprintf("too many operations %s (limit %d)", where, limit),
		Extensions: map[string]any{"code": "RATE_LIMITED", "limit": limit, "per": per},
	}
}
