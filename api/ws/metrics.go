package ws

import (
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the package's collectors. They always exist; they are exported only when
// Options.Metrics is set.
type metrics struct {
	connections  *prometheus.GaugeVec
	operations   *prometheus.GaugeVec
	slowConsumer prometheus.Counter
	sent         *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, log *slog.Logger) *metrics {
	m := &metrics{
		connections: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carehub_ws_connections",
			Help: "Open GraphQL WebSocket connections, by subprotocol.",
		}, []string{"protocol"}),
		operations: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carehub_ws_operations",
			Help: "Active GraphQL operations on WebSocket connections, by subprotocol.",
		}, []string{"protocol"}),
		slowConsumer: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carehub_ws_slow_consumer_closes_total",
			Help: "WebSocket connections closed with 4008 because their send queue stayed full.",
		}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carehub_ws_messages_sent_total",
			Help: "Messages written to GraphQL WebSocket connections, by subprotocol.",
		}, []string{"protocol"}),
	}
	if reg == nil {
		return m
	}
	// A second Handler on the same registry shares the first one's collectors.
	m.connections = register(reg, m.connections, log)
	m.operations = register(reg, m.operations, log)
	m.slowConsumer = register(reg, m.slowConsumer, log)
	m.sent = register(reg, m.sent, log)
	return m
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C, log *slog.Logger) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	// Metrics are not worth failing the server for; the collector keeps working unexported.
	log.Error("ws: register metric", "error", err)
	return c
}

func (m *metrics) connOpened(protocol string) { m.connections.WithLabelValues(protocol).Inc() }
func (m *metrics) connClosed(protocol string) { m.connections.WithLabelValues(protocol).Dec() }
func (m *metrics) operationStarted(protocol string) {
	m.operations.WithLabelValues(protocol).Inc()
}
func (m *metrics) operationEnded(protocol string) { m.operations.WithLabelValues(protocol).Dec() }
func (m *metrics) slowConsumerClosed()            { m.slowConsumer.Inc() }
func (m *metrics) messageSent(protocol string)    { m.sent.WithLabelValues(protocol).Inc() }
