package loadcli

import (
	"math"
	"testing"
	"time"

	"carehub/loadtest/loadcli/loadclitest"
)

func TestLoadValidate(t *testing.T) {
	ok := func() Load { return Load{Clients: 4, Duration: 10 * time.Second, Drain: 30 * time.Second, Batch: 1} }
	loadclitest.Validate(t, ok, (*Load).Validate, []loadclitest.Case[Load]{
		{Name: "defaults", Edit: func(*Load) {}},
		{Name: "too many clients", Edit: func(l *Load) { l.Clients = MaxClients + 1 }, Want: "-c"},
		{Name: "no clients", Edit: func(l *Load) { l.Clients = 0 }, Want: "-c"},
		{Name: "unbounded duration", Edit: func(l *Load) { l.Duration = MaxDuration + time.Second }, Want: "-d"},
		{Name: "zero duration", Edit: func(l *Load) { l.Duration = 0 }, Want: "-d"},
		{Name: "drain too long", Edit: func(l *Load) { l.Drain = MaxDrain + time.Second }, Want: "-drain"},
		{Name: "negative rate", Edit: func(l *Load) { l.Rate = -1 }, Want: "-rate"},
		{Name: "payload too large", Edit: func(l *Load) { l.Payload = MaxPayload + 1 }, Want: "-payload"},
		{Name: "batch of 1,000", Edit: func(l *Load) { l.Batch = MaxBatch }},
		{Name: "batch too large", Edit: func(l *Load) { l.Batch = MaxBatch + 1 }, Want: "-batch"},
		{Name: "batch zero", Edit: func(l *Load) { l.Batch = 0 }, Want: "-batch"},
	})
}

func TestLoopback(t *testing.T) {
	for raw, ok := range map[string]bool{
		"http://127.0.0.1:8080": true, "http://localhost:8080": true, "https://[::1]:8443": true,
		"http://10.0.0.5:8080": false, "https://carehub.example.com": false, "127.0.0.1:8080": false,
	} {
		if err := LoopbackURL(raw); (err == nil) != ok {
			t.Errorf("LoopbackURL(%q) = %v, want ok=%v", raw, err, ok)
		}
	}
}

// TestPaceAnyRate: a rate of any size paces (or, for 0 and NaN, does not) without panicking.
func TestPaceAnyRate(t *testing.T) {
	for _, rate := range []float64{0, math.NaN(), -1, 1e-300, 0.5, 1e4, 1e12, math.Inf(1)} {
		pace, stop := Pace(rate)
		if (pace != nil) != (rate > 0) {
			t.Errorf("Pace(%v): ticking %v", rate, pace != nil)
		}
		stop()
	}
}

// TestPaceDropsNoTick: a client that falls behind gets every tick it missed, each carrying the
// time it was due, one interval after the one before; none is dropped as a time.Ticker drops
// them.
func TestPaceDropsNoTick(t *testing.T) {
	const rate = 1000 // a tick due every millisecond
	pace, stop := Pace(rate)
	var due []time.Time
	for i := range 40 {
		if i == 10 || i == 20 {
			time.Sleep(25 * time.Millisecond) // behind by 25 ticks
		}
		due = append(due, <-pace)
	}
	for i := 1; i < len(due); i++ {
		if d := due[i].Sub(due[i-1]); d != time.Millisecond {
			t.Fatalf("tick %d due %v after tick %d, want 1ms: a tick was dropped or repeated", i, d, i-1)
		}
	}
	stop()
	stop() // twice is harmless
}
