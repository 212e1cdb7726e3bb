package ws

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"carehub/api/ws/wstest"
	"carehub/internal/testenv"
)

const tp = ProtocolTransportWS

// initTransport dials and completes connection_init with key.
func initTransport(t *testing.T, ts *testServer, key string) *rawClient {
	t.Helper()
	c := dialProto(t, ts.url, tp)
	c.send(wireMsg{Type: "connection_init", Payload: payloadObj(t, map[string]string{"Authorization": key})})
	c.expect("connection_ack", "")
	return c
}

func TestTransportSubscribe(t *testing.T) {
	ts := newTestServer(t, Config{})
	c := initTransport(t, ts, "Bearer "+keyAlice)

	c.send(wireMsg{ID: "1", Type: "subscribe", Payload: opPayload(t,
		`subscription($n: Int!) { ticks(n: $n) { n who } }`, map[string]any{"n": 3})})
	for want := 1; want <= 3; want++ {
		m := c.expect("next", "1")
		got := tickOf(t, m.Payload, "ticks")
		if got.N != want || got.Who != "alice" {
			t.Fatalf("tick %d = %+v, want n=%d who=alice", want, got, want)
		}
	}
	c.expect("complete", "1")

	// A completed id may be reused.
	c.send(wireMsg{ID: "1", Type: "subscribe", Payload: opPayload(t, `subscription { ticks(n: 1) { n } }`, nil)})
	c.expect("next", "1")
	c.expect("complete", "1")
}

func TestTransportQueryAndMutation(t *testing.T) {
	ts := newTestServer(t, Config{})
	c := initTransport(t, ts, keyBob) // without "Bearer "

	tests := []struct {
		name, query, field, want string
	}{
		{"query", `{ hello(name: "ws") }`, "hello", `"hello, ws"`},
		{"identity from connection_init", `query { whoami }`, "whoami", `"bob"`},
		{"mutation", `mutation { bump(by: 5) }`, "bump", `5`},
		{"second mutation sees the first", `mutation { bump(by: 2) }`, "bump", `7`},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := fmt.Sprint("q", i)
			c.send(wireMsg{ID: id, Type: "subscribe", Payload: opPayload(t, tt.query, nil)})
			r := decodeResult(t, c.expect("next", id).Payload)
			if got := string(r.Data[tt.field]); got != tt.want || len(r.Errors) > 0 {
				t.Fatalf("%s = %s (errors %v), want %s", tt.field, got, r.Errors, tt.want)
			}
			c.expect("complete", id)
		})
	}
}

func TestTransportIdentityIsPerSocket(t *testing.T) {
	ts := newTestServer(t, Config{})
	alice := initTransport(t, ts, keyAlice)
	bob := initTransport(t, ts, keyBob)
	for _, tc := range []struct {
		c    *rawClient
		want string
	}{{alice, `"alice"`}, {bob, `"bob"`}, {alice, `"alice"`}} {
		tc.c.send(wireMsg{ID: "w", Type: "subscribe", Payload: opPayload(t, `{ whoami }`, nil)})
		if got := string(decodeResult(t, tc.c.expect("next", "w").Payload).Data["whoami"]); got != tc.want {
			t.Fatalf("whoami = %s, want %s", got, tc.want)
		}
		tc.c.expect("complete", "w")
	}
}

