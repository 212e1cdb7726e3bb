package ws

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
	gqlerrors "github.com/graph-gophers/graphql-go/errors"
	"github.com/prometheus/client_golang/prometheus"

	"carehub/kernel/config"
)

// Subprotocols negotiated through Sec-WebSocket-Protocol.
const (
	// ProtocolTransportWS is the graphql-ws library's protocol (graphql-transport-ws).
	ProtocolTransportWS = "graphql-transport-ws"
	// ProtocolLegacy is the subscriptions-transport-ws protocol (graphql-ws).
	ProtocolLegacy = "graphql-ws"
)

// Close codes this package sends; see the package documentation for when.
const (
	CloseSlowConsumer             websocket.StatusCode = 4008
	CloseTooManySockets           websocket.StatusCode = 4013
	CloseBadRequest               websocket.StatusCode = 4400
	CloseUnauthorized             websocket.StatusCode = 4401
	CloseForbidden                websocket.StatusCode = 4403
	CloseSubprotocolNotAcceptable websocket.StatusCode = 4406
	CloseInitTimeout              websocket.StatusCode = 4408
	CloseSubscriberExists         websocket.StatusCode = 4409
	CloseTooManyInitRequests      websocket.StatusCode = 4429
	CloseInternalServerError      websocket.StatusCode = 4500
)

// Executor is what the transport needs from the GraphQL layer.
type Executor interface {
	// Authenticate turns the connection_init payload's Authorization value (an API key or JWT,
	// with or without "Bearer "; empty when the client sent none) into a context carrying the
	// caller's identity. ctx is the connection's context, cancelled when the socket closes; the
	// returned context should derive from it; if it ends earlier (give it the credential's
	// expiry as deadline), the socket is closed with 4403. r is the upgrade request (remote address, headers)
	// and must not be read from. It returns an error for a missing or bad credential; the socket
	// is then closed with 4403 and no operation runs. The error is logged, so it must not
	// contain the credential; the client is told only "Forbidden".
	Authenticate(ctx context.Context, r *http.Request, authorization string) (context.Context, error)
	// Execute runs one operation under ctx, which derives from the context Authenticate
	// returned and is cancelled when the client stops the operation or the socket closes.
	// For a subscription the results are one response per event and end when the source ends
	// or ctx is cancelled; for a query or mutation there is exactly one. A first response
	// with Errors and no Data (nil, not JSON null) means the operation was rejected before it
	// ran (syntax, validation, authorization) and is sent as an error message. The caller
	// takes them promptly, except while the connection's send queue is full, and then for at
	// most Config.SlowConsumerTimeout. An error return is sent to the client as an error
	// message: a *gqlerrors.QueryError as it is, anything else as a generic internal error.
	Execute(ctx context.Context, req Request) (Results, error)
}

// Results are an operation's responses, taken in order by the operation's goroutine.
type Results interface {
	// Next returns the next response, waiting for it; false when there are no more or ctx
	// (the operation's) ended.
	Next(ctx context.Context) (*Response, bool)
	// Close is called once, after the operation's context is cancelled: it lets go of what the
	// results hold and waits up to wait for the operation's goroutines; false if they did not
	// end in that time.
	Close(wait time.Duration) bool
}

// Notifier is implemented by Results that can say when Next would not wait: the operation
// then holds no goroutine between responses (a subscriber waiting for its next event costs no
// stack), and Next is called only when Ready or once the operation's context has ended.
type Notifier interface {
	// Ready reports whether Next would return at once: a response is there or there are no more.
	Ready() bool
	// Notify has f called once, as soon as Ready is true (at once if it is now); a later Notify
	// replaces an f not called yet. f must not wait.
	Notify(f func())
}

// Chan is Results read from a channel that the executor's goroutine closes once it is done.
type Chan <-chan *Response

// Next implements Results.
func (c Chan) Next(ctx context.Context) (*Response, bool) {
	select {
	case r, ok := <-c:
		return r, ok
	case <-ctx.Done():
		return nil, false
	}
}

// Close implements Results: it discards what the channel still yields until it closes.
func (c Chan) Close(wait time.Duration) bool {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case _, ok := <-c:
			if !ok {
				return true
			}
		case <-t.C:
			return false
		}
	}
}

// Rechecker is implemented by an Executor whose credentials can be withdrawn while a socket is
// open: an API key revoked, rotated past its grace, narrowed. Every Config.RecheckInterval after
// connection_ack the socket calls Recheck with the context Authenticate returned, which ends
// when the socket closes; an error closes the socket with 4403 "Forbidden: credential no
// longer valid", cancelling its operations, and the client must reconnect with a valid
// credential. Recheck returns nil while the credential stands and also when it cannot tell (its
// store is out of reach): a socket is closed on a definite answer only, and asked again next
// time. It bounds its own slow paths (a store to reach): the next recheck of the socket waits
// for it, and it runs every second on every socket, so it should be a lookup in memory that
// allocates nothing per call on its usual path. The error is logged, so it must not contain the
// credential.
type Rechecker interface {
	Recheck(ctx context.Context) error
}

