package eventlog

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"carehub/kernel/config"
	"carehub/kernel/telemetry"
	"carehub/kernel/tick"
	"carehub/storage/kafka"
)

// LagConfig configures a LagMonitor. Zero fields take their defaults.
type LagConfig struct {
	// Interval between refreshes. Default DefaultLagInterval.
	Interval time.Duration
	// Registerer receives the gauge carehub_kafka_consumer_lag{group, topic, partition}.
	// Monitors of several groups may share one Registerer: they share the gauge. Required for
	// the gauge to be exported at all.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

func (c *LagConfig) defaults() {
	config.Default(&c.Interval, DefaultLagInterval)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// LagMonitor exports a consumer group's lag per partition (records not yet committed, from
// storage/kafka.Lag) as the gauge carehub_kafka_consumer_lag, refreshed periodically. Any
// consumer group can use it: the event log writer runs one for its group, and other writers
// (webhooks, observations, workflows) can run their own with the same Registerer.
type LagMonitor struct {
	adm    *kadm.Client
	group  string
	topics []string
	cfg    LagConfig
	gauge  *prometheus.GaugeVec

	mu   sync.Mutex
	seen map[[2]string]bool // {topic, partition} series this monitor has set
}

// NewLagMonitor returns a monitor of group on topics (all the group's topics when empty). adm
// is borrowed, not closed.
func NewLagMonitor(adm *kadm.Client, group string, topics []string, cfg LagConfig) *LagMonitor {
	cfg.defaults()
	gauge := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "carehub", Subsystem: "kafka", Name: "consumer_lag",
		Help: "Records a consumer group has not yet committed, per topic partition.",
	}, []string{"group", "topic", "partition"})
	if cfg.Registerer != nil {
		gauge = telemetry.Shared(cfg.Registerer, gauge)
	}
	return &LagMonitor{adm: adm, group: group, topics: topics, cfg: cfg, gauge: gauge, seen: map[[2]string]bool{}}
}

// Run refreshes the gauge every interval until ctx is done, then removes the group's series and
// returns nil. Failed refreshes are logged and leave the previous values.
func (m *LagMonitor) Run(ctx context.Context) error {
	defer m.clear()
	tick.NowAndEvery(ctx, m.cfg.Interval, func(ctx context.Context) {
		if _, err := m.Refresh(ctx); err != nil && ctx.Err() == nil {
			m.cfg.Logger.Warn("refresh consumer lag", "group", m.group, "error", err)
		}
	})
	return nil
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
