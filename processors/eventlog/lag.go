package eventlog

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"carehub/kernel/telemetry"
	"carehub/storage/kafka"
)

// LagOptions configures a LagMonitor.
type LagOptions struct {
	// Interval between refreshes. Default DefaultLagInterval.
	Interval time.Duration
	// Registerer receives the gauge carehub_kafka_consumer_lag{group, topic, partition}.
	// Monitors of several groups may share one Registerer: they share the gauge. Required for
	// the gauge to be exported at all.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// LagMonitor exports a consumer group's lag per partition (records not yet committed, from
// storage/kafka.Lag) as the gauge carehub_kafka_consumer_lag, refreshed periodically. Any
// consumer group can use it: the event log writer runs one for its group, and other writers
// (webhooks, observations, workflows) can run their own with the same Registerer.
type LagMonitor struct {
	adm    *kadm.Client
	group  string
	topics []string
	opts   LagOptions
	gauge  *prometheus.GaugeVec

	mu   sync.Mutex
	seen map[[2]string]bool // {topic, partition} series this monitor has set
}

// NewLagMonitor returns a monitor of group on topics (all the group's topics when empty). adm
// is borrowed, not closed.
func NewLagMonitor(adm *kadm.Client, group string, topics []string, opts LagOptions) *LagMonitor {
	if opts.Interval <= 0 {
		opts.Interval = DefaultLagInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	gauge := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "carehub", Subsystem: "kafka", Name: "consumer_lag",
		Help: "Records a consumer group has not yet committed, per topic partition.",
	}, []string{"group", "topic", "partition"})
	if opts.Registerer != nil {
		gauge = telemetry.Shared(opts.Registerer, gauge)
	}
	return &LagMonitor{adm: adm, group: group, topics: topics, opts: opts, gauge: gauge, seen: map[[2]string]bool{}}
}

// Run refreshes the gauge every interval until ctx is done, then removes the group's series and
// returns nil. Failed refreshes are logged and leave the previous values.
func (m *LagMonitor) Run(ctx context.Context) error {
	t := time.NewTicker(m.opts.Interval)
	defer t.Stop()
	defer m.clear()
	for {
		if _, err := m.Refresh(ctx); err != nil && ctx.Err() == nil {
			m.opts.Logger.Warn("refresh consumer lag", "group", m.group, "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Refresh queries the lag once and updates the gauge; it returns the per-partition figures.
func (m *LagMonitor) Refresh(ctx context.Context) ([]kafka.PartitionLag, error) {
	lags, err := kafka.Lag(ctx, m.adm, m.group, m.topics...)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := map[[2]string]bool{}
	for _, l := range lags {
		p := strconv.Itoa(int(l.Partition))
		m.gauge.WithLabelValues(m.group, l.Topic, p).Set(float64(l.Lag))
		now[[2]string{l.Topic, p}] = true
	}
	for k := range m.seen {
		if !now[k] {
			m.gauge.DeleteLabelValues(m.group, k[0], k[1])
		}
	}
	m.seen = now
	return lags, nil
}

func (m *LagMonitor) clear() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.seen {
		m.gauge.DeleteLabelValues(m.group, k[0], k[1])
	}
	m.seen = map[[2]string]bool{}
}
