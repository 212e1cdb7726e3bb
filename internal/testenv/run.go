package testenv

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Run runs run(ctx) in a goroutine until stop is called or the test ends, whichever is first.
// stop cancels ctx and waits for run to return, failing t when it returns an error other than
// ctx's or has not returned within a minute. stop is idempotent.
func Run(t testing.TB, run func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(time.Minute):
				t.Error("Run did not return within a minute of its context's end")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// FreeAddr returns a loopback host:port nothing listens on now, for a server the test starts.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// FreePorts returns the first of n consecutive loopback ports that are free now, for engines that
// take their ports as settings and start slowly (a Kafka broker takes seconds to bind). They are
// chosen in 20000-32699, below Linux's ephemeral range (32768-60999), so the source port of some
// other test's outbound connection cannot take one between this check and the engine's bind,
// as it can with a port from FreeAddr.
func FreePorts(t testing.TB, n int) int {
	t.Helper()
	const low, high = 20000, 32700
	start := low + rand.IntN(high-low)
	for i := 0; i < high-low; i += n {
		base := low + (start-low+i)%(high-low-n)
		if portsFree(base, n) {
			return base
		}
	}
	t.Fatalf("no %d free consecutive ports in %d-%d", n, low, high-1)
	return 0
}

// portsFree reports whether nothing listens on 127.0.0.1 at any of base..base+n-1.
func portsFree(base, n int) bool {
	for p := base; p < base+n; p++ {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		_ = ln.Close()
	}
	return true
}
