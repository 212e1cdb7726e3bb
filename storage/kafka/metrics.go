package kafka

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/plugin/kprom"
)

// kpromGaugeNames are kprom's gauges named with the counter suffix _total (kprom v1.5 hard-codes
// them), and the names carehub serves them under, so /metrics follows Prometheus' conventions
// (promlint, checked in api/server's TestMetricsConventions).
var kpromGaugeNames = map[string]string{
	"carehub_kafka_buffered_produce_records_total": "carehub_kafka_buffered_produce_records",
	"carehub_kafka_buffered_fetch_records_total":   "carehub_kafka_buffered_fetch_records",
}

// conventionalMetrics is kprom's collector with kpromGaugeNames renamed.
type conventionalMetrics struct {
	*kprom.Metrics
	renamed map[string]*prometheus.Desc // kprom's name → carehub's desc
}

func newConventionalMetrics(m *kprom.Metrics, clientID string) *conventionalMetrics {
	c := &conventionalMetrics{Metrics: m, renamed: map[string]*prometheus.Desc{}}
	for from, to := range kpromGaugeNames {
		what := "produced"
		if strings.Contains(to, "fetch") {
			what = "consumed"
		}
		c.renamed[from] = prometheus.NewDesc(to, "Records buffered within the client, ready to be "+what+".",
			nil, prometheus.Labels{"client_id": clientID})
	}
	return c
}

// kpromName returns the metric name of a kprom descriptor (Desc exposes it only in String).
func kpromName(d *prometheus.Desc) string {
	_, rest, _ := strings.Cut(d.String(), `fqName: "`)
	name, _, _ := strings.Cut(rest, `"`)
	return name
}

// Describe implements prometheus.Collector.
func (c *conventionalMetrics) Describe(ch chan<- *prometheus.Desc) {
	inner := make(chan *prometheus.Desc)
	go func() { c.Metrics.Describe(inner); close(inner) }()
	for d := range inner {
		if r, ok := c.renamed[kpromName(d)]; ok {
			d = r
		}
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *conventionalMetrics) Collect(ch chan<- prometheus.Metric) {
	inner := make(chan prometheus.Metric)
	go func() { c.Metrics.Collect(inner); close(inner) }()
	for m := range inner {
		if r, ok := c.renamed[kpromName(m.Desc())]; ok {
			var pb dto.Metric
			if err := m.Write(&pb); err != nil {
				ch <- prometheus.NewInvalidMetric(r, err)
				continue
			}
			m = prometheus.MustNewConstMetric(r, prometheus.GaugeValue, pb.GetGauge().GetValue())
		}
		ch <- m
	}
}