func TestTransportManyOperationsPerSocket(t *testing.T) {
	ts := newTestServer(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := ts.dial(t, ctx, "Bearer "+keyAlice)

	const ops, ticks = 25, 8
	chans := make([]<-chan json.RawMessage, ops)
	for i := range ops {
		id := fmt.Sprint("op", i)
		var err error
		chans[i], err = client.Subscribe(ctx, id, `subscription($n: Int!) { ticks(n: $n, intervalMs: 5) { n } }`, map[string]any{"n": ticks})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Mix in single-result operations while the subscriptions run.
	q, err := client.Subscribe(ctx, "hello", `{ hello }`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(decodeResult(t, <-q).Data["hello"]); got != `"hello, world"` {
		t.Fatalf("hello = %s", got)
	}
	for i, ch := range chans {
		n := 0
		for payload := range ch {
			n++
			if got := tickOf(t, payload, "ticks").N; got != n {
				t.Fatalf("op%d: tick %d out of order (got %d)", i, n, got)
			}
		}
		if n != ticks {
			t.Fatalf("op%d: %d ticks, want %d", i, n, ticks)
		}
		if err := client.Err(fmt.Sprint("op", i)); err != nil {
			t.Fatalf("op%d ended with %v, want complete", i, err)
		}
	}
	testenv.Eventually(t, 5*time.Second, "active operations to drop to 0", func() bool {
		return ts.metric(t, "carehub_ws_operations", tp) == 0
	})
	if sent := ts.metric(t, "carehub_ws_messages_sent_total", tp); sent < ops*(ticks+1) {
		t.Fatalf("messages_sent_total = %v, want at least %d", sent, ops*(ticks+1))
	}
}

func TestTransportClientCompleteStopsOperation(t *testing.T) {
	ts := newTestServer(t, Config{})
	c := initTransport(t, ts, keyAlice)

	c.send(wireMsg{ID: "s", Type: "subscribe", Payload: opPayload(t, `subscription { ticks(n: 100000, intervalMs: 20) { n } }`, nil)})
	c.expect("next", "s")
	c.expect("next", "s")
	c.send(wireMsg{ID: "s", Type: "complete"})
	testenv.Eventually(t, 5*time.Second, "the ticks source to stop", func() bool { return ts.root.active.Load() == 0 })

	// At most a message already in flight may still arrive; then nothing, and no complete.
	c.send(wireMsg{Type: "ping"})
	inFlight := 0
	for m := c.read(); m.Type != "pong"; m = c.read() {
		if m.Type != "next" || m.ID != "s" {
			t.Fatalf("unexpected %s id=%q after complete", m.Type, m.ID)
		}
		if inFlight++; inFlight > 1 {
			t.Fatal("more than one message after the client's complete")
		}
	}
	time.Sleep(100 * time.Millisecond) // five tick intervals
	c.send(wireMsg{Type: "ping"})
	c.expect("pong", "")

	// Completing an unknown or finished id is not an error.
	c.send(wireMsg{ID: "s", Type: "complete"})
	c.send(wireMsg{ID: "never", Type: "complete"})
	c.send(wireMsg{Type: "ping"})
	c.expect("pong", "")
}

func TestTransportRequestErrors(t *testing.T) {
	ts := newTestServer(t, Config{})
	c := initTransport(t, ts, keyAlice)

	tests := []struct {
		name, query, wantMsg string
	}{
		{"syntax", `subscription { ticks(n: 1) { n }`, "syntax error"},
		{"validation", `subscription { ticks { n } }`, "argument \"n\""},
		{"resolver error on a non-null subscription", `subscription { ticks(n: -1) { n } }`, "n must not be negative"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := fmt.Sprint("e", i)
			c.send(wireMsg{ID: id, Type: "subscribe", Payload: opPayload(t, tt.query, nil)})
			m := c.expect("error", id)
			var errs []struct{ Message string }
			if err := json.Unmarshal(m.Payload, &errs); err != nil || len(errs) == 0 {
				t.Fatalf("error payload %s is not a non-empty array of GraphQL errors", m.Payload)
			}
			if !strings.Contains(errs[0].Message, tt.wantMsg) {
				t.Fatalf("error %q, want it to contain %q", errs[0].Message, tt.wantMsg)
			}
		})
	}
	// No complete follows an error, and the socket is still usable.
	c.send(wireMsg{ID: "ok", Type: "subscribe", Payload: opPayload(t, `{ hello }`, nil)})
	c.expect("next", "ok")
	c.expect("complete", "ok")
}

func TestTransportProtocolViolations(t *testing.T) {
	tests := []struct {
		name     string
		init     bool // complete connection_init first
		send     []string
		code     websocket.StatusCode
		reasonIn string
	}{
		{"bad JSON before init", false, []string{`{"type":`}, CloseBadRequest, "JSON"},
		{"bad JSON after ack", true, []string{`not json`}, CloseBadRequest, "JSON"},
		{"array", true, []string{`[]`}, CloseBadRequest, "object"},
		{"missing type", true, []string{`{"id":"1"}`}, CloseBadRequest, "type"},
		{"non-string type", true, []string{`{"type":7}`}, CloseBadRequest, "type"},
		{"unknown type", true, []string{`{"type":"start","id":"1","payload":{"query":"{ hello }"}}`}, CloseBadRequest, `"start"`},
		{"server-only type from client", true, []string{`{"type":"next","id":"1","payload":{}}`}, CloseBadRequest, `"next"`},
		{"subscribe without id", true, []string{`{"type":"subscribe","payload":{"query":"{ hello }"}}`}, CloseBadRequest, "id"},
		{"subscribe without query", true, []string{`{"type":"subscribe","id":"1","payload":{}}`}, CloseBadRequest, "query"},
		{"subscribe with non-object variables", true, []string{`{"type":"subscribe","id":"1","payload":{"query":"{ hello }","variables":[1]}}`}, CloseBadRequest, "variables"},
		{"complete without id", true, []string{`{"type":"complete"}`}, CloseBadRequest, "id"},
		{"init payload not an object", false, []string{`{"type":"connection_init","payload":"key"}`}, CloseBadRequest, "object"},
		{"subscribe before init", false, []string{`{"type":"subscribe","id":"1","payload":{"query":"{ hello }"}}`}, CloseUnauthorized, "Unauthorized"},
		{"second init", true, []string{`{"type":"connection_init","payload":{"Authorization":"` + keyAlice + `"}}`}, CloseTooManyInitRequests, "Too many initialisation requests"},
		{"unknown key", false, []string{`{"type":"connection_init","payload":{"Authorization":"Bearer chk_test_nobody"}}`}, CloseForbidden, "Forbidden: invalid API key or token"},
		{"no credential", false, []string{`{"type":"connection_init"}`}, CloseForbidden, `Forbidden: connection_init payload has no "Authorization"`},
		{"duplicate id", true, []string{
			`{"type":"subscribe","id":"dup","payload":{"query":"subscription { ticks(n: 1000000, intervalMs: 1000) { n } }"}}`,
			`{"type":"subscribe","id":"dup","payload":{"query":"{ hello }"}}`,
		}, CloseSubscriberExists, "Subscriber for dup already exists"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := newTestServer(t, Config{})
			var c *rawClient
			if tt.init {
				c = initTransport(t, ts, keyAlice)
			} else {
				c = dialProto(t, ts.url, tp)
			}
			for _, s := range tt.send {
				c.sendRaw(s)
			}
			c.expectClose(tt.code, tt.reasonIn)
		})
	}
}

// A ping is answered once every operation started before it has started: a client that pings
// after subscribing knows from the pong that its subscription is held (carehub subscribe
// --ready-file). Pings owed meanwhile are all answered; the reader goes on reading.
func TestTransportPongAfterOperationsStart(t *testing.T) {
	ts := newTestServer(t, Config{})
	ts.exec.hold = make(chan struct{})
	c := initTransport(t, ts, keyAlice)
	c.send(wireMsg{ID: "held", Type: "subscribe", Payload: payloadObj(t, map[string]any{
		"query": "subscription Held { ticks(n: 1) { n } }", "operationName": opHeld,
	})})
	c.send(wireMsg{Type: "ping"})
	c.send(wireMsg{ID: "other", Type: "subscribe", Payload: opPayload(t, `{ hello }`, nil)})
	c.expect("next", "other") // not held up by the ping
	c.expect("complete", "other")
	c.send(wireMsg{Type: "ping"})

	var released atomic.Bool
	time.AfterFunc(300*time.Millisecond, func() {
		released.Store(true)
		close(ts.exec.hold)
	})
	pongs := 0
	for pongs < 2 {
		m := c.read()
		if m.Type != "pong" {
			continue // the held operation's results, once released
		}
		if !released.Load() {
			t.Fatal("pong before the subscription started")
		}
		pongs++
	}
	// With nothing starting, a ping is answered at once.
	c.send(wireMsg{Type: "ping"})
	for m := c.read(); m.Type != "pong"; m = c.read() {
	}
}

func TestTransportInitTimeout(t *testing.T) {
	ts := newTestServer(t, Config{InitTimeout: 150 * time.Millisecond})
	c := dialProto(t, ts.url, tp)
	c.send(wireMsg{Type: "ping"}) // pings are answered before init, but do not count as init
	c.expect("pong", "")
	c.expectClose(CloseInitTimeout, "Connection initialisation timeout")

	// An initialised socket outlives the timeout.
	ok := initTransport(t, ts, keyAlice)
	time.Sleep(300 * time.Millisecond)
	ok.send(wireMsg{ID: "1", Type: "subscribe", Payload: opPayload(t, `{ hello }`, nil)})
	ok.expect("next", "1")
}

func TestTransportOversizedMessage(t *testing.T) {
	ts := newTestServer(t, Config{MaxMessageBytes: 1024})
	c := initTransport(t, ts, keyAlice)
	// Just under the limit is fine...
	q := `{ hello(name: "` + strings.Repeat("a", 900) + `") }`
	c.send(wireMsg{ID: "small", Type: "subscribe", Payload: opPayload(t, q, nil)})
	c.expect("next", "small")
	c.expect("complete", "small")
	// ...over it closes with 1009.
	q = `{ hello(name: "` + strings.Repeat("a", 2000) + `") }`
	c.send(wireMsg{ID: "big", Type: "subscribe", Payload: opPayload(t, q, nil)})
	c.expectClose(websocket.StatusMessageTooBig, "")
}

func TestTransportPingPong(t *testing.T) {
	ts := newTestServer(t, Config{})
	c := initTransport(t, ts, keyAlice)
	c.send(wireMsg{Type: "ping", Payload: payloadObj(t, map[string]any{"t": 1})})
	c.expect("pong", "")
	c.send(wireMsg{Type: "pong"}) // unsolicited heartbeat: accepted silently
	c.send(wireMsg{Type: "ping"})
	c.expect("pong", "")
}

func TestKeepAlivePings(t *testing.T) {
	for _, proto := range []string{ProtocolTransportWS, ProtocolLegacy} {
		t.Run(proto, func(t *testing.T) {
			ts := newTestServer(t, Config{KeepAlive: 50 * time.Millisecond})
			var pings atomic.Int32
			c := dialRaw(t, ts.url, &websocket.DialOptions{
				Subprotocols: []string{proto},
				OnPingReceived: func(context.Context, []byte) bool {
					pings.Add(1)
					return true
				},
			})
			c.send(wireMsg{Type: "connection_init", Payload: payloadObj(t, map[string]string{"Authorization": keyAlice})})
			c.expect("connection_ack", "")
			// A reading client answers every ping and stays connected well past KeepAlive.
			var kas atomic.Int32
			readErr := make(chan error, 1)
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				for {
					_, data, err := c.conn.Read(ctx)
					if err != nil {
						readErr <- err
						return
					}
					if strings.Contains(string(data), `"ka"`) {
						kas.Add(1)
					}
				}
			}()
			time.Sleep(600 * time.Millisecond)
			select {
			case err := <-readErr:
				t.Fatalf("socket ended while answering pings: %v", err)
			default:
			}
			cancel()
			<-readErr
			if n := pings.Load(); n < 3 {
				t.Fatalf("%d WebSocket pings in 600ms with KeepAlive 50ms, want at least 3", n)
			}
			if n := kas.Load(); proto == ProtocolLegacy && n < 3 {
				t.Fatalf("%d ka messages in 600ms with KeepAlive 50ms, want at least 3", n)
			}
			if n := kas.Load(); proto == ProtocolTransportWS && n != 0 {
				t.Fatalf("graphql-transport-ws socket got %d legacy ka messages", n)
			}
		})
	}
}

