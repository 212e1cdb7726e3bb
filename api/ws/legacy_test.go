package ws

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"carehub/internal/testenv"
)

const lp = ProtocolLegacy

// initLegacy dials and completes connection_init with key; the first ka follows the ack.
func initLegacy(t *testing.T, ts *testServer, key string) *rawClient {
	t.Helper()
	c := dialProto(t, ts.url, lp)
	c.send(wireMsg{Type: "connection_init", Payload: payloadObj(t, map[string]string{"Authorization": key})})
	c.expect("connection_ack", "")
	if m, err := c.next(); err != nil || m.Type != "ka" {
		t.Fatalf("after connection_ack got %+v, %v; want ka", m, err)
	}
	return c
}

// legacyErr decodes the {message} payload of error and connection_error.
func legacyErr(t *testing.T, m wireMsg) string {
	t.Helper()
	var p struct{ Message string }
	if err := json.Unmarshal(m.Payload, &p); err != nil || p.Message == "" {
		t.Fatalf("%s payload %s has no message", m.Type, m.Payload)
	}
	return p.Message
}

func TestLegacySubscribe(t *testing.T) {
	ts := newTestServer(t, Config{})
	c := initLegacy(t, ts, "Bearer "+keyBob)
	c.send(wireMsg{ID: "1", Type: "start", Payload: opPayload(t,
		`subscription($n: Int!) { ticks(n: $n) { n who } }`, map[string]any{"n": 3})})
	for want := 1; want <= 3; want++ {
		got := tickOf(t, c.expect("data", "1").Payload, "ticks")
		if got.N != want || got.Who != "bob" {
			t.Fatalf("tick %d = %+v, want n=%d who=bob", want, got, want)
		}
	}
	c.expect("complete", "1")
}

func TestLegacyQueryAndMutation(t *testing.T) {
	ts := newTestServer(t, Config{})
	c := initLegacy(t, ts, keyAlice)
	tests := []struct{ query, field, want string }{
		{`{ hello(name: "legacy") }`, "hello", `"hello, legacy"`},
		{`{ whoami }`, "whoami", `"alice"`},
		{`mutation { bump(by: 3) }`, "bump", `3`},
	}
	for i, tt := range tests {
		id := fmt.Sprint(i)
		c.send(wireMsg{ID: id, Type: "start", Payload: opPayload(t, tt.query, nil)})
		if got := string(decodeResult(t, c.expect("data", id).Payload).Data[tt.field]); got != tt.want {
			t.Fatalf("%s = %s, want %s", tt.field, got, tt.want)
		}
		c.expect("complete", id)
	}
}

func TestLegacyStop(t *testing.T) {
	ts := newTestServer(t, Config{})
	c := initLegacy(t, ts, keyAlice)
	c.send(wireMsg{ID: "s", Type: "start", Payload: opPayload(t, `subscription { ticks(n: 100000, intervalMs: 20) { n } }`, nil)})
	c.expect("data", "s")
	c.send(wireMsg{ID: "s", Type: "stop"})
	// PROTOCOL.md: the server answers stop with complete; a data already in flight may precede it.
	for m := c.read(); m.Type != "complete"; m = c.read() {
		if m.Type != "data" || m.ID != "s" {
			t.Fatalf("unexpected %s id=%q after stop", m.Type, m.ID)
		}
	}
	testenv.Eventually(t, 5*time.Second, "the ticks source to stop", func() bool { return ts.root.active.Load() == 0 })
	// Nothing more for s: the next message is the answer to the next operation.
	time.Sleep(100 * time.Millisecond)
	c.send(wireMsg{ID: "q", Type: "start", Payload: opPayload(t, `{ hello }`, nil)})
	c.expect("data", "q")
	c.expect("complete", "q")
}

func TestLegacyMessageErrorsKeepSocketOpen(t *testing.T) {
	ts := newTestServer(t, Config{})
	c := initLegacy(t, ts, keyAlice)

	tests := []struct {
		name, send, wantType, wantID, wantMsg string
	}{
		{"bad JSON", `{"type":`, "connection_error", "", "JSON"},
		{"not an object", `"start"`, "connection_error", "", "object"},
		{"unknown type", `{"type":"subscribe","id":"x","payload":{"query":"{ hello }"}}`, "error", "x", `"subscribe"`},
		{"start without query", `{"type":"start","id":"y","payload":{}}`, "error", "y", "query"},
		{"start without id", `{"type":"start","payload":{"query":"{ hello }"}}`, "error", "", "id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c.sendRaw(tt.send)
			if msg := legacyErr(t, c.expect(tt.wantType, tt.wantID)); !strings.Contains(msg, tt.wantMsg) {
				t.Fatalf("message %q, want it to contain %q", msg, tt.wantMsg)
			}
		})
	}
	c.send(wireMsg{ID: "ok", Type: "start", Payload: opPayload(t, `{ hello }`, nil)})
	c.expect("data", "ok")
	c.expect("complete", "ok")
}

