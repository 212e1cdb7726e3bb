package tick_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"carehub/kernel/tick"
)

func TestEvery(t *testing.T) {
	t.Run("first call after one interval, then each interval, until ctx ends", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		var calls atomic.Int32
		done := make(chan struct{})
		go func() {
			defer close(done)
			tick.Every(ctx, time.Millisecond, func(ctx context.Context) {
				if calls.Add(1) == 3 {
					cancel()
				}
			})
		}()
		<-done
		if n := calls.Load(); n != 3 {
			t.Fatalf("%d calls, want 3: the loop ends when fn cancels ctx", n)
		}
	})
	t.Run("NowAndEvery calls at once", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		var calls int
		tick.NowAndEvery(ctx, time.Hour, func(context.Context) { calls++; cancel() })
		if calls != 1 {
			t.Fatalf("%d calls, want 1 before the first tick", calls)
		}
	})
	t.Run("an ended ctx makes no call", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		called := false
		tick.NowAndEvery(ctx, time.Millisecond, func(context.Context) { called = true })
		tick.Every(ctx, time.Millisecond, func(context.Context) { called = true })
		if called {
			t.Fatal("fn called after ctx ended")
		}
	})
}
