// Package tick runs the periodic work of carehub's background loops (sweeps, retention,
// lease renewals, reconcilers) so that each says what it does and how often, not how a ticker
// is stopped.
package tick

import (
	"context"
	"time"
)

// Every calls fn every interval until ctx ends; the first call is one interval from now. Calls
// never overlap: one that overruns the interval delays the next (the ticks it missed are
// dropped). fn stops the loop early by cancelling ctx.
func Every(ctx context.Context, interval time.Duration, fn func(ctx context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if ctx.Err() != nil { // both were ready: select picked at random
				return
			}
			fn(ctx)
		}
	}
}

// NowAndEvery is Every with a first call at once.
func NowAndEvery(ctx context.Context, interval time.Duration, fn func(ctx context.Context)) {
	if ctx.Err() != nil {
		return
	}
	fn(ctx)
	Every(ctx, interval, fn)
}

// Sleep waits d or until ctx ends, and reports whether the whole d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
