package subscriptiontest

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"carehub/api/ws/wstest"
	"carehub/cmd/carehub/node"
	"carehub/storage/demo"
)

// TestSlowSubscriber: on a real node, a client that subscribes and then stops reading is closed
// with 4008 "Subscriber too slow", while a client subscribed to the same events keeps receiving
// every one of them, in order, also after the close. Events are published at up to 40/s with
// 32 KiB payloads, so the slow client's buffers fill within seconds on a quiet machine; the test
// waits on counts, not on a clock, since a loaded machine publishes slowly. A client that
// reads nothing answers no ping either, and a stalled write times out: when publishing is slow
// those drop the socket (as a dead peer) before its queue fills, so this node waits minutes on
// pings and writes and only the send queue decides.
func TestSlowSubscriber(t *testing.T) {
	n := startNode(t, func(c *node.Config) { c.SocketKeepAlive, c.SocketWriteTimeout = 10*time.Minute, 10*time.Minute })
	key := n.DemoKey()
	project := n.projectID(t, key, demo.DemoOrgSlug, demo.SepsisProjectName)
	n.ready(t, key, project)
	vars := map[string]any{"projectId": project}
	pad := strings.Repeat("x", 32<<10)

	for _, p := range protocols {
		t.Run("slow "+p.name, func(t *testing.T) {
			fast := watch(subscribe(t, n.dial(t, protocols[0], key), "fast", eventStreamQuery, vars), "eventStream")
			slow := dialStalled(t, n.wsURL(), p.name, key, eventStreamQuery, vars)
			n.waitSubscribers(t, 2)
			closesBefore := n.metric(t, "carehub_ws_slow_consumer_closes_total")

			// Publish at up to 40/s until the slow client has been closed and 40 more events have
			// been published (at most 3 min).
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			stop := make(chan struct{})
			var published atomic.Int64
			var pubErr error
			var wg sync.WaitGroup
			began := time.Now()
			pubDone := make(chan struct{})
			wg.Go(func() {
				defer close(pubDone)
				tick := time.NewTicker(25 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-ctx.Done():
						return
					case <-tick.C:
					}
					_, err := n.publish(ctx, key, project, "device.observation_received",
						map[string]any{"seq": published.Load(), "sentAt": time.Now().UnixNano(), "pad": pad})
					if err != nil {
						pubErr = err
						return
					}
					published.Add(1)
				}
			})
			// Meanwhile the slow socket is read only once the server has given up on it.
			slowEnd := make(chan slowResult, 1)
			var closedAt time.Time
			for closedAt.IsZero() {
				select {
				case <-pubDone:
					wg.Wait()
					t.Fatalf("publishing stopped after %d events: %v", published.Load(), pubErr)
				case <-ctx.Done():
					close(stop)
					wg.Wait()
					t.Fatalf("the stalled client was not closed as slow within 3 min (%d events published, err %v)", published.Load(), pubErr)
				case <-time.After(50 * time.Millisecond):
				}
				if n.metric(t, "carehub_ws_slow_consumer_closes_total") > closesBefore {
					closedAt = time.Now()
					go func() { slowEnd <- slow.drain() }()
				}
			}
			atClose := published.Load()
		more:
			for published.Load() < atClose+40 {
				select {
				case <-pubDone:
					break more
				case <-ctx.Done():
					break more
				case <-time.After(25 * time.Millisecond):
				}
			}
			close(stop)
			wg.Wait()
			if pubErr != nil {
				t.Fatal(pubErr)
			}

			// The fast client got every event, in order, each within the bound.
			var lat []time.Duration
			for i := range int(published.Load()) {
				a := nextOf(t, fast, "device.observation_received", 10*time.Second, "fast client")
				if a.ev.seq() != i {
					t.Fatalf("fast client: event %d arrived as seq %d", i, a.ev.seq())
				}
				sent := time.Unix(0, int64(a.ev.Payload["sentAt"].(float64)))
				lat = append(lat, a.at.Sub(sent))
			}
			t.Logf("fast client beside a stalled %s client, %d events of 32 KiB at up to 40/s: %s", p.name, published.Load(), latencies(lat))

			r := <-slowEnd
			if websocket.CloseStatus(r.err) != 4008 {
				t.Fatalf("the stalled client ended with %v after %d results, want close 4008", r.err, r.results)
			}
			var ce websocket.CloseError
			if errors.As(r.err, &ce) && ce.Reason != "Subscriber too slow" {
				t.Errorf("close reason %q, want \"Subscriber too slow\"", ce.Reason)
			}
			t.Logf("stalled %s client: closed with 4008 about %v after publishing began; %d results were buffered for it",
				p.name, closedAt.Sub(began).Round(time.Millisecond), r.results)
			n.waitSubscribers(t, 1)
		})
	}
}

// stalled is a socket that subscribed and then stopped reading.
type stalled struct {
	t    *testing.T
	conn *websocket.Conn
}

type slowResult struct {
	results int   // results read before the socket ended
	err     error // how it ended
}

// dialStalled connects in protocol proto with a 256 KiB kernel receive buffer (a fixed buffer
// smaller than loopback's 64 KiB MSS would stall the connection for good, because a receiver
// never advertises a window smaller than one segment), subscribes to query and reads nothing
// more until drain.
func dialStalled(t *testing.T, url, proto, key, query string, vars map[string]any) *stalled {
	t.Helper()
	d := &net.Dialer{}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(256 << 10)
		}
		return c, err
	}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{proto}, HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	conn.SetReadLimit(16 << 20)
	t.Cleanup(func() { _ = conn.CloseNow() })
	init, _ := json.Marshal(map[string]string{"Authorization": "Bearer " + key})
	if err := wstest.WriteMessage(ctx, conn, wstest.Message{Type: "connection_init", Payload: init}); err != nil {
		t.Fatal(err)
	}
	if m, err := wstest.ReadMessage(ctx, conn); err != nil || m.Type != "connection_ack" {
		t.Fatalf("stalled client: %+v %v, want connection_ack", m, err)
	}
	start := map[string]string{"graphql-transport-ws": "subscribe", "graphql-ws": "start"}[proto]
	payload, _ := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err := wstest.WriteMessage(ctx, conn, wstest.Message{ID: "slow", Type: start, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	return &stalled{t: t, conn: conn}
}

// drain reads what the socket holds until it ends.
func (s *stalled) drain() slowResult {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var r slowResult
	for {
		m, err := wstest.ReadMessage(ctx, s.conn)
		if err != nil {
			r.err = err
			return r
		}
		if m.Type == "next" || m.Type == "data" {
			r.results++
		}
	}
}
