package ws

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	graphql "github.com/graph-gophers/graphql-go"
	gqlerrors "github.com/graph-gophers/graphql-go/errors"
	"github.com/prometheus/client_golang/prometheus"

	"carehub/api/ws/wstest"
)

// testSchema is a small real schema: a query, a mutation and a channel-fed subscription.
const testSchema = `
schema { query: Query mutation: Mutation subscription: Subscription }
type Query {
  hello(name: String): String!
  whoami: String!
}
type Mutation {
  bump(by: Int!): Int!
}
type Subscription {
  # n ticks, intervalMs apart; each carries padBytes of padding. n < 0 is a resolver error.
  ticks(n: Int!, intervalMs: Int, padBytes: Int): Tick!
}
type Tick {
  n: Int!
  who: String!
  pad: String!
}
`

// Test credentials: the executor accepts these keys, with or without "Bearer ".
const (
	keyAlice = "chk_test_alice0000000000000000000000"
	keyBob   = "chk_test_bob000000000000000000000000"
)

type identityKey struct{}

func identity(ctx context.Context) string {
	who, _ := ctx.Value(identityKey{}).(string)
	return who
}

// root resolves every root type. active counts ticks producers still running, so tests can
// see that closing a socket or stopping an operation really stops the source.
type root struct {
	counter atomic.Int32
	active  atomic.Int64
}

func (r *root) Hello(args struct{ Name *string }) string {
	if args.Name == nil {
		return "hello, world"
	}
	return "hello, " + *args.Name
}

func (r *root) Whoami(ctx context.Context) string { return identity(ctx) }

func (r *root) Bump(args struct{ By int32 }) int32 { return r.counter.Add(args.By) }

type tickArgs struct {
	N          int32
	IntervalMs *int32
	PadBytes   *int32
}

