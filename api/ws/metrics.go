package ws

import (
	"carehub/kernel/telemetry"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the package's collectors. They always exist; they are exported only when
// Config.Metrics is set.
type metrics struct {
	connections  *prometheus.GaugeVec
	operations   *prometheus.GaugeVec
	slowConsumer prometheus.Counter
	withdrawn    prometheus.Counter
	refused      *prometheus.CounterVec
	sent         *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
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
		withdrawn: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carehub_ws_credential_closes_total",
			Help: "WebSocket connections closed with 4403 because a re-check found their credential revoked, expired or narrowed.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carehub_ws_refused_total",
			Help: "Sockets (4013) and operations (RATE_LIMITED) refused for a limit of the credential or the node, by what was refused.",
		}, []string{"what"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carehub_ws_messages_sent_total",
			Help: "Messages written to GraphQL WebSocket connections, by subprotocol.",
		}, []string{"protocol"}),
	}
	if reg == nil {
		return m
	}
	// A second Handler on the same registry shares the first one's collectors.
	m.connections = telemetry.Shared(reg, m.connections)
	m.operations = telemetry.Shared(reg, m.operations)
	m.slowConsumer = telemetry.Shared(reg, m.slowConsumer)
	m.withdrawn = telemetry.Shared(reg, m.withdrawn)
	m.refused = telemetry.Shared(reg, m.refused)
	m.sent = telemetry.Shared(reg, m.sent)
	return m
}

func (m *metrics) connOpened(protocol string) { m.connections.WithLabelValues(protocol).Inc() }
func (m *metrics) connClosed(protocol string) { m.connections.WithLabelValues(protocol).Dec() }
func (m *metrics) operationStarted(protocol string) {
	m.operations.WithLabelValues(protocol).Inc()
}
func (m *metrics) operationEnded(protocol string) { m.operations.WithLabelValues(protocol).Dec() }
func (m *metrics) slowConsumerClosed()            { m.slowConsumer.Inc() }
func (m *metrics) credentialWithdrawn()           { m.withdrawn.Inc() }
func (m *metrics) socketRefused()                 { m.refused.WithLabelValues("socket").Inc() }
func (m *metrics) operationRefused()              { m.refused.WithLabelValues("operation").Inc() }
func (m *metrics) messageSent(protocol string)    { m.sent.WithLabelValues(protocol).Inc() }
