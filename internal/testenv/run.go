package testenv

import (
	"context"
	"errors"
	"net"
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
