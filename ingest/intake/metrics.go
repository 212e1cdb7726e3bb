package intake

import (
	"carehub/kernel/telemetry"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are intake's Prometheus metrics (namespace carehub, subsystem ingest).
type metrics struct {
	accepted    prometheus.Counter
	rejected    *prometheus.CounterVec // by entry error code
	requests    *prometheus.CounterVec // by format and outcome
	throttled   prometheus.Counter
	replayed    prometheus.Counter
	lag         prometheus.Gauge
	produce     prometheus.Histogram
	requestSize prometheus.Histogram
}

func newMetrics() *metrics {
	m := &metrics{
		accepted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "ingest",
			Name: "observations_accepted_total", Help: "Observations answered 202: committed to Kafka."}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "ingest",
			Name: "observations_rejected_total", Help: "Observations rejected by validation, by entry error code."}, []string{"code"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "ingest",
			Name: "requests_total", Help: "Observation ingest requests by body format and outcome (accepted, invalid, too_large, unsupported_media, bad_request, conflict, unavailable, denied, replayed, error)."}, []string{"format", "outcome"}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "ingest",
			Name: "backpressure_rejections_total", Help: "Ingest requests answered 503 because the observation writers' lag was past the bound."}),
		replayed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "ingest",
			Name: "idempotent_replays_total", Help: "Ingest requests answered from an earlier request with the same Idempotency-Key."}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "carehub", Subsystem: "ingest",
			Name: "observation_writer_lag", Help: "Records of carehub.observations.v1 the observation writer group has yet to store, as intake last measured."}),
		produce: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "carehub", Subsystem: "ingest",
			Name: "commit_seconds", Help: "From a request's last record queued to its Kafka transaction committed (the wait for the broker's acknowledgement).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}),
		requestSize: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "carehub", Subsystem: "ingest",
			Name: "request_observations", Help: "Observations per ingest request (valid and invalid).",
			Buckets: []float64{1, 10, 100, 500, 1000, 2500, 5000, 10000}}),
	}
	for _, c := range []string{CodeInvalidJSON, CodeEntryTooLarge, CodeInvalidEntry, CodeInvalidResource, CodeInvalidID,
		CodeInvalidStatus, CodeMissingCode, CodeInvalidSubject, CodeUnknownPatient, CodeInvalidEffective, CodeInvalidValue} {
		m.rejected.WithLabelValues(c)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.accepted, m.rejected, m.requests, m.throttled, m.replayed, m.lag, m.produce, m.requestSize}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	return telemetry.Exclusive(reg, "ingest metrics are already registered: one Intake per registry", m.collectors()...)
}
