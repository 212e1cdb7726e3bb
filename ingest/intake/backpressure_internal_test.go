package intake

import (
	"testing"
	"time"
)

// TestStoreEstimate drives the estimator with measurements at chosen times: the store rate is
// learnt from intervals that begin with a backlog, idle intervals leave it alone, and a writer
// that stops storing pushes the estimate past any budget.
func TestStoreEstimate(t *testing.T) {
	l := &lagWatch{staleAfter: time.Hour}
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	estimate := func() time.Duration {
		t.Helper()
		d, fresh := l.storeEstimate()
		if !fresh {
			t.Fatal("not fresh")
		}
		return d
	}
	if _, fresh := l.storeEstimate(); fresh {
		t.Fatal("an estimate before any measurement")
	}
	l.observe(at(0), 5_000, 0) // cold start: the initial rate, 10,000/s
	if d := estimate(); d != 500*time.Millisecond {
		t.Fatalf("cold estimate %v", d)
	}
	// A busy writer stores 20,000/s: the rate converges on it.
	committed := int64(0)
	for i := 1; i <= 30; i++ {
		committed += 5_000
		l.observe(at(i*250), 40_000, committed)
	}
	if d := estimate(); d < 1900*time.Millisecond || d > 2100*time.Millisecond {
		t.Fatalf("40,000 behind at 20,000/s: %v", d)
	}
	// Idle intervals (the backlog drained, a trickle arrives) do not lower it.
	l.observe(at(31*250), 5_000, committed+5_000)
	committed += 5_000
	l.observe(at(32*250), 10, committed+5_000) // drained at 20,000/s
	committed += 5_000
	for i := 33; i < 40; i++ {
		committed += 10
		l.observe(at(i*250), 10, committed)
	}
	if d := estimate(); d != 0 {
		t.Fatalf("no backlog, estimate %v", d)
	}
	l.observe(at(40*250), 20_000, committed)
	if d := estimate(); d < 900*time.Millisecond || d > 1100*time.Millisecond {
		t.Fatalf("20,000 behind after idling: %v", d)
	}
	// The writer stops: nothing is committed while the lag stands.
	for i := 41; i < 80; i++ {
		l.observe(at(i*250), 20_000, committed)
	}
	if d := estimate(); d < time.Minute {
		t.Fatalf("stopped writer, estimate %v", d)
	}
}
