package ws

import (
	"testing"
	"time"

	"github.com/coder/websocket"

	"carehub/internal/testenv"
)

// TestSendQueueBoundedInBytes: a queue of many messages is no bound when the messages are
// large (finding 10 of issue 51: one 100 KB event to thousands of subscribers). A client that
// stops reading 2,000 results of 32 KiB, which a queue of 1<<20 messages would hold whole
// (64 MiB), is closed with 4008 once QueueBytes are waiting.
func TestSendQueueBoundedInBytes(t *testing.T) {
	ts := newTestServer(t, Config{
		SubscriberBuffer:    1 << 20,
		Limits:              Limits{QueueBytes: 256 << 10},
		SlowConsumerTimeout: 100 * time.Millisecond,
		WriteTimeout:        20 * time.Second,
		KeepAlive:           time.Hour,
	})
	slow := dialRaw(t, ts.url, &websocket.DialOptions{Subprotocols: []string{ProtocolTransportWS}, HTTPClient: smallReadBufferClient()})
	slow.send(wireMsg{Type: "connection_init", Payload: payloadObj(t, map[string]string{"Authorization": keyAlice})})
	slow.expect("connection_ack", "")
	slow.send(wireMsg{ID: "slow", Type: "subscribe", Payload: opPayload(t, `subscription { ticks(n: 2000, padBytes: 32768) { n pad } }`, nil)})

	testenv.Eventually(t, 10*time.Second, "the slow consumer to be closed", func() bool {
		return ts.metric(t, "carehub_ws_slow_consumer_closes_total", "") == 1
	})
}
