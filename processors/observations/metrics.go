package observations

import (
	"carehub/kernel/telemetry"

	"github.com/prometheus/client_golang/prometheus"
)

// writerMetrics are the writer's Prometheus metrics (namespace carehub, subsystem observations).
type writerMetrics struct {
	stored         prometheus.Counter
	duplicates     prometheus.Counter
	skipped        *prometheus.CounterVec
	acceptToStored prometheus.Histogram
	batchSeconds   prometheus.Histogram
	batchSize      prometheus.Histogram
}

// AcceptToStoredBuckets are the buckets of carehub_observations_accept_to_stored_seconds:
// fine around the default 1 s latency budget, where a p99 is read against it (with only 1
// and 2.5, a p99 of 1.1 s read as anything up to 2.4 s).
var AcceptToStoredBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, .75, 1, 1.25, 1.5, 2, 2.5, 5, 10, 30, 60, 120}

func newWriterMetrics(reg prometheus.Registerer) (*writerMetrics, error) {
	m := &writerMetrics{
		stored: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "observations",
			Name: "stored_total", Help: "Observations the writer stored for the first time."}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "observations",
			Name: "duplicates_total", Help: "Observation records whose id was already stored (redeliveries, repeated client ids); nothing was written."}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "observations",
			Name: "skipped_total", Help: "Observation records that can never be stored, by reason."}, []string{"reason"}),
		acceptToStored: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "carehub", Subsystem: "observations",
			Name: "accept_to_stored_seconds", Help: "Time from intake accepting an observation to the writer's Postgres commit of it.",
			Buckets: AcceptToStoredBuckets}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "carehub", Subsystem: "observations",
			Name: "store_batch_seconds", Help: "Duration of one batch's store transaction.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "carehub", Subsystem: "observations",
			Name: "store_batch_records", Help: "Records per store transaction.",
			Buckets: []float64{1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000}}),
	}
	for _, reason := range []string{"invalid_message", "unknown_patient", "rejected_by_database"} {
		m.skipped.WithLabelValues(reason)
	}
	if err := telemetry.Exclusive(reg, "observation writer metrics are already registered: run one writer per registry", m.collectors()...); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *writerMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.stored, m.duplicates, m.skipped, m.acceptToStored, m.batchSeconds, m.batchSize}
}

func (m *writerMetrics) unregister(reg prometheus.Registerer) {
	telemetry.Unregister(reg, m.collectors()...)
}