// Request is one GraphQL operation as a client sent it in subscribe (or legacy start).
type Request struct {
	Query         string
	OperationName string
	Variables     map[string]any
}

// Response is one GraphQL execution result, encoded as the payload of next (legacy data).
// Its fields match *graphql.Response of graph-gophers/graphql-go; see ResponsesFrom.
type Response struct {
	Data       json.RawMessage         `json:"data,omitempty"`
	Errors     []*gqlerrors.QueryError `json:"errors,omitempty"`
	Extensions map[string]any          `json:"extensions,omitempty"`
}

// Config configures a Handler. Zero fields take their defaults; negative ones are refused by
// New.
type Config struct {
	// InitTimeout is how long a socket may stay without a successful connection_init
	// (default 10 s); then it is closed with 4408.
	InitTimeout time.Duration
	// KeepAlive is the interval of WebSocket pings (both protocols) and legacy "ka" messages
	// (default 15 s). A peer that has not answered a ping within KeepAlive is dropped.
	KeepAlive time.Duration
	// WriteTimeout bounds the write of each frame (default 10 s); a socket that cannot take
	// one frame in that time is dropped.
	WriteTimeout time.Duration
	// SlowConsumerTimeout is how long an operation waits for room in a full send queue before
	// the socket is closed with 4008 (default 500 ms). Keep it below graph-gophers'
	// SubscribeResolverTimeout (1 s by default), which drops events it cannot hand over.
	SlowConsumerTimeout time.Duration
	// MaxMessageBytes is the largest message a client may send (default 64 KiB); a larger
	// one closes the socket with 1009.
	MaxMessageBytes int64
	// SubscriberBuffer is the capacity of each connection's send queue, in messages
	// (default 64).
	SubscriberBuffer int
	// RecheckInterval is how often an authenticated socket's credential is re-checked, when the
	// Executor is a Rechecker (default 1 s). A revocation reaches the socket within it plus
	// however long the Rechecker's own answers may be stale.
	RecheckInterval time.Duration
	// MaxOperationsPerConn caps the operations active at once on one socket (default 100); a
	// subscribe beyond it gets an error message for that operation.
	MaxOperationsPerConn int
	// Limits cap sockets and operations per credential (with an Executor that is an Owner) and
	// per node, and the bytes of each socket's send queue.
	Limits
	// OriginPatterns lists the cross-origin hosts allowed to open a socket (the request's own
	// host always is), as in websocket.AcceptOptions. Clients that send no Origin header
	// (non-browser clients) are always allowed.
	OriginPatterns []string
	// Logger receives connection events; default slog.Default().
	Logger *slog.Logger
	// Metrics, if set, registers the package's collectors (carehub_ws_*).
	Metrics prometheus.Registerer
}

// Defaults of Config.
const (
	DefaultInitTimeout          = 10 * time.Second
	DefaultKeepAlive            = 15 * time.Second
	DefaultWriteTimeout         = 10 * time.Second
	DefaultSlowConsumerTimeout  = 500 * time.Millisecond
	DefaultMaxMessageBytes      = 64 << 10
	DefaultSubscriberBuffer     = 64
	DefaultMaxOperationsPerConn = 100
	DefaultRecheckInterval      = time.Second
)

// Validate reports fields that are set but unusable (negative values).
func (o Config) Validate() error {
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"InitTimeout", o.InitTimeout}, {"KeepAlive", o.KeepAlive},
		{"WriteTimeout", o.WriteTimeout}, {"SlowConsumerTimeout", o.SlowConsumerTimeout},
		{"RecheckInterval", o.RecheckInterval},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("ws: %s must not be negative, got %v", d.name, d.v))
		}
	}
	if o.MaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("ws: MaxMessageBytes must not be negative, got %d", o.MaxMessageBytes))
	}
	if o.SubscriberBuffer < 0 {
		errs = append(errs, fmt.Errorf("ws: SubscriberBuffer must not be negative, got %d", o.SubscriberBuffer))
	}
	if o.MaxOperationsPerConn < 0 {
		errs = append(errs, fmt.Errorf("ws: MaxOperationsPerConn must not be negative, got %d", o.MaxOperationsPerConn))
	}
	if err := o.Limits.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// withDefaults fills zero values.