func TestKeepAliveDropsUnresponsivePeer(t *testing.T) {
	for _, proto := range []string{ProtocolTransportWS, ProtocolLegacy} {
		t.Run(proto, func(t *testing.T) {
			ts := newTestServer(t, Config{KeepAlive: 50 * time.Millisecond})
			c := dialProto(t, ts.url, proto)
			c.send(wireMsg{Type: "connection_init", Payload: payloadObj(t, map[string]string{"Authorization": keyAlice})})
			c.expect("connection_ack", "")
			if ts.metric(t, "carehub_ws_connections", proto) != 1 {
				t.Fatal("connection not counted")
			}
			// The client stops reading, so pings go unanswered.
			testenv.Eventually(t, 5*time.Second, "the server to drop the silent peer", func() bool {
				return ts.metric(t, "carehub_ws_connections", proto) == 0
			})
		})
	}
}

func TestSubprotocolNegotiation(t *testing.T) {
	ts := newTestServer(t, Config{})

	t.Run("neither offered", func(t *testing.T) {
		c := dialRaw(t, ts.url, &websocket.DialOptions{Subprotocols: []string{"graphql-sse"}})
		c.expectClose(CloseSubprotocolNotAcceptable, "Subprotocol not acceptable")
	})
	t.Run("none offered", func(t *testing.T) {
		c := dialRaw(t, ts.url, nil)
		c.expectClose(CloseSubprotocolNotAcceptable, "Subprotocol not acceptable")
	})
	t.Run("both offered prefers graphql-transport-ws", func(t *testing.T) {
		c := dialRaw(t, ts.url, &websocket.DialOptions{Subprotocols: []string{ProtocolLegacy, ProtocolTransportWS}})
		if got := c.conn.Subprotocol(); got != ProtocolTransportWS {
			t.Fatalf("negotiated %q", got)
		}
	})
	t.Run("plain HTTP request", func(t *testing.T) {
		resp, err := http.Get(ts.srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUpgradeRequired {
			t.Fatalf("status %d, want 426", resp.StatusCode)
		}
	})
}

func TestTransportMaxOperationsPerConn(t *testing.T) {
	ts := newTestServer(t, Config{MaxOperationsPerConn: 2})
	c := initTransport(t, ts, keyAlice)
	long := opPayload(t, `subscription { ticks(n: 1000000, intervalMs: 1000) { n } }`, nil)
	c.send(wireMsg{ID: "a", Type: "subscribe", Payload: long})
	c.send(wireMsg{ID: "b", Type: "subscribe", Payload: long})
	seen := map[string]bool{}
	for range 2 {
		m := c.read()
		if m.Type != "next" {
			t.Fatalf("got %s, want next", m.Type)
		}
		seen[m.ID] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Fatalf("first results came for %v, want a and b", seen)
	}
	c.send(wireMsg{ID: "c", Type: "subscribe", Payload: long})
	m := c.expect("error", "c")
	if !strings.Contains(string(m.Payload), "RATE_LIMITED") {
		t.Fatalf("error payload %s lacks RATE_LIMITED", m.Payload)
	}
	// Freeing a slot admits the next operation.
	c.send(wireMsg{ID: "a", Type: "complete"})
	c.send(wireMsg{ID: "c", Type: "subscribe", Payload: opPayload(t, `{ hello }`, nil)})
	c.expect("next", "c")
	c.expect("complete", "c")
}

func TestCloseCancelsOperations(t *testing.T) {
	for _, proto := range []string{ProtocolTransportWS, ProtocolLegacy} {
		t.Run(proto, func(t *testing.T) {
			ts := newTestServer(t, Config{})
			c := dialProto(t, ts.url, proto)
			c.send(wireMsg{Type: "connection_init", Payload: payloadObj(t, map[string]string{"Authorization": keyAlice})})
			c.expect("connection_ack", "")
			start := map[string]string{ProtocolTransportWS: "subscribe", ProtocolLegacy: "start"}[proto]
			for i := range 5 {
				c.send(wireMsg{ID: fmt.Sprint(i), Type: start, Payload: opPayload(t, `subscription { ticks(n: 1000000, intervalMs: 10) { n } }`, nil)})
			}
			testenv.Eventually(t, 5*time.Second, "5 running sources", func() bool { return ts.root.active.Load() == 5 })
			if got := ts.metric(t, "carehub_ws_operations", proto); got != 5 {
				t.Fatalf("carehub_ws_operations = %v, want 5", got)
			}
			c.close()
			testenv.Eventually(t, 5*time.Second, "sources and operations to stop", func() bool {
				return ts.root.active.Load() == 0 && ts.metric(t, "carehub_ws_operations", proto) == 0 &&
					ts.metric(t, "carehub_ws_connections", proto) == 0
			})
		})
	}
}

func TestShutdownClosesSockets(t *testing.T) {
	ts := newTestServer(t, Config{})
	c := initTransport(t, ts, keyAlice)
	c.send(wireMsg{ID: "s", Type: "subscribe", Payload: opPayload(t, `subscription { ticks(n: 1000000, intervalMs: 10) { n } }`, nil)})
	c.expect("next", "s")
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- ts.h.Shutdown(ctx)
	}()
	c.expectClose(websocket.StatusGoingAway, "Going away")
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	testenv.Eventually(t, 2*time.Second, "sources to stop", func() bool { return ts.root.active.Load() == 0 })
	// New sockets are refused.
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, ts.url, &websocket.DialOptions{Subprotocols: []string{tp}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("dial after shutdown: err %v, response %v; want 503", err, resp)
	}
}