func (r *root) Ticks(ctx context.Context, args tickArgs) (<-chan *tick, error) {
	if args.N < 0 {
		return nil, errors.New("n must not be negative")
	}
	var interval time.Duration
	if args.IntervalMs != nil {
		interval = time.Duration(*args.IntervalMs) * time.Millisecond
	}
	pad := ""
	if args.PadBytes != nil {
		pad = strings.Repeat("x", int(*args.PadBytes))
	}
	who := identity(ctx)
	ch := make(chan *tick)
	r.active.Add(1)
	go func() {
		defer r.active.Add(-1)
		defer close(ch)
		for i := int32(1); i <= args.N; i++ {
			if interval > 0 && i > 1 {
				select {
				case <-time.After(interval):
				case <-ctx.Done():
					return
				}
			}
			select {
			case ch <- &tick{n: i, who: who, pad: pad}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

type tick struct {
	n   int32
	who string
	pad string
}

func (t *tick) N() int32    { return t.n }
func (t *tick) Who() string { return t.who }
func (t *tick) Pad() string { return t.pad }

// testExecutor is the adapter the GraphQL layer will write: a fixed set of keys, and
// schema.Subscribe for every operation.
type testExecutor struct {
	schema *graphql.Schema
	keys   map[string]string
	// withdrawn holds the identities whose credential Recheck refuses (string → struct{}).
	withdrawn sync.Map
	rechecks  atomic.Int64
	// hold, when set, is what Execute of an opHeld operation waits for.
	hold chan struct{}
}

// Recheck refuses a socket whose identity was withdrawn.
func (e *testExecutor) Recheck(ctx context.Context) error {
	e.rechecks.Add(1)
	if _, ok := e.withdrawn.Load(identity(ctx)); ok {
		return errors.New("credential withdrawn")
	}
	return nil
}

// Keys and operation names that make the executor misbehave, for the failure paths.
const (
	keyPanic     = "chk_test_panic"
	keyExpiring  = "chk_test_expiring" // alice, with a credential that expires after 300 ms
	opPanic      = "Panic"             // Execute panics
	opFail       = "Fail"              // Execute returns a plain error
	opQueryError = "QueryError"        // Execute returns a *QueryError
	opHeld       = "Held"              // Execute waits for testExecutor.hold first
	msgInternal  = "internal server error"
)

func (e *testExecutor) Authenticate(ctx context.Context, _ *http.Request, authorization string) (context.Context, error) {
	if authorization == keyPanic {
		panic("authenticate blew up")
	}
	if authorization == keyExpiring {
		ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		context.AfterFunc(ctx, cancel)
		return context.WithValue(ctx, identityKey{}, "alice"), nil
	}
	who, ok := e.keys[strings.TrimPrefix(authorization, "Bearer ")]
	if !ok {
		return nil, errors.New("invalid API key")
	}
	return context.WithValue(ctx, identityKey{}, who), nil
}

func (e *testExecutor) Execute(ctx context.Context, req Request) (Results, error) {
	switch req.OperationName {
	case opPanic:
		panic("execute blew up")
	case opFail:
		return nil, errors.New("database password is hunter2")
	case opQueryError:
		return nil, gqlerrors.Errorf("operation not allowed")
	case opHeld:
		select {
		case <-e.hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	src, err := e.schema.Subscribe(ctx, req.Query, req.OperationName, req.Variables)
	if err != nil {
		return nil, err
	}
	return notifyingFrom(ResponsesFrom(ctx, src)), nil
}

// notifying is Results over a channel that say when Next would not wait (Notifier), as the
// GraphQL layer's shared subscriptions do: the operations of these tests park between
// responses. (droppingExecutor's are a Chan: the other path.)
type notifying struct {
	mu     sync.Mutex
	queue  []*Response
	ended  bool
	notify func()
	done   chan struct{}
}

func notifyingFrom(c <-chan *Response) *notifying {
	n := &notifying{done: make(chan struct{})}
	go func() {
		defer close(n.done)
		for r := range c {
			n.add(func() { n.queue = append(n.queue, r) })
		}
		n.add(func() { n.ended = true })
	}()
	return n
}

func (n *notifying) add(change func()) {
	n.mu.Lock()
	change()
	f := n.notify
	n.notify = nil
	n.mu.Unlock()
	if f != nil {
		f()
	}
}

func (n *notifying) Ready() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.queue) > 0 || n.ended
}

func (n *notifying) Notify(f func()) {
	n.mu.Lock()
	if len(n.queue) > 0 || n.ended {
		n.mu.Unlock()
		f()
		return
	}
	n.notify = f
	n.mu.Unlock()
}

// Next is called when Ready, or once the operation's context ended: it never waits.
func (n *notifying) Next(context.Context) (*Response, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.queue) == 0 {
		return nil, false
	}
	r := n.queue[0]
	n.queue = n.queue[1:]
	return r, true
}

func (n *notifying) Close(wait time.Duration) bool {
	select {
	case <-n.done:
		return true
	case <-time.After(wait):
		return false
	}
}

type testServer struct {
	h    *Handler
	exec *testExecutor
	srv  *httptest.Server
	reg  *prometheus.Registry
	root *root
	url  string
}

// newTestServer serves a Handler over loopback. On cleanup it shuts the handler down and
// checks that no operation, source or socket outlived it.
func newTestServer(t *testing.T, opts Config) *testServer {
	t.Helper()
	r := &root{}
	schema := graphql.MustParseSchema(testSchema, r)
	reg := prometheus.NewRegistry()
	opts.Metrics = reg
	opts.Logger = testLogger(t)
	exec := &testExecutor{schema: schema, keys: map[string]string{keyAlice: "alice", keyBob: "bob"}}
	h, err := New(exec, opts)
	if err != nil {
		t.Fatal(err)
	}

	srv := httptest.NewUnstartedServer(h)
	srv.Listener = smallBufferListener{srv.Listener}
	srv.Start()
	ts := &testServer{h: h, exec: exec, srv: srv, reg: reg, root: r, url: "ws" + strings.TrimPrefix(srv.URL, "http")}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := h.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		srv.Close()
		// Sources are the resolver's goroutines; they end soon after their context.
		for deadline := time.Now().Add(2 * time.Second); r.active.Load() != 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		if n := r.active.Load(); n != 0 {
			t.Errorf("%d ticks sources still running after shutdown", n)
		}
		for _, p := range []string{ProtocolTransportWS, ProtocolLegacy} {
			if v := ts.metric(t, "carehub_ws_operations", p); v != 0 {
				t.Errorf("carehub_ws_operations{protocol=%q} = %v after shutdown", p, v)
			}
			if v := ts.metric(t, "carehub_ws_connections", p); v != 0 {
				t.Errorf("carehub_ws_connections{protocol=%q} = %v after shutdown", p, v)
			}
		}
	})
	return ts
}

// smallBufferListener fixes the kernel send buffer of accepted sockets at 256 KiB (no
// autotuning up to megabytes), so a client that stops reading backs the server up quickly.
// Not smaller: below the loopback MSS, TCP falls back to zero-window probes and a client that
// resumes reading is served in slow motion.
type smallBufferListener struct{ net.Listener }

func (l smallBufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(256 << 10)
	}
	return c, err
}

