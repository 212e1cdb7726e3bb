package fhirsubs

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Wake tells the waiters of a node that a subscription has new events: one Postgres connection
// LISTENs on the channel the notifier announces numbered events on, and each announcement wakes
// the waiters of its subscription and those of every subscription (the deliverer). A lost
// connection is re-established; waiters also wake on their own timers, so an announcement lost
// meanwhile delays a notification, never loses it.
type Wake struct {
	pool *pgxpool.Pool
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{} // "" is every subscription
}

// NewWake returns a Wake on pool; Run listens.
func NewWake(pool *pgxpool.Pool) *Wake {
	return &Wake{pool: pool, subs: map[string]map[chan struct{}]struct{}{}}
}

// Wait returns a channel that receives (without blocking the sender: it holds one wake-up) when
// subscription id (every one, for "") has new events, and a func that stops it.
func (w *Wake) Wait(id string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	if w.subs[id] == nil {
		w.subs[id] = map[chan struct{}]struct{}{}
	}
	w.subs[id][ch] = struct{}{}
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		delete(w.subs[id], ch)
		if len(w.subs[id]) == 0 {
			delete(w.subs, id)
		}
		w.mu.Unlock()
	}
}

func (w *Wake) wake(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, key := range []string{id, ""} {
		for ch := range w.subs[key] {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// Run listens until ctx ends and returns nil.
func (w *Wake) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		w.listen(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}

// listen holds one LISTEN connection until it fails or ctx ends.
func (w *Wake) listen(ctx context.Context) {
	conn, err := w.pool.Acquire(ctx)
	if err != nil {
		return
	}
	defer func() {
		// A connection left LISTENing (or mid-wait) is not one to hand back to the pool.
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		conn.Hijack().Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, "listen "+wakeChannel); err != nil {
		return
	}
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return
		}
		w.wake(n.Payload)
	}
}