func TestWSTestClientRefusedInit(t *testing.T) {
	ts := newTestServer(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	_, err := wstest.Dial(ctx, ts.url, "Bearer chk_test_wrong")
	if websocket.CloseStatus(err) != CloseForbidden {
		t.Fatalf("dial with a bad key: %v, want close 4403", err)
	}
}

func TestExecutorFailures(t *testing.T) {
	ts := newTestServer(t, Config{})

	t.Run("execute errors and panics become error messages", func(t *testing.T) {
		c := initTransport(t, ts, keyAlice)
		tests := []struct{ op, want string }{
			{opFail, msgInternal}, // the executor's own text is not shown to clients
			{opQueryError, "operation not allowed"},
			{opPanic, msgInternal},
		}
		for _, tt := range tests {
			c.send(wireMsg{ID: tt.op, Type: "subscribe", Payload: payloadObj(t, map[string]any{
				"query": "query " + tt.op + " { hello }", "operationName": tt.op,
			})})
			m := c.expect("error", tt.op)
			if !strings.Contains(string(m.Payload), tt.want) || strings.Contains(string(m.Payload), "hunter2") {
				t.Fatalf("%s: error payload %s, want %q", tt.op, m.Payload, tt.want)
			}
		}
		// The socket survives all of them.
		c.send(wireMsg{ID: "ok", Type: "subscribe", Payload: opPayload(t, `{ hello }`, nil)})
		c.expect("next", "ok")
	})

	t.Run("legacy", func(t *testing.T) {
		c := initLegacy(t, ts, keyAlice)
		c.send(wireMsg{ID: "p", Type: "start", Payload: payloadObj(t, map[string]any{
			"query": "query Panic { hello }", "operationName": opPanic,
		})})
		if msg := legacyErr(t, c.expect("error", "p")); msg != msgInternal {
			t.Fatalf("error %q, want %q", msg, msgInternal)
		}
	})

	t.Run("authenticate panics", func(t *testing.T) {
		for proto, code := range map[string]websocket.StatusCode{
			ProtocolTransportWS: CloseInternalServerError,
			ProtocolLegacy:      websocket.StatusInternalError,
		} {
			c := dialProto(t, ts.url, proto)
			c.send(wireMsg{Type: "connection_init", Payload: payloadObj(t, map[string]string{"Authorization": keyPanic})})
			c.expectClose(code, "Internal server error")
		}
	})
}

func TestCredentialExpiryClosesSocket(t *testing.T) {
	for _, proto := range []string{ProtocolTransportWS, ProtocolLegacy} {
		t.Run(proto, func(t *testing.T) {
			ts := newTestServer(t, Config{})
			c := dialProto(t, ts.url, proto)
			c.send(wireMsg{Type: "connection_init", Payload: payloadObj(t, map[string]string{"Authorization": keyExpiring})})
			c.expect("connection_ack", "")
			start := map[string]string{ProtocolTransportWS: "subscribe", ProtocolLegacy: "start"}[proto]
			c.send(wireMsg{ID: "s", Type: start, Payload: opPayload(t, `subscription { ticks(n: 1000000, intervalMs: 20) { n } }`, nil)})
			c.expectClose(CloseForbidden, "Forbidden: credential expired")
			testenv.Eventually(t, 2*time.Second, "the source to stop", func() bool { return ts.root.active.Load() == 0 })
		})
	}
}

// TestWithdrawnCredentialClosesSocket: a socket whose credential a re-check refuses (revoked,
// rotated past its grace, narrowed) is closed with 4403 and its operations stop; another
// identity's socket on the same server is untouched.
func TestWithdrawnCredentialClosesSocket(t *testing.T) {
	for _, proto := range []string{ProtocolTransportWS, ProtocolLegacy} {
		t.Run(proto, func(t *testing.T) {
			ts := newTestServer(t, Config{RecheckInterval: 10 * time.Millisecond})
			start := map[string]string{ProtocolTransportWS: "subscribe", ProtocolLegacy: "start"}[proto]
			next := map[string]string{ProtocolTransportWS: "next", ProtocolLegacy: "data"}[proto]
			sockets := map[string]*rawClient{}
			for who, key := range map[string]string{"alice": keyAlice, "bob": keyBob} {
				c := dialProto(t, ts.url, proto)
				c.send(wireMsg{Type: "connection_init", Payload: payloadObj(t, map[string]string{"Authorization": key})})
				c.expect("connection_ack", "")
				c.send(wireMsg{ID: "s", Type: start, Payload: opPayload(t, `subscription { ticks(n: 1000000, intervalMs: 20) { n } }`, nil)})
				c.expect(next, "s")
				sockets[who] = c
			}
			// Re-checks run and find nothing wrong: both sockets keep delivering.
			testenv.Eventually(t, 5*time.Second, "re-checks", func() bool { return ts.exec.rechecks.Load() >= 4 })
			sockets["alice"].expect(next, "s")

			ts.exec.withdrawn.Store("alice", struct{}{})
			sockets["alice"].expectClose(CloseForbidden, "Forbidden: credential no longer valid")
			testenv.Eventually(t, 2*time.Second, "alice's source to stop", func() bool { return ts.root.active.Load() == 1 })
			for range 3 {
				sockets["bob"].expect(next, "s")
			}
			if v := ts.metric(t, "carehub_ws_credential_closes_total", ""); v != 1 {
				t.Fatalf("carehub_ws_credential_closes_total = %v, want 1", v)
			}
		})
	}
}

// TestWSTestClient covers the helper other packages' black-box tests use, in both protocols.
func TestWSTestClient(t *testing.T) {
	for _, dial := range []struct {
		name string
		dial func(ctx context.Context, url, authorization string) (*wstest.Client, error)
	}{{ProtocolTransportWS, wstest.Dial}, {ProtocolLegacy, wstest.DialLegacy}} {
		t.Run(dial.name, func(t *testing.T) { testWSTestClient(t, dial.dial) })
	}
}

func testWSTestClient(t *testing.T, dial func(ctx context.Context, url, authorization string) (*wstest.Client, error)) {
	ts := newTestServer(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client, err := dial(ctx, ts.url, "Bearer "+keyAlice)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	endless, err := client.Subscribe(ctx, "endless", `subscription { ticks(n: 1000000, intervalMs: 5) { n } }`, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Results of another operation can be read first: nothing blocks the client meanwhile.
	q, err := client.Subscribe(ctx, "q", `query($name: String) { hello(name: $name) }`, map[string]any{"name": "wstest"})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(decodeResult(t, <-q).Data["hello"]); got != `"hello, wstest"` {
		t.Fatalf("hello = %s", got)
	}
	if _, open := <-q; open || client.Err("q") != nil {
		t.Fatalf("query channel still open or failed: %v", client.Err("q"))
	}
	for want := 1; want <= 3; want++ {
		if got := tickOf(t, <-endless, "ticks").N; got != want {
			t.Fatalf("tick %d, want %d", got, want)
		}
	}
	if err := client.Unsubscribe(ctx, "endless"); err != nil {
		t.Fatal(err)
	}
	for range endless { // closes promptly, pending results dropped
	}
	testenv.Eventually(t, 2*time.Second, "the source to stop", func() bool { return ts.root.active.Load() == 0 })

	bad, err := client.Subscribe(ctx, "bad", `subscription { nope }`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, open := <-bad; open {
		t.Fatal("invalid subscription yielded a result")
	}
	var opErr *wstest.OperationError
	if !errors.As(client.Err("bad"), &opErr) || !strings.Contains(opErr.Error(), "nope") {
		t.Fatalf("Err(bad) = %v, want an OperationError about nope", client.Err("bad"))
	}

	if _, err := client.Subscribe(ctx, "held", `subscription { ticks(n: 1000000, intervalMs: 5) { n } }`, nil); err != nil {
		t.Fatal(err)
	}
	if err := ts.h.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := client.Wait(ctx); websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Fatalf("Wait after shutdown = %v, want close 1001", err)
	}
	if websocket.CloseStatus(client.Err("held")) != websocket.StatusGoingAway {
		t.Fatalf("Err(held) = %v, want the socket's close", client.Err("held"))
	}
}
