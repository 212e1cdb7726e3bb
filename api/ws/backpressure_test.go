package ws

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"carehub/internal/testenv"
)

// smallReadBufferClient dials with a fixed 256 KiB kernel receive buffer, so that a client
// that stops reading backs the server up after a few dozen large messages.
func smallReadBufferClient() *http.Client {
	d := &net.Dialer{}
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetReadBuffer(256 << 10)
			}
			return c, err
		},
	}}
}

// TestSlowConsumerIsClosed: a client that stops reading a fast subscription is closed with
// 4008 in both protocols, its source is cancelled, and a well-behaved client on the same
// server keeps getting its results on time throughout.
func TestSlowConsumerIsClosed(t *testing.T) {
	for _, proto := range []string{ProtocolTransportWS, ProtocolLegacy} {
		t.Run(proto, func(t *testing.T) {
			ts := newTestServer(t, Config{
				SubscriberBuffer:    4,
				SlowConsumerTimeout: 100 * time.Millisecond,
				WriteTimeout:        20 * time.Second,
				KeepAlive:           time.Hour,
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			// The fast client: 40 results, 25 ms apart, read as they come.
			fast := ts.dial(t, ctx, keyBob)
			const fastTicks = 40
			fastCh, err := fast.Subscribe(ctx, "fast", `subscription { ticks(n: 40, intervalMs: 25) { n } }`, nil)
			if err != nil {
				t.Fatal(err)
			}
			type arrival struct {
				n  int
				at time.Time
			}
			arrivals := make(chan []arrival, 1)
			go func() {
				var got []arrival
				for p := range fastCh {
					got = append(got, arrival{tickOf(t, p, "ticks").N, time.Now()})
				}
				arrivals <- got
			}()

			// The slow client: subscribes to an endless stream of 32 KiB results and never reads.
			slow := dialRaw(t, ts.url, &websocket.DialOptions{Subprotocols: []string{proto}, HTTPClient: smallReadBufferClient()})
			start := map[string]string{ProtocolTransportWS: "subscribe", ProtocolLegacy: "start"}[proto]
			slow.send(wireMsg{Type: "connection_init", Payload: payloadObj(t, map[string]string{"Authorization": keyAlice})})
			slow.expect("connection_ack", "")
			slow.send(wireMsg{ID: "slow", Type: start, Payload: opPayload(t,
				`subscription { ticks(n: 1000000000, padBytes: 32768) { n pad } }`, nil)})

			testenv.Eventually(t, 10*time.Second, "the slow consumer to be closed", func() bool {
				return ts.metric(t, "carehub_ws_slow_consumer_closes_total", "") == 1
			})
			testenv.Eventually(t, 5*time.Second, "the slow client's source to stop", func() bool {
				// The fast client's source may still run; the slow one's must not.
				return ts.root.active.Load() <= 1
			})

			// The fast client was never held up.
			got := <-arrivals
			if err := fast.Err("fast"); err != nil {
				t.Fatalf("fast subscription ended with %v", err)
			}
			if len(got) != fastTicks {
				t.Fatalf("fast client got %d results, want %d", len(got), fastTicks)
			}
			for i := 1; i < len(got); i++ {
				if got[i].n != i+1 {
					t.Fatalf("fast result %d is tick %d", i+1, got[i].n)
				}
				// 25 ms apart; a stall behind the slow socket would be the write timeout.
				if gap := got[i].at.Sub(got[i-1].at); gap > 2*time.Second {
					t.Fatalf("fast client waited %v between ticks %d and %d", gap, i, i+1)
				}
			}

			fast.Close()

			// The slow client finally reads: what the socket buffers held, then 4008. The queue
			// bounds it: far fewer results than the source could have produced.
			received := 0
			for {
				m, err := slow.next()
				if err != nil {
					var ce websocket.CloseError
					if !errors.As(err, &ce) || ce.Code != CloseSlowConsumer || ce.Reason != "Subscriber too slow" {
						t.Fatalf("slow client ended with %v, want close 4008 \"Subscriber too slow\"", err)
					}
					break
				}
				if m.Type == "next" || m.Type == "data" {
					received++
				}
			}
			if received > 100 {
				t.Fatalf("slow client received %d results; the server buffered without bound", received)
			}
			t.Logf("slow client received %d results before 4008", received)
			testenv.Eventually(t, 5*time.Second, "the slow socket to be gone", func() bool {
				return ts.metric(t, "carehub_ws_connections", proto) == 0
			})
		})
	}
}

// TestBurstIsNotSlow: many operations producing at once fill the queue for a moment; a client
// that reads is never mistaken for a slow one.
func TestBurstIsNotSlow(t *testing.T) {
	ts := newTestServer(t, Config{SubscriberBuffer: 4, SlowConsumerTimeout: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := ts.dial(t, ctx, keyAlice)
	const ops, ticks = 20, 50
	var chans []<-chan json.RawMessage
	for i := range ops {
		ch, err := client.Subscribe(ctx, string(rune('a'+i)), `subscription { ticks(n: 50) { n } }`, nil)
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	for i, ch := range chans {
		n := 0
		for range ch {
			n++
		}
		if n != ticks {
			t.Fatalf("op %d: %d results, want %d (socket: %v)", i, n, ticks, client.Err(string(rune('a'+i))))
		}
	}
	if v := ts.metric(t, "carehub_ws_slow_consumer_closes_total", ""); v != 0 {
		t.Fatalf("a reading client was closed as slow (%v)", v)
	}
}
