package consume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// metrics are one consumer's series of the carehub_consumer_* families, labelled
// consumer=Config.Name. Every runner on a registry shares the families.
type metrics struct {
	records  prometheus.Counter
	batches  prometheus.Counter
	failures prometheus.Counter
	poison   prometheus.Counter
	latency  prometheus.Observer
}

func newMetrics(reg prometheus.Registerer, consumer string) *metrics {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "consumer", Name: name, Help: help},
			[]string{"consumer"})
	}
	records := counter("records_total", "Records handed to a consumer's handler (redeliveries included).")
	batches := counter("batches_total", "Polls a consumer's handler handled (failed ones included).")
	failures := counter("failures_total", "Batches a consumer's handler failed; they are rewound and retried.")
	poison := counter("poison_records_total", "Records a consumer could not decode; logged by position and skipped.")
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "carehub", Subsystem: "consumer",
		Name: "handler_seconds", Help: "Duration of one call of a consumer's handler (one poll's records).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14)}, []string{"consumer"})
	if reg != nil {
		records, batches, failures, poison = shared(reg, records), shared(reg, batches), shared(reg, failures), shared(reg, poison)
		latency = shared(reg, latency)
	}
	return &metrics{records: records.WithLabelValues(consumer), batches: batches.WithLabelValues(consumer),
		failures: failures.WithLabelValues(consumer), poison: poison.WithLabelValues(consumer),
		latency: latency.WithLabelValues(consumer)}
}

// shared registers c on reg, or returns the family already registered there by another runner.
func shared[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	if err != nil {
		panic(fmt.Sprintf("consume: register metric: %v", err))
	}
	return c
}

// measure is the metrics middleware: records and batches handed to next, their failures and
// next's duration. The runner puts it outermost, so it measures what every other layer does.
func (m *metrics) measure(next Handler) Handler {
	return func(ctx context.Context, recs []*kgo.Record) error {
		start := time.Now()
		err := next(ctx, recs)
		m.observe(start, len(recs), err)
		return err
	}
}

// observe counts a batch of n records handled since start, and its failure.
func (m *metrics) observe(start time.Time, n int, err error) {
	m.latency.Observe(time.Since(start).Seconds())
	m.records.Add(float64(n))
	m.batches.Inc()
	if err != nil {
		m.failures.Inc()
	}
}
