package observations

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"carehub/storage/kafka"
)

// lagWatch measures the observation writer group's lag every interval and caches it, so that
// intake can refuse work (503 + Retry-After) while the writers are too far behind instead of
// letting the backlog grow without bound. Requests read the cached value; they never wait for
// a measurement.
//
// A measurement that fails keeps the last value; when no measurement has succeeded for
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

	lag      atomic.Int64
	measured atomic.Int64 // unix nanoseconds of the last successful measurement
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
			n := kafka.TotalLag(lags)
			l.lag.Store(n)
			l.measured.Store(time.Now().UnixNano())
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

// current returns the cached lag and whether it is fresh enough to act on.
func (l *lagWatch) current() (int64, bool) {
	at := l.measured.Load()
	if at == 0 {
		return 0, false
	}
	return l.lag.Load(), time.Since(time.Unix(0, at)) <= l.staleAfter
}
