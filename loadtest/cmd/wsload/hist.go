package main

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// hist is a lock-free latency histogram in microseconds: exact below 32 µs, then 32 buckets per
// power of two (at most 3 % relative error), up to 2^40 µs. Many goroutines record at once.
type hist struct {
	buckets [subBuckets * 42]atomic.Int64
	n       atomic.Int64
	max     atomic.Int64
}

const (
	subBits    = 5
	subBuckets = 1 << subBits
)

func bucketOf(us uint64) int {
	if us < subBuckets {
		return int(us)
	}
	shift := bits.Len64(us) - subBits - 1
	return subBuckets + shift*subBuckets + int(us>>shift) - subBuckets
}

// valueOf is the middle of bucket i, in microseconds.
func valueOf(i int) uint64 {
	if i < subBuckets {
		return uint64(i)
	}
	shift := (i - subBuckets) / subBuckets
	top := uint64((i-subBuckets)%subBuckets + subBuckets)
	return top<<shift + (uint64(1)<<shift)/2
}

func (h *hist) record(d time.Duration) {
	us := max(d.Microseconds(), 0)
	i := min(bucketOf(uint64(us)), len(h.buckets)-1)
	h.buckets[i].Add(1)
	h.n.Add(1)
	for {
		m := h.max.Load()
		if us <= m || h.max.CompareAndSwap(m, us) {
			break
		}
	}
}

// reset empties the histogram; nothing may record meanwhile.
func (h *hist) reset() {
	for i := range h.buckets {
		h.buckets[i].Store(0)
	}
	h.n.Store(0)
	h.max.Store(0)
}

// quantile returns the q-quantile (nearest rank), 0 for an empty histogram.
func (h *hist) quantile(q float64) time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	rank := max(int64(q*float64(n)+0.999999), 1)
	var seen int64
	for i := range h.buckets {
		seen += h.buckets[i].Load()
		if seen >= rank {
			return time.Duration(valueOf(i)) * time.Microsecond
		}
	}
	return time.Duration(h.max.Load()) * time.Microsecond
}

// summary is the distribution as the report gives it.
type summary struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50Ms"`
	P90   float64 `json:"p90Ms"`
	P99   float64 `json:"p99Ms"`
	P999  float64 `json:"p999Ms"`
	Max   float64 `json:"maxMs"`
}

func (h *hist) summary() summary {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return summary{Count: h.n.Load(), P50: ms(h.quantile(0.5)), P90: ms(h.quantile(0.9)), P99: ms(h.quantile(0.99)),
		P999: ms(h.quantile(0.999)), Max: float64(h.max.Load()) / 1000}
}
