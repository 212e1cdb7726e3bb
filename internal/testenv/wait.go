package testenv

import (
	"testing"
	"time"
)

// Eventually polls cond every 20 ms until it holds, and fails t naming what when timeout passes
// first. Tests wait on the condition they need, never a fixed sleep.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