// metric returns the value of a gauge or counter, with protocol as its label when non-empty.
func (ts *testServer) metric(t *testing.T, name, protocol string) float64 {
	t.Helper()
	families, err := ts.reg.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := protocol == ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "protocol" && l.GetValue() == protocol {
					match = true
				}
			}
			if !match {
				continue
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// waitFor polls cond until it holds or timeout passes.
// dial connects a wstest client (graphql-transport-ws) to the server with authorization; the
// client is closed when the test ends.
func (ts *testServer) dial(t *testing.T, ctx context.Context, authorization string) *wstest.Client {
	t.Helper()
	c, err := wstest.Dial(ctx, ts.url, authorization)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// testLogger logs through t until the test's cleanup ends, and drops lines after that.
func testLogger(t *testing.T) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.stop) // registered first, so it runs last
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

// wireMsg is any protocol message as a raw client sees it.
type wireMsg = wstest.Message

// rawClient speaks JSON over a WebSocket with no protocol logic, to drive the server into
// every corner of both protocols.
type rawClient struct {
	t    *testing.T
	conn *websocket.Conn
}

const ioTimeout = 5 * time.Second

func dialRaw(t *testing.T, url string, opts *websocket.DialOptions) *rawClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, url, opts)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	if resp.Body != nil {
		_ = resp.Body.Close()
	}
	conn.SetReadLimit(16 << 20)
	t.Cleanup(func() { _ = conn.CloseNow() })
	return &rawClient{t: t, conn: conn}
}

func dialProto(t *testing.T, url, protocol string) *rawClient {
	t.Helper()
	c := dialRaw(t, url, &websocket.DialOptions{Subprotocols: []string{protocol}})
	if got := c.conn.Subprotocol(); got != protocol {
		t.Fatalf("negotiated subprotocol %q, want %q", got, protocol)
	}
	return c
}

func (c *rawClient) sendRaw(s string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	if err := c.conn.Write(ctx, websocket.MessageText, []byte(s)); err != nil {
		c.t.Fatalf("send %s: %v", s, err)
	}
}

func (c *rawClient) send(m wireMsg) {
	c.t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		c.t.Fatalf("encode: %v", err)
	}
	c.sendRaw(string(b))
}

func (c *rawClient) next() (wireMsg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	return wstest.ReadMessage(ctx, c.conn)
}

// read returns the next message that is not a legacy keep-alive.
func (c *rawClient) read() wireMsg {
	c.t.Helper()
	for {
		m, err := c.next()
		if err != nil {
			c.t.Fatalf("read: %v", err)
		}
		if m.Type != "ka" {
			return m
		}
	}
}

// expect reads the next message and checks its type and id.
func (c *rawClient) expect(typ, id string) wireMsg {
	c.t.Helper()
	m := c.read()
	if m.Type != typ || m.ID != id {
		c.t.Fatalf("got message %s id=%q payload=%s, want %s id=%q", m.Type, m.ID, m.Payload, typ, id)
	}
	return m
}

// expectClose reads until the socket ends and checks the server's close code and reason.
func (c *rawClient) expectClose(code websocket.StatusCode, reason string) {
	c.t.Helper()
	skipped := 0
	for {
		_, err := c.next()
		if err == nil {
			skipped++
			continue
		}
		var ce websocket.CloseError
		if !errors.As(err, &ce) {
			c.t.Fatalf("socket ended with %v after %d messages, want close %d %q", err, skipped, code, reason)
		}
		if ce.Code != code || !strings.Contains(ce.Reason, reason) {
			c.t.Fatalf("closed with %d %q after %d messages, want %d containing %q", ce.Code, ce.Reason, skipped, code, reason)
		}
		return
	}
}

func (c *rawClient) close() { _ = c.conn.Close(websocket.StatusNormalClosure, "") }

func payloadObj(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encode payload: %v", err)
	}
	return b
}

func opPayload(t *testing.T, query string, vars map[string]any) json.RawMessage {
	return payloadObj(t, map[string]any{"query": query, "variables": vars})
}

// result is an execution result as next/data carries it.
type result struct {
	Data   map[string]json.RawMessage `json:"data"`
	Errors []struct {
		Message    string         `json:"message"`
		Extensions map[string]any `json:"extensions"`
	} `json:"errors"`
}

func decodeResult(t *testing.T, raw json.RawMessage) result {
	t.Helper()
	var r result
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("decode result %s: %v", raw, err)
	}
	return r
}

type tickData struct {
	N   int    `json:"n"`
	Who string `json:"who"`
	Pad string `json:"pad"`
}

// tickOf decodes {"data":{"<field>":{...}}} into the tick, failing on errors.
func tickOf(t *testing.T, raw json.RawMessage, field string) tickData {
	t.Helper()
	r := decodeResult(t, raw)
	if len(r.Errors) > 0 {
		t.Fatalf("result has errors: %s", raw)
	}
	var td tickData
	if err := json.Unmarshal(r.Data[field], &td); err != nil {
		t.Fatalf("decode %s of %s: %v", field, raw, err)
	}
	return td
}
