package wsfleet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"carehub/loadtest/wsfleet"
)

func TestHistQuantiles(t *testing.T) {
	tests := []struct {
		name   string
		values []time.Duration
		q      float64
		want   time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", []time.Duration{7 * time.Millisecond}, 0.99, 7 * time.Millisecond},
		{"exact below 32µs", []time.Duration{5 * time.Microsecond, 10 * time.Microsecond, 20 * time.Microsecond}, 0.5, 10 * time.Microsecond},
		{"median of 1..1000 ms", millis(1000), 0.5, 500 * time.Millisecond},
		{"p99 of 1..1000 ms", millis(1000), 0.99, 990 * time.Millisecond},
		{"negative counts as 0", []time.Duration{-time.Second}, 0.5, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var h wsfleet.Hist
			for _, v := range tc.values {
				h.Record(v)
			}
			got := h.Quantile(tc.q)
			if diff := math.Abs(float64(got - tc.want)); diff > 0.03*float64(tc.want) {
				t.Errorf("Quantile(%v) = %v, want %v within 3 %%", tc.q, got, tc.want)
			}
			if s := h.Summary(); s.Count != int64(len(tc.values)) {
				t.Errorf("Summary().Count = %d, want %d", s.Count, len(tc.values))
			}
		})
	}
}

func TestHistReset(t *testing.T) {
	var h wsfleet.Hist
	h.Record(time.Second)
	h.Reset()
	if s := h.Summary(); s.Count != 0 || s.Max != 0 || s.P99 != 0 {
		t.Fatalf("after Reset: %+v, want empty", s)
	}
}

func millis(n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = time.Duration(i+1) * time.Millisecond
	}
	return out
}

// TestPlan checks that an event reaches exactly the connections Assign put on its project and
// type, which is what the expected delivery count rests on.
func TestPlan(t *testing.T) {
	projects := []string{"prj_a", "prj_b", "prj_c"}
	p := wsfleet.NewPlan("org_x", projects, 4)
	listen := map[string]int64{} // project/type → connections
	for i := range 30 {
		project, types := p.Assign(i)
		if len(types) != 1 {
			t.Fatalf("Assign(%d) types = %v, want one", i, types)
		}
		listen[project+"/"+types[0]]++
	}
	var total int64
	for j := range 12 { // every project × group pair once
		pi, typ := p.Event(j)
		want := listen[projects[pi]+"/"+typ]
		if got := p.Listeners[pi][(j/len(projects))%p.Groups]; got != want {
			t.Errorf("event %d (%s, %s): %d listeners counted, %d connected", j, projects[pi], typ, got, want)
		}
		total += want
	}
	if total != 30 {
		t.Errorf("the 12 project × group pairs reach %d connections, want all 30", total)
	}
}

// fakeServer speaks graphql-transport-ws: it acknowledges connection_init when the key is right,
// answers each subscribe with frames events, then (with failOp) an error for the operation.
func fakeServer(t *testing.T, key string, frames int, failOp bool) *httptest.Server {
	t.Helper()
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"graphql-transport-ws"}})
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := r.Context()
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				return
			}
			var m struct {
				ID      string          `json:"id"`
				Type    string          `json:"type"`
				Payload json.RawMessage `json:"payload"`
			}
			if err := json.Unmarshal(data, &m); err != nil {
				return
			}
			switch m.Type {
			case "connection_init":
				var init map[string]string
				_ = json.Unmarshal(m.Payload, &init)
				if init["Authorization"] != "Bearer "+key {
					_ = c.Close(4403, "Forbidden")
					return
				}
				_ = c.Write(ctx, websocket.MessageText, []byte(`{"type":"connection_ack"}`))
			case "subscribe":
				for seq := range frames {
					now := time.Now()
					frame := fmt.Sprintf(`{"id":%q,"type":"next","payload":{"data":{"eventStream":{"id":"evt_%d","type":"load.g0","payload":{"seq":%d,"sentAt":%d},"timestamp":%q}}}}`,
						m.ID, seq, seq, now.Add(-10*time.Millisecond).UnixNano(), now.Add(-20*time.Millisecond).Format(time.RFC3339Nano))
					if c.Write(ctx, websocket.MessageText, []byte(frame)) != nil {
						return
					}
				}
				if failOp {
					_ = c.Write(ctx, websocket.MessageText, []byte(fmt.Sprintf(`{"id":%q,"type":"error","payload":[{"message":"boom"}]}`, m.ID)))
				}
			}
		}
	}))
}

func TestFleet(t *testing.T) {
	tests := []struct {
		name      string
		key       string
		conns     int
		frames    int
		failOp    bool
		wantErr   bool
		wantEnded string
	}{
		{name: "counts and times every frame", key: "k", conns: 5, frames: 3},
		{name: "records an operation's error", key: "k", conns: 2, frames: 1, failOp: true, wantEnded: "operation error"},
		{name: "a refused key fails Connect", key: "other", conns: 1, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := fakeServer(t, "k", tc.frames, tc.failOp)
			defer srv.Close()
			f := wsfleet.New("ws"+strings.TrimPrefix(srv.URL, "http"), tc.key)
			f.Measuring.Store(true)
			readCtx, stop := context.WithCancel(context.Background())
			defer func() {
				stop()
				f.Close(4)
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var failed atomic.Int64
			for range tc.conns {
				if err := f.Connect(ctx, readCtx, "prj_a", []string{"load.g0"}); err != nil {
					failed.Add(1)
				}
			}
			if tc.wantErr {
				if failed.Load() != int64(tc.conns) {
					t.Fatalf("%d of %d connections failed, want all", failed.Load(), tc.conns)
				}
				return
			}
			if failed.Load() > 0 {
				t.Fatalf("%d connections failed", failed.Load())
			}
			want := int64(tc.conns * tc.frames)
			for f.Received.Load() < want && ctx.Err() == nil {
				time.Sleep(5 * time.Millisecond)
			}
			if got := f.Received.Load(); got != want {
				t.Fatalf("received %d frames, want %d", got, want)
			}
			if s := f.FromCall.Summary(); s.Count != want || s.P50 < 10 {
				t.Errorf("publish → received: %+v, want %d samples of at least 10 ms", s, want)
			}
			if s := f.FromEvent.Summary(); s.Count != want || s.P50 < 20 {
				t.Errorf("timestamp → received: %+v, want %d samples of at least 20 ms", s, want)
			}
			if tc.wantEnded != "" {
				deadline := time.Now().Add(5 * time.Second)
				for endedLike(f, tc.wantEnded) < tc.conns && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				if got := endedLike(f, tc.wantEnded); got != tc.conns {
					t.Errorf("Ended() = %v, want %d × %q…", f.Ended(), tc.conns, tc.wantEnded)
				}
			}
			f.Reset()
			if f.Received.Load() != 0 || f.FromCall.Summary().Count != 0 {
				t.Errorf("after Reset: received %d, publish → received %+v", f.Received.Load(), f.FromCall.Summary())
			}
		})
	}
}

// endedLike counts the connections whose end starts with prefix.
func endedLike(f *wsfleet.Fleet, prefix string) int {
	n := 0
	for k, v := range f.Ended() {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}
