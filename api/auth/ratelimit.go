package auth

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"carehub/kernel/config"
)

// Rate is a token bucket: PerSecond tokens refill continuously up to Burst.
type Rate struct {
	PerSecond float64
	Burst     int
}

// Class selects which limit applies to a request.
type Class int

// The limit classes of DECISIONS §3.
const (
	ClassDefault Class = iota // every authenticated request but ingest
	ClassIngest               // POST /v1/observations
)

// Limits are the rate limits per credential and per organization. Limits are per node: with N
// api nodes behind a balancer a credential gets up to N times the rate, which is the usual trade
// for not putting a shared store on every request's path.
//
// A request takes a token of its credential's bucket and then one of its organization's: an
// organization's keys together get OrgDefault (OrgIngest), however many keys it makes. Without
// it, one tenant holding twenty keys had twenty times a key's rate of the node, and its traffic
// was paid for in the other tenants' latency (docs/SECURITY.md, round two). The platform
// operator's keys belong to no organization and have the per-key limits only.
type Limits struct {
	Default    Rate // default 50/s, burst 100
	Ingest     Rate // default 200/s, burst 400
	OrgDefault Rate // default 100/s, burst 200
	OrgIngest  Rate // default 1,000/s, burst 2,000
	// IsIngest classifies a request (default: POST /v1/observations).
	IsIngest func(*http.Request) bool
	// MaxTracked bounds the buckets kept per class (default 100,000). Past it, buckets that
	// have refilled completely are dropped first (dropping them changes nothing), then random
	// ones.
	MaxTracked int
	// InFlight bounds the requests one credential (a JWT counts against its key) has in
	// progress on the node at once, whatever its rate: past it a request is 429 at once.
	// Default DefaultMaxInFlight.
	InFlight int
}

// DefaultLimits returns the limits of DECISIONS §3.
func DefaultLimits() Limits {
	return Limits{Default: Rate{PerSecond: 50, Burst: 100}, Ingest: Rate{PerSecond: 200, Burst: 400},
		OrgDefault: Rate{PerSecond: 100, Burst: 200}, OrgIngest: Rate{PerSecond: 1000, Burst: 2000}}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.Default.PerSecond <= 0 || l.Default.Burst <= 0 {
		l.Default = d.Default
	}
	if l.Ingest.PerSecond <= 0 || l.Ingest.Burst <= 0 {
		l.Ingest = d.Ingest
	}
	if l.OrgDefault.PerSecond <= 0 || l.OrgDefault.Burst <= 0 {
		l.OrgDefault = d.OrgDefault
	}
	if l.OrgIngest.PerSecond <= 0 || l.OrgIngest.Burst <= 0 {
		l.OrgIngest = d.OrgIngest
	}
	if l.IsIngest == nil {
		l.IsIngest = func(r *http.Request) bool {
			return r.Method == http.MethodPost && r.URL.Path == "/v1/observations"
		}
	}
	config.Default(&l.MaxTracked, 100_000)
	config.Default(&l.InFlight, DefaultMaxInFlight)
	return l
}

func (l Limits) class(r *http.Request) Class {
	if l.IsIngest(r) {
		return ClassIngest
	}
	return ClassDefault
}

// limiter holds the token buckets of one class, by credential (API key id; a JWT counts
// against its parent key, so exchanging tokens cannot multiply a key's rate) or organization.
// Each bucket is a golang.org/x/time/rate Limiter; limiter adds the bound on how many it keeps.
type limiter struct {
	rate Rate
	max  int

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
}

// decision is the outcome of taking one token, with what the RateLimit headers report.
type decision struct {
	allowed    bool
	limit      int           // the burst: the most requests a full bucket admits at once
	remaining  int           // whole tokens left
	reset      time.Duration // until the bucket is full again
	retryAfter time.Duration // until one token is available (when refused)
}

func newLimiter(r Rate, max int) *limiter {
	return &limiter{rate: r, max: max, buckets: map[string]*rate.Limiter{}}
}

// take spends one token of id's bucket at now, if there is one.
func (l *limiter) take(id string, now time.Time) decision {
	l.mu.Lock()
	b, ok := l.buckets[id]
	if !ok {
		if len(l.buckets) >= l.max {
			l.evictLocked(now)
		}
		b = rate.NewLimiter(rate.Limit(l.rate.PerSecond), l.rate.Burst) // starts full
		l.buckets[id] = b
	}
	l.mu.Unlock()
	d := decision{limit: l.rate.Burst, allowed: b.AllowN(now, 1)}
	tokens := b.TokensAt(now)
	if !d.allowed {
		d.retryAfter = l.seconds(1 - tokens)
	}
	d.remaining = int(tokens)
	d.reset = l.seconds(float64(l.rate.Burst) - tokens)
	return d
}

func (l *limiter) seconds(tokens float64) time.Duration {
	return time.Duration(tokens / l.rate.PerSecond * float64(time.Second))
}

// evictLocked drops the buckets that are full (dropping them changes nothing), then random ones
// until a tenth of the room is free.
func (l *limiter) evictLocked(now time.Time) {
	for id, b := range l.buckets {
		if b.TokensAt(now) >= float64(l.rate.Burst) {
			delete(l.buckets, id)
		}
	}
	for id := range l.buckets {
		if len(l.buckets) < l.max-l.max/10 {
			break
		}
		delete(l.buckets, id)
	}
}

// setHeaders writes the RateLimit headers (IETF draft "RateLimit header fields for HTTP"):
// Limit is the burst, Remaining the whole requests left now, Reset the seconds until the bucket
// is full again; a refusal adds Retry-After, the seconds until the next request is admitted.
func (d decision) setHeaders(h http.Header) {
	h.Set("RateLimit-Limit", strconv.Itoa(d.limit))
	h.Set("RateLimit-Remaining", strconv.Itoa(d.remaining))
	h.Set("RateLimit-Reset", strconv.Itoa(ceilSeconds(d.reset)))
	if !d.allowed {
		h.Set("Retry-After", strconv.Itoa(max(1, ceilSeconds(d.retryAfter))))
	}
}

func ceilSeconds(d time.Duration) int {
	return int((d + time.Second - 1) / time.Second)
}