func TestLegacyRequestError(t *testing.T) {
	ts := newTestServer(t, Config{})
	c := initLegacy(t, ts, keyAlice)
	c.send(wireMsg{ID: "bad", Type: "start", Payload: opPayload(t, `subscription { ticks(n: -1) { n } }`, nil)})
	m := c.expect("error", "bad")
	if msg := legacyErr(t, m); !strings.Contains(msg, "n must not be negative") {
		t.Fatalf("error message %q", msg)
	}
	var p struct{ Errors []struct{ Message string } }
	if err := json.Unmarshal(m.Payload, &p); err != nil || len(p.Errors) != 1 {
		t.Fatalf("error payload %s should carry the GraphQL errors", m.Payload)
	}
	// No complete after error: the next message belongs to the next operation.
	c.send(wireMsg{ID: "ok", Type: "start", Payload: opPayload(t, `{ hello }`, nil)})
	c.expect("data", "ok")
}

func TestLegacyDuplicateIDReplacesOperation(t *testing.T) {
	ts := newTestServer(t, Config{})
	c := initLegacy(t, ts, keyAlice)
	c.send(wireMsg{ID: "a", Type: "start", Payload: opPayload(t, `subscription { first: ticks(n: 1000000, intervalMs: 20) { n } }`, nil)})
	if r := decodeResult(t, c.expect("data", "a").Payload); r.Data["first"] == nil {
		t.Fatalf("first operation's data lacks first: %v", r.Data)
	}
	c.send(wireMsg{ID: "a", Type: "start", Payload: opPayload(t, `subscription { second: ticks(n: 2, intervalMs: 50) { n } }`, nil)})
	var seconds int
	for {
		m := c.read()
		if m.ID != "a" {
			t.Fatalf("unexpected %s id=%q", m.Type, m.ID)
		}
		if m.Type == "complete" {
			break
		}
		r := decodeResult(t, m.Payload)
		switch {
		case r.Data["second"] != nil:
			seconds++
		case seconds > 0:
			t.Fatalf("data of the replaced operation after the new one's: %s", m.Payload)
		}
	}
	if seconds != 2 {
		t.Fatalf("%d results of the replacing operation, want 2", seconds)
	}
	testenv.Eventually(t, 5*time.Second, "the replaced source to stop", func() bool { return ts.root.active.Load() == 0 })
}

func TestLegacyStartBeforeInit(t *testing.T) {
	ts := newTestServer(t, Config{})
	c := dialProto(t, ts.url, lp)
	c.send(wireMsg{ID: "early", Type: "start", Payload: opPayload(t, `{ whoami }`, nil)})
	if msg := legacyErr(t, c.expect("error", "early")); !strings.Contains(msg, "connection_init") {
		t.Fatalf("error %q should point at connection_init", msg)
	}
	// Nothing ran, and the socket can still be initialised.
	c.send(wireMsg{Type: "connection_init", Payload: payloadObj(t, map[string]string{"Authorization": keyAlice})})
	c.expect("connection_ack", "")
	c.send(wireMsg{ID: "late", Type: "start", Payload: opPayload(t, `{ whoami }`, nil)})
	c.expect("data", "late")
}

func TestLegacyConnectionClosing(t *testing.T) {
	tests := []struct {
		name     string
		init     bool
		send     string
		errMsg   string // expected connection_error message, if any
		code     websocket.StatusCode
		reasonIn string
	}{
		{"unknown key", false, `{"type":"connection_init","payload":{"Authorization":"chk_test_nobody"}}`, "Forbidden: invalid API key or token", CloseForbidden, "Forbidden: invalid API key or token"},
		{"no payload", false, `{"type":"connection_init"}`, `Forbidden: connection_init payload has no "Authorization"`, CloseForbidden, `Forbidden: connection_init payload has no "Authorization"`},
		{"second init", true, `{"type":"connection_init","payload":{"Authorization":"` + keyAlice + `"}}`, "Too many", CloseTooManyInitRequests, "Too many initialisation requests"},
		{"connection_terminate", true, `{"type":"connection_terminate"}`, "", websocket.StatusNormalClosure, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := newTestServer(t, Config{})
			var c *rawClient
			if tt.init {
				c = initLegacy(t, ts, keyAlice)
			} else {
				c = dialProto(t, ts.url, lp)
			}
			c.sendRaw(tt.send)
			if tt.errMsg != "" {
				if msg := legacyErr(t, c.expect("connection_error", "")); !strings.Contains(msg, tt.errMsg) {
					t.Fatalf("connection_error %q, want it to contain %q", msg, tt.errMsg)
				}
			}
			c.expectClose(tt.code, tt.reasonIn)
		})
	}
}

func TestLegacyInitTimeout(t *testing.T) {
	ts := newTestServer(t, Config{InitTimeout: 150 * time.Millisecond})
	c := dialProto(t, ts.url, lp)
	c.expectClose(CloseInitTimeout, "Connection initialisation timeout")
}

func TestLegacyOversizedMessage(t *testing.T) {
	ts := newTestServer(t, Config{MaxMessageBytes: 1024})
	c := initLegacy(t, ts, keyAlice)
	c.send(wireMsg{ID: "big", Type: "start", Payload: opPayload(t, `{ hello(name: "`+strings.Repeat("a", 2000)+`") }`, nil)})
	c.expectClose(websocket.StatusMessageTooBig, "")
}
