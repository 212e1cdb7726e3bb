package webhooks

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics of a Dispatcher (namespace carehub, subsystem webhooks).
type metrics struct {
	recorded        prometheus.Counter
	handedOver      prometheus.Counter // recorded straight into a lane's inbox (inbox.go)
	deadLettered    prometheus.Counter
	reclaimed       prometheus.Counter
	lanes           prometheus.Gauge
	attempts        *prometheus.CounterVec
	attemptSeconds  prometheus.Histogram
	firstAttemptLag prometheus.Histogram
	claimSeconds    prometheus.Histogram
	outcomeWrites   prometheus.Histogram // deliveries per outcome write
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		recorded: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "webhooks",
			Name: "deliveries_recorded_total", Help: "Deliveries recorded from consumed events."}),
		handedOver: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "webhooks",
			Name: "deliveries_handed_over_total", Help: "Deliveries recorded delivering and handed straight to their subscription's lane, without a claim."}),
		deadLettered: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "webhooks",
			Name: "dead_lettered_total", Help: "Events whose deliveries Postgres refused, set aside on the dead-letter topic (alert on any)."}),
		reclaimed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "webhooks",
			Name: "deliveries_reclaimed_total", Help: "Deliveries taken back from an expired lease (a dispatcher died mid-attempt)."}),
		lanes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "carehub", Subsystem: "webhooks",
			Name: "lanes_active", Help: "Subscriptions being served by this dispatcher."}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "webhooks",
			Name: "attempts_total", Help: "Delivery attempts by result (success, http_error, no_response)."}, []string{"result"}),
		attemptSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "carehub", Subsystem: "webhooks",
			Name: "attempt_duration_seconds", Help: "Duration of delivery attempts.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}),
		firstAttemptLag: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "carehub", Subsystem: "webhooks",
			Name: "first_attempt_lag_seconds", Help: "Time from an event's creation to its first delivery attempt.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18)}),
		claimSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "carehub", Subsystem: "webhooks",
			Name: "claim_duration_seconds", Help: "Duration of a claim of due deliveries (the lanes it starts).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		outcomeWrites: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "carehub", Subsystem: "webhooks",
			Name: "outcome_write_deliveries", Help: "Deliveries whose outcomes one write records (a lane writes what finished since its last write).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10)}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.recorded, m.handedOver, m.deadLettered, m.reclaimed, m.lanes, m.attempts, m.attemptSeconds, m.firstAttemptLag,
			m.claimSeconds, m.outcomeWrites} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *metrics) observe(out outcome) {
	m.attemptSeconds.Observe(out.Latency.Seconds())
	switch {
	case out.Succeeded():
		m.attempts.WithLabelValues("success").Inc()
	case out.StatusCode != 0:
		m.attempts.WithLabelValues("http_error").Inc()
	default:
		m.attempts.WithLabelValues("no_response").Inc()
	}
}
