package ws

import (
	"fmt"
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

// TestOrganizationLimits: keys are cheap to make, so an organization's keys together hold no
// more than SocketsPerOrg and OperationsPerOrg (finding 10 of issue 51: twenty billing keys of
// one organization held 6,000 subscriptions), while another organization is unaffected.
func TestOrganizationLimits(t *testing.T) {
	n := newCounts(Limits{SocketsPerKey: 2, OperationsPerKey: 3, SocketsPerOrg: 3, OperationsPerOrg: 4, Operations: 100}.WithDefaults())
	var held []owner
	for i := range 3 {
		o := owner{key: fmt.Sprint("key", i), org: "attacker"}
		if !n.openSocket(o) {
			t.Fatalf("socket %d of the organization refused below its limit", i)
		}
		held = append(held, o)
	}
	if n.openSocket(owner{key: "key9", org: "attacker"}) {
		t.Fatal("a fresh key of the organization opened a socket past SocketsPerOrg")
	}
	if !n.openSocket(owner{key: "other", org: "hospital"}) {
		t.Fatal("another organization's socket refused")
	}
	for i := range 4 {
		if err := n.startOperation(held[i%3]); err != nil {
			t.Fatalf("operation %d refused below the organization's limit: %v", i, err)
		}
	}
	err := n.startOperation(held[2])
	if err == nil || err.Extensions["per"] != "organization" {
		t.Fatalf("operation past OperationsPerOrg: %v, want refused per organization", err)
	}
	if err := n.startOperation(owner{key: "other", org: "hospital"}); err != nil {
		t.Fatalf("another organization's operation: %v", err)
	}
	n.endOperation(held[0])
	if err := n.startOperation(held[1]); err != nil {
		t.Fatalf("room again once one ended: %v", err)
	}
	n.closeSocket(held[0])
	if !n.openSocket(owner{key: "key9", org: "attacker"}) {
		t.Fatal("no room again once a socket closed")
	}
}