func (o Config) withDefaults() Config {
	config.Default(&o.InitTimeout, DefaultInitTimeout)
	config.Default(&o.KeepAlive, DefaultKeepAlive)
	config.Default(&o.WriteTimeout, DefaultWriteTimeout)
	config.Default(&o.SlowConsumerTimeout, DefaultSlowConsumerTimeout)
	config.Default(&o.MaxMessageBytes, DefaultMaxMessageBytes)
	config.Default(&o.SubscriberBuffer, DefaultSubscriberBuffer)
	config.Default(&o.MaxOperationsPerConn, DefaultMaxOperationsPerConn)
	config.Default(&o.RecheckInterval, DefaultRecheckInterval)
	o.Limits = o.Limits.WithDefaults()
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Handler accepts WebSocket upgrades and serves GraphQL over them. It is safe for concurrent
// use. Route only upgrade requests to it; anything else is answered 426 Upgrade Required.
type Handler struct {
	exec    Executor
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	counts  *counts // sockets and operations against cfg.Limits

	mu     sync.Mutex
	closed bool
	conns  map[*conn]struct{}
	wg     sync.WaitGroup // one per ServeHTTP call past the closed check, then per socket served
}

// New returns a Handler that runs operations on exec, configured by cfg with its defaults
// filled in. It refuses a cfg that Validate refuses.
func New(exec Executor, cfg Config) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Handler{
		exec:    exec,
		cfg:     cfg,
		log:     cfg.Logger,
		metrics: newMetrics(cfg.Metrics),
		counts:  newCounts(cfg.Limits),
		conns:   make(map[*conn]struct{}),
	}, nil
}

// ServeHTTP upgrades the request and starts serving the socket. It returns once the socket is
// accepted: the connection is hijacked, so net/http is done with it, and the socket is served on
// a goroutine of its own (Shutdown waits for it). The goroutine that ran the middleware chain
// would otherwise hold that chain's stack for as long as the socket stays open.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		http.Error(w, "server shutting down", http.StatusServiceUnavailable)
		return
	}
	h.wg.Add(1)
	h.mu.Unlock()
	served := false
	defer func() {
		if !served {
			h.wg.Done()
		}
	}()

	// Loggers are made when there is something to log: a clone of the handler's per socket
	// would be held for the socket's life.
	log := func() *slog.Logger { return h.log.With("remote_addr", r.RemoteAddr) }
	defer logPanic(log)

	wsc, err := websocket.Accept(smallBuffers{w}, r, &websocket.AcceptOptions{
		Subprotocols:   []string{ProtocolTransportWS, ProtocolLegacy},
		OriginPatterns: h.cfg.OriginPatterns,
	})
	if err != nil {
		// Accept has already answered the request.
		log().Debug("ws: upgrade rejected", "error", err)
		return
	}
	wsc.SetReadLimit(h.cfg.MaxMessageBytes)

	var proto *protocol
	switch wsc.Subprotocol() {
	case ProtocolTransportWS:
		proto = transportProtocol
	case ProtocolLegacy:
		proto = legacyProtocol
	default:
		log().Debug("ws: no acceptable subprotocol", "offered", r.Header.Values("Sec-WebSocket-Protocol"))
		_ = wsc.Close(CloseSubprotocolNotAcceptable, "Subprotocol not acceptable")
		return
	}

	c := newConn(h, wsc, r, proto)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		_ = wsc.Close(websocket.StatusGoingAway, "Going away")
		return
	}
	h.conns[c] = struct{}{}
	h.mu.Unlock()
	served = true
	go func() {
		defer h.wg.Done()
		defer func() {
			h.mu.Lock()
			delete(h.conns, c)
			h.mu.Unlock()
		}()
		defer logPanic(log)
		c.serve()
	}()
}

// logPanic, deferred, logs a panic of serving a socket and ends it there: a panic would take
// the whole server down with it, and the socket is lost anyway.
func logPanic(log func() *slog.Logger) {
	if v := recover(); v != nil {
		log().Error("ws: panic serving socket", "panic", v)
	}
}

// Shutdown refuses new sockets, closes every open one with 1001 "Going away" (cancelling
// their operations) and waits until all are gone or ctx ends; then it drops the rest without
// a close handshake and still waits for their goroutines. It is idempotent.
func (h *Handler) Shutdown(ctx context.Context) error {
	h.mu.Lock()
	h.closed = true
	conns := make([]*conn, 0, len(h.conns))
	for c := range h.conns {
		conns = append(conns, c)
	}
	h.mu.Unlock()

	for _, c := range conns {
		c.fail(websocket.StatusGoingAway, "Going away", closeHandshake)
	}
	done := make(chan struct{})
	go func() {
		h.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	for _, c := range conns {
		_ = c.ws.CloseNow()
	}
	<-done
	return fmt.Errorf("ws: shutdown: %w", ctx.Err())
}

// Close is Shutdown without a grace period: every socket is dropped at once.
func (h *Handler) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
