package graphql

import (
	"context"
	"sync"
	"time"
)

// loader batches the lookups of one request by key into one fetch (one `= any($1)` statement),
// so that a nested selection over a list costs one statement per level instead of one per item.
//
// graph-gophers resolves the items of a list on up to MaxParallelism goroutines, so the items'
// Loads do not all arrive together. Two things gather them:
//
//   - Hints: the resolver that produced a list (itself usually a batch) names the keys its items
//     will ask for. A Load of a hinted key fetches every hinted key not fetched yet at once,
//     without waiting. This is what makes the statement count independent of the list length
//     and of scheduling.
//   - A short window: a Load of a key nobody hinted waits up to wait for other Loads (or until
//     maxBatch keys are pending) before the fetch, the classic dataloader tick.
//
// Results, errors included, are cached for the loader's life: one request.
type loader[K comparable, V any] struct {
	fetch    func(ctx context.Context, keys []K) (map[K]V, error)
	wait     time.Duration
	maxBatch int

	mu      sync.Mutex
	entries map[K]*entry[V]
	hinted  map[K]struct{}
	pending *batch[K, V]
}

type entry[V any] struct {
	done chan struct{}
	val  V
	err  error
}

type batch[K comparable, V any] struct {
	keys    []K
	entries []*entry[V]
	timer   *time.Timer
}

// defaultWait is how long an unhinted Load waits for company. Resolvers of one list level run
// within microseconds of each other, so a few hundred suffice; the cost is added once per level
// and only when no hint gathered the keys.
const defaultWait = 300 * time.Microsecond

func newLoader[K comparable, V any](fetch func(ctx context.Context, keys []K) (map[K]V, error)) *loader[K, V] {
	return &loader[K, V]{fetch: fetch, wait: defaultWait, maxBatch: 1000,
		entries: map[K]*entry[V]{}, hinted: map[K]struct{}{}}
}

// Hint announces keys that are about to be loaded. It fetches nothing by itself.
func (l *loader[K, V]) Hint(keys ...K) {
	l.mu.Lock()
	for _, k := range keys {
		if _, ok := l.entries[k]; !ok {
			l.hinted[k] = struct{}{}
		}
	}
	l.mu.Unlock()
}

// Load returns the value of key (the zero V when the fetch did not return it).
func (l *loader[K, V]) Load(ctx context.Context, key K) (V, error) {
	l.mu.Lock()
	if e, ok := l.entries[key]; ok {
		l.mu.Unlock()
		return e.wait(ctx)
	}
	_, wasHinted := l.hinted[key]
	b := l.pending
	if b == nil {
		b = &batch[K, V]{}
		l.pending = b
	}
	e := l.add(b, key)
	if wasHinted {
		for k := range l.hinted {
			l.add(b, k)
		}
	}
	if wasHinted || len(b.keys) >= l.maxBatch {
		l.pending = nil
		l.mu.Unlock()
		if b.timer != nil {
			b.timer.Stop()
		}
		l.run(ctx, b)
		return e.wait(ctx)
	}
	if b.timer == nil {
		// A batch that lost to a full dispatch above finds pending changed and does nothing.
		b.timer = time.AfterFunc(l.wait, func() {
			l.mu.Lock()
			if l.pending != b {
				l.mu.Unlock()
				return
			}
			l.pending = nil
			l.mu.Unlock()
			l.run(context.WithoutCancel(ctx), b)
		})
	}
	l.mu.Unlock()
	return e.wait(ctx)
}

// add puts key into batch b unless it already has an entry; l.mu is held.
func (l *loader[K, V]) add(b *batch[K, V], key K) *entry[V] {
	if e, ok := l.entries[key]; ok {
		return e
	}
	e := &entry[V]{done: make(chan struct{})}
	l.entries[key] = e
	delete(l.hinted, key)
	b.keys = append(b.keys, key)
	b.entries = append(b.entries, e)
	return e
}

func (l *loader[K, V]) run(ctx context.Context, b *batch[K, V]) {
	vals, err := func() (m map[K]V, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = errPanic
			}
		}()
		return l.fetch(ctx, b.keys)
	}()
	for i, k := range b.keys {
		e := b.entries[i]
		if err != nil {
			e.err = err
		} else {
			e.val = vals[k]
		}
		close(e.done)
	}
}

func (e *entry[V]) wait(ctx context.Context) (V, error) {
	select {
	case <-e.done:
		return e.val, e.err
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	}
}
