package ws

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"carehub/api/ws/wstest"
)

// droppingExecutor stands for an executor whose event source drops a subscriber that fell
// behind: an operation named Dropped yields one result and then reports itself too slow.
type droppingExecutor struct{ Executor }

func (e droppingExecutor) Execute(ctx context.Context, req Request) (Results, error) {
	if !strings.Contains(req.Query, "Dropped") { // wstest sends no operationName
		return e.Executor.Execute(ctx, req)
	}
	out := make(chan *Response)
	go func() {
		defer close(out)
		select {
		case out <- &Response{Data: json.RawMessage(`{"ticks":{"n":1}}`)}:
		case <-ctx.Done():
			return
		}
		if !CloseSlow(ctx) {
			panic("CloseSlow: the operation's context has no connection")
		}
	}()
	return Chan(out), nil
}

// TestCloseSlow: an executor that calls CloseSlow ends the socket with 4008 in both protocols
// instead of completing the operation, which clients would take for the end of its results; the
// other operations of the socket end with it, and a context of no connection is refused.
func TestCloseSlow(t *testing.T) {
	if CloseSlow(context.Background()) {
		t.Fatal("CloseSlow accepted a context of no connection")
	}
	for _, proto := range []string{ProtocolTransportWS, ProtocolLegacy} {
		t.Run(proto, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			base := newTestServer(t, Config{}) // for its executor and schema
			h, err := New(droppingExecutor{base.h.exec}, Config{Metrics: reg, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			t.Cleanup(func() {
				_ = h.Close()
				srv.Close()
			})
			url := "ws" + strings.TrimPrefix(srv.URL, "http")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			if proto == ProtocolTransportWS {
				c, err := wstest.Dial(ctx, url, keyAlice)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				other, err := c.Subscribe(ctx, "other", `subscription { ticks(n: 1000000, intervalMs: 10) { n } }`, nil)
				if err != nil {
					t.Fatal(err)
				}
				<-other // running
				dropped, err := c.Subscribe(ctx, "dropped", `subscription Dropped { ticks(n: 1) { n } }`, nil)
				if err != nil {
					t.Fatal(err)
				}
				for range dropped {
				}
				if err := c.Wait(ctx); websocket.CloseStatus(err) != CloseSlowConsumer {
					t.Fatalf("socket ended with %v, want 4008", err)
				}
				if err := c.Err("dropped"); err == nil {
					t.Fatal("the dropped operation completed; want it ended by the close")
				}
			} else {
				raw := dialRaw(t, url, &websocket.DialOptions{Subprotocols: []string{proto}})
				raw.send(wireMsg{Type: "connection_init", Payload: payloadObj(t, map[string]string{"Authorization": keyAlice})})
				raw.expect("connection_ack", "")
				raw.send(wireMsg{ID: "dropped", Type: "start", Payload: opPayload(t, `subscription Dropped { ticks(n: 1) { n } }`, nil)})
				for {
					m, err := raw.next()
					if err != nil {
						var ce websocket.CloseError
						if !errors.As(err, &ce) || ce.Code != CloseSlowConsumer || ce.Reason != "Subscriber too slow" {
							t.Fatalf("socket ended with %v, want 4008 \"Subscriber too slow\"", err)
						}
						break
					}
					if m.Type == "complete" {
						t.Fatalf("the dropped operation was completed: %+v", m)
					}
				}
			}
			if v := testutilCounter(t, reg, "carehub_ws_slow_consumer_closes_total"); v != 1 {
				t.Fatalf("carehub_ws_slow_consumer_closes_total = %v, want 1", v)
			}
		})
	}
}

func testutilCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			sum := 0.0
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	return 0
}
