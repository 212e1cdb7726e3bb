package wsfleet

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// Hist is a lock-free latency histogram in microseconds: exact below 32 µs, then 32 buckets per
// power of two (at most 3 % relative error), up to 2^40 µs. Many goroutines record at once.
// The zero value is empty and ready.
type Hist struct {
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

// Record adds one latency (negative ones count as 0).
func (h *Hist) Record(d time.Duration) {
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

// Reset empties the histogram; nothing may record meanwhile.
func (h *Hist) Reset() {
	for i := range h.buckets {
		h.buckets[i].Store(0)
	}
	h.n.Store(0)
	h.max.Store(0)
}

// Quantile returns the q-quantile (nearest rank), 0 for an empty histogram.
func (h *Hist) Quantile(q float64) time.Duration {
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

// Summary is a distribution as the reports give it, in milliseconds.
type Summary struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50Ms"`
	P90   float64 `json:"p90Ms"`
	P99   float64 `json:"p99Ms"`
	P999  float64 `json:"p999Ms"`
	Max   float64 `json:"maxMs"`
}

// Summary returns the distribution recorded so far.
func (h *Hist) Summary() Summary {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return Summary{Count: h.n.Load(), P50: ms(h.Quantile(0.5)), P90: ms(h.Quantile(0.9)), P99: ms(h.Quantile(0.99)),
		P999: ms(h.Quantile(0.999)), Max: float64(h.max.Load()) / 1000}
}
