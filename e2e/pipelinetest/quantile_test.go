package pipelinetest

import (
	"testing"
	"time"
)

func TestQuantile(t *testing.T) {
	ds := func(n int) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = time.Duration(i+1) * time.Millisecond
		}
		return out
	}
	cases := []struct {
		n    int
		q    float64
		want time.Duration
	}{
		{200, 0.99, 198 * time.Millisecond},
		{200, 0.50, 100 * time.Millisecond},
		{100, 0.99, 99 * time.Millisecond},
		{10, 0.99, 10 * time.Millisecond},
		{1, 0.5, 1 * time.Millisecond},
		{3, 0, 1 * time.Millisecond},
		{3, 1, 3 * time.Millisecond},
	}
	for _, c := range cases {
		if got := Quantile(ds(c.n), c.q); got != c.want {
			t.Errorf("Quantile(1..%d ms, %v) = %v, want %v", c.n, c.q, got, c.want)
		}
	}
	if got := Quantile(nil, 0.5); got != 0 {
		t.Errorf("Quantile(empty) = %v", got)
	}
}
