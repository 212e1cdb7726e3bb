package loadtest

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseExpositionAndQuantile(t *testing.T) {
	const text = `# HELP carehub_observations_stored_total x
# TYPE carehub_observations_stored_total counter
carehub_observations_stored_total 1500
carehub_observations_accept_to_stored_seconds_bucket{le="0.1"} 100
carehub_observations_accept_to_stored_seconds_bucket{le="1"} 900
carehub_observations_accept_to_stored_seconds_bucket{le="10"} 1000
carehub_observations_accept_to_stored_seconds_bucket{le="+Inf"} 1000
carehub_observations_accept_to_stored_seconds_sum 123
carehub_other_total{le="1"} 5
`
	var s snapshot
	s.buckets = map[float64]float64{}
	if err := parseExposition(strings.NewReader(text), &s); err != nil {
		t.Fatal(err)
	}
	if s.stored != 1500 || len(s.buckets) != 4 || s.buckets[math.Inf(1)] != 1000 {
		t.Fatalf("parsed %+v", s)
	}
	before := map[float64]float64{}
	if q, capped := quantile(0.5, before, s.buckets); capped || math.Abs(q-0.55) > 1e-9 {
		t.Fatalf("p50 = %v (capped %v); want 0.55", q, capped)
	}
	if q, capped := quantile(0.99, before, s.buckets); capped || math.Abs(q-9.1) > 1e-9 {
		t.Fatalf("p99 = %v; want 9.1", q)
	}
	s.buckets[math.Inf(1)] = 2000
	if q, capped := quantile(0.99, before, s.buckets); !capped || q != 10 {
		t.Fatalf("p99 past the last bucket = %v, capped %v", q, capped)
	}
	if q, _ := quantile(0.5, s.buckets, s.buckets); !math.IsNaN(q) {
		t.Fatalf("no observations: %v", q)
	}
}

func TestLoopbackOnly(t *testing.T) {
	for addr, ok := range map[string]bool{"http://127.0.0.1:8080": true, "http://localhost:1": true, "http://[::1]:2": true,
		"http://10.0.0.1:8080": false, "https://example.com": false, "ftp://127.0.0.1": false} {
		if got := loopbackURL(addr) == nil; got != ok {
			t.Errorf("loopbackURL(%s) ok=%v; want %v", addr, got, ok)
		}
	}
}

func TestConfigRate(t *testing.T) {
	for _, tc := range []struct {
		rate float64
		ok   bool
	}{{0, true}, {12_000, true}, {-1, false}, {math.NaN(), false}, {math.Inf(1), false}} {
		cfg := Config{URL: "http://127.0.0.1:8080", Keys: []string{"k"}, Devices: 1, Batch: 1, Duration: time.Second,
			Format: "mixed", Rate: tc.rate}
		if err := cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("rate %v: Validate() = %v, want ok %v", tc.rate, err, tc.ok)
		}
	}
}
