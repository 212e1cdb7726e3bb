package graphql

import (
	"context"
	"math"
	"sync"
	"time"
)

// Byte rates: what one credential's operations may fetch of large values a second, and what one
// organization's subscriptions may be sent a second. The answer-size budget (answer.go) bounds
// one operation; these bound a credential that sends such operations in a loop, and an
// organization whose subscribers are many and whose events are large. Each was, on its own, a
// way for one tenant to take the node's CPU from the others (issue 51's soak: a 100 KB event a
// second to the thousand subscriptions one organization may hold is 100 MB a second to encode
// and send; sixteen aliases of events { payload } in a loop read 16 MB from the store each).

// DefaultAnswerBytesPerSecond and DefaultFanOutBytesPerSecond are the rates' defaults; each
// bucket holds BurstSeconds of its rate.
const (
	DefaultAnswerBytesPerSecond = 8 << 20
	DefaultFanOutBytesPerSecond = 16 << 20
	BurstSeconds                = 4
)

// byteRate is a token bucket of bytes per key that may go into debt: an operation starts while
// its key has any bytes left and is charged what it used when it ends, so one large answer is
// not refused for want of room it cannot know it needs. Keys are API keys or organizations.
type byteRate struct {
	perSecond float64
	burst     float64
	now       func() time.Time

	mu      sync.Mutex
	buckets map[string]*byteBucket
}

type byteBucket struct {
	tokens float64
	at     time.Time
}

// maxBuckets bounds the keys a byteRate tracks; past it, the full buckets are dropped (dropping
// one changes nothing).
const maxBuckets = 100_000

func newByteRate(perSecond int64) *byteRate {
	if perSecond <= 0 {
		return nil // off
	}
	return &byteRate{perSecond: float64(perSecond), burst: float64(perSecond) * BurstSeconds, now: time.Now,
		buckets: map[string]*byteBucket{}}
}

// bucket returns key's bucket refilled to now; the caller holds mu.
func (r *byteRate) bucket(key string) *byteBucket {
	now := r.now()
	b := r.buckets[key]
	if b == nil {
		if len(r.buckets) >= maxBuckets {
			r.dropFull(now)
		}
		b = &byteBucket{tokens: r.burst, at: now}
		r.buckets[key] = b
	}
	b.tokens = math.Min(r.burst, b.tokens+now.Sub(b.at).Seconds()*r.perSecond)
	b.at = now
	return b
}

func (r *byteRate) dropFull(now time.Time) {
	for k, b := range r.buckets {
		if b.tokens+now.Sub(b.at).Seconds()*r.perSecond >= r.burst {
			delete(r.buckets, k)
		}
	}
}

// available returns the bytes key may use now (at most the burst), and when it has none, how
// long until it has some again.
func (r *byteRate) available(key string) (int64, time.Duration) {
	if r == nil {
		return math.MaxInt64, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.bucket(key)
	if b.tokens > 0 {
		return int64(b.tokens), 0
	}
	return 0, time.Duration((1 - b.tokens) / r.perSecond * float64(time.Second))
}

// spend charges n bytes to key, into debt if need be.
func (r *byteRate) spend(key string, n int64) {
	if r == nil || n <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bucket(key).tokens -= float64(n)
}

// wait charges n bytes to key and waits until key is out of debt again, or ctx ends.
func (r *byteRate) wait(ctx context.Context, key string, n int64) error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	b := r.bucket(key)
	b.tokens -= float64(n)
	var d time.Duration
	if b.tokens < 0 {
		d = time.Duration(-b.tokens / r.perSecond * float64(time.Second))
	}
	r.mu.Unlock()
	if d == 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
