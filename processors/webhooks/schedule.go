package webhooks

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultSchedule is the delay before each attempt of a delivery (DECISIONS §5): immediately,
// then 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and 10 h after the previous failure. A delivery whose
// last attempt fails becomes failed.
var DefaultSchedule = []time.Duration{0, 5 * time.Second, 5 * time.Minute, 30 * time.Minute,
	2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour}

// Jitter is the relative spread applied to every retry delay (±10 %), so that the retries of a
// burst that failed together do not arrive together.
const Jitter = 0.10

// maxRetryAfter caps a receiver's Retry-After.
const maxRetryAfter = 24 * time.Hour

// retryDelay returns the delay before attempt number next (0-based: the attempt after
// schedule_pos attempts), jittered, and whether there is one. retryAfter, when positive, is a
// lower bound the receiver asked for (429, 503).
func retryDelay(schedule []time.Duration, next int, retryAfter time.Duration) (time.Duration, bool) {
	if next >= len(schedule) {
		return 0, false
	}
	d := schedule[next]
	if d > 0 {
		d = time.Duration(float64(d) * (1 - Jitter + 2*Jitter*rand.Float64()))
	}
	return max(d, min(retryAfter, maxRetryAfter)), true
}

// parseRetryAfter reads a Retry-After header: delay seconds or an HTTP date. It returns 0 when
// absent or unreadable.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		return min(time.Duration(secs)*time.Second, maxRetryAfter)
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), maxRetryAfter)
	}
	return 0
}
