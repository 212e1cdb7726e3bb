package intake

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"carehub/storage/kafka"
)

// Backpressure by time: intake refuses (503, Retry-After) when what is already accepted would
// take the writers longer than the latency budget to store, estimated as lag ÷ store rate.
const (
	// busyLag is the lag (records) over which the writers are taken to be busy: an interval that
	// starts with more measures what they can store, not what arrives. Below it the backlog is
	// nothing to refuse for (each transaction leaves a control record per partition: a few
	// records of lag are noise).
	busyLag = 64
	// initialRate is the store rate assumed until one is measured (records/s): about what one
	// writer stores on a small machine, so a cold start neither refuses at once nor lets a
	// minute of backlog in before the first measurement corrects it.
	initialRate = 10_000
	// rateWeight is the weight of a new measurement in the store rate's moving average: at a
	// 250 ms interval a stopped writer's rate halves in about half a second.
	rateWeight = 0.3
	// maxRetryAfter bounds the Retry-After of a refusal.
	maxRetryAfter = 30 * time.Second
)

// lagWatch measures the observation writer group's lag and store rate every interval and
// caches them, so that intake can refuse work while what it accepted would not be stored within
// the latency budget (or, as a hard bound, while the lag is over MaxLag), instead of letting the
// backlog grow without bound. Requests read the cached values; they never wait for a
// measurement.
//
// The store rate is the advance of the group's committed offsets per second, averaged over the
// intervals that began with a backlog (busyLag): then it is what the writers can do, not what
// clients send. A stopped writer's rate falls towards zero and the estimate past any budget.
//
// A measurement that fails keeps the last values; when no measurement has succeeded for
// staleAfter, intake stops refusing (fails open): a broken lag query must not stop ingest
// while the broker itself accepts records, and a broken broker fails produce anyway.
type lagWatch struct {
	adm        *kadm.Client
	group      string
	topic      string
	interval   time.Duration
	staleAfter time.Duration
	logger     *slog.Logger
	gauge      prometheus.Gauge

	mu        sync.Mutex
	lag       int64
	committed int64     // sum of the committed offsets at measured
	rate      float64   // records/s the writers store, moving average
	measured  time.Time // of the last successful measurement; zero: none yet
}

func (l *lagWatch) run(ctx context.Context) {
	tick := time.NewTicker(l.interval)
	defer tick.Stop()
	failing := false
	for {
		mctx, cancel := context.WithTimeout(ctx, max(l.interval*4, 2*time.Second))
		lags, err := kafka.Lag(mctx, l.adm, l.group, l.topic)
		cancel()
		switch {
		case err == nil:
			var committed int64
			for _, p := range lags {
				committed += max(p.Committed, p.Start, 0)
			}
			n := kafka.TotalLag(lags)
			l.observe(time.Now(), n, committed)
			l.gauge.Set(float64(n))
			if failing {
				l.logger.Info("observation writer lag measurable again", "lag", n)
				failing = false
			}
		case ctx.Err() == nil && !failing:
			l.logger.Warn("cannot measure observation writer lag; backpressure uses the last value", "err", err)
			failing = true
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// observe records a measurement: lag and the sum of committed offsets at now.
func (l *lagWatch) observe(now time.Time, lag, committed int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.measured.IsZero() {
		l.rate = initialRate
	} else if dt := now.Sub(l.measured).Seconds(); dt > 0 && l.lag > busyLag {
		sample := float64(max(committed-l.committed, 0)) / dt
		l.rate += rateWeight * (sample - l.rate)
	}
	l.lag, l.committed, l.measured = lag, committed, now
}

// current returns the cached lag and whether it is fresh enough to act on.
func (l *lagWatch) current() (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lag, l.freshLocked()
}

func (l *lagWatch) freshLocked() bool {
	return !l.measured.IsZero() && time.Since(l.measured) <= l.staleAfter
}

// storeEstimate returns how long the writers need to store what is accepted now (lag ÷ store
// rate; +Inf when they store nothing) and whether the measurement is fresh enough to act on.
func (l *lagWatch) storeEstimate() (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.freshLocked() {
		return 0, false
	}
	if l.lag <= busyLag {
		return 0, true
	}
	secs := float64(l.lag) / l.rate
	if l.rate < 1 || secs > math.MaxInt64/float64(time.Second) {
		return time.Duration(math.MaxInt64), true
	}
	return time.Duration(secs * float64(time.Second)), true
}
