package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"carehub/api/envelope"
	"carehub/kernel/config"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
)

// HTTPLimits bounds what a client's connections may hold of a node (docs/LIMITS.md,
// "Connections"). Zero fields take the defaults below; negative ones are refused by Validate.
type HTTPLimits struct {
	// ReadHeaderTimeout bounds the request line and headers (http.Server.ReadHeaderTimeout).
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, headers and body, from its first byte
	// (http.Server.ReadTimeout): a body sent slower fails. The server lifts the deadline once
	// the body is read (or at once when there is none), so it never ends a handler that runs
	// longer, such as an export; observation ingest extends it for its large bodies.
	ReadTimeout time.Duration
	// WriteTimeout bounds each write to a client: one that takes nothing of an answer for that
	// long is dropped. A bound on progress, not on a whole answer (http.Server.WriteTimeout),
	// so that exports and WebSockets stream as long as the client reads.
	WriteTimeout time.Duration
	// IdleTimeout bounds a keep-alive connection between requests (http.Server.IdleTimeout).
	IdleTimeout time.Duration
	// MaxConns caps the open connections, WebSockets included. Past it, up to Overflow() more are
	// answered 503 and closed (a client learns to retry instead of hanging); past those a
	// connection is closed as soon as it is accepted. Both keep the node's file descriptors for
	// its own stores and brokers.
	MaxConns int
}

// Defaults of HTTPLimits.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 60 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxConns          = 10000
)

// WithDefaults returns l with its zero fields set to the defaults.
func (l HTTPLimits) WithDefaults() HTTPLimits {
	config.Default(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	config.Default(&l.ReadTimeout, DefaultReadTimeout)
	config.Default(&l.WriteTimeout, DefaultWriteTimeout)
	config.Default(&l.IdleTimeout, DefaultIdleTimeout)
	config.Default(&l.MaxConns, DefaultMaxConns)
	return l
}

// Validate refuses negative fields.
func (l HTTPLimits) Validate() error {
	if l.ReadHeaderTimeout < 0 || l.ReadTimeout < 0 || l.WriteTimeout < 0 || l.IdleTimeout < 0 || l.MaxConns < 0 {
		return errors.New("HTTP timeouts and the connection cap must not be negative (0: the default)")
	}
	return nil
}

// Overflow is how many connections past MaxConns are accepted only to be answered 503.
func (l HTTPLimits) Overflow() int { return max(16, l.MaxConns/16) }

// NewHTTPServer returns the node's http.Server for h with l (defaults filled in) applied; serve
// it on Listener(ln) so that the connection cap and the write timeout hold.
func NewHTTPServer(h http.Handler, l HTTPLimits, logger *slog.Logger, reg prometheus.Registerer) *HTTPServer {
	l = l.WithDefaults()
	s := &HTTPServer{limits: l, m: newConnMetrics(reg)}
	s.Server = &http.Server{
		Handler:           s.refuseOverflow(h),
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ConnContext:       withConn,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	return s
}

// HTTPServer is an http.Server that caps its connections.
type HTTPServer struct {
	*http.Server
	limits HTTPLimits
	m      *connMetrics
}

// Listener wraps ln so that the server's connections are counted and capped, and each write to
// a client is bounded by WriteTimeout.
func (s *HTTPServer) Listener(ln net.Listener) net.Listener {
	return &connLimiter{Listener: ln, limits: s.limits, m: s.m}
}

type connMetrics struct {
	open    prometheus.Gauge
	refused *prometheus.CounterVec
}

func newConnMetrics(reg prometheus.Registerer) *connMetrics {
	m := &connMetrics{
		open: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "carehub", Subsystem: "http", Name: "connections",
			Help: "Open HTTP connections (WebSockets included) under the connection cap."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "http", Name: "connections_refused_total",
			Help: "Connections past the cap: answered 503 (answered) or closed at once (closed)."}, []string{"how"}),
	}
	if reg != nil {
		reg.MustRegister(m.open, m.refused)
	}
	return m
}

// connLimiter counts open connections: up to MaxConns are served, Overflow more answered 503,
// the rest closed at once. It never blocks Accept, so the listen backlog never fills with
// connections nobody will take (netutil.LimitListener's behaviour).
type connLimiter struct {
	net.Listener
	limits HTTPLimits
	m      *connMetrics

	mu         sync.Mutex
	open, over int
}

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		over, ok := l.admit()
		if !ok {
			l.m.refused.WithLabelValues("closed").Inc()
			_ = c.Close()
			continue
		}
		if over {
			l.m.refused.WithLabelValues("answered").Inc()
		}
		return &limitedConn{Conn: c, l: l, over: over}, nil
	}
}

// admit counts a new connection: over when it is past MaxConns, !ok when past the overflow too.
func (l *connLimiter) admit() (over, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.open < l.limits.MaxConns:
		l.open++
		l.m.open.Inc()
		return false, true
	case l.over < l.limits.Overflow():
		l.over++
		return true, true
	}
	return false, false
}

func (l *connLimiter) release(over bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if over {
		l.over--
		return
	}
	l.open--
	l.m.open.Dec()
}

// limitedConn is one counted connection. Hijacked (WebSocket) connections stay counted until
// they close.
type limitedConn struct {
	net.Conn
	l     *connLimiter
	over  bool // past MaxConns: answered 503 and closed
	close sync.Once
}

// Write gives each write WriteTimeout to make progress. The server sets no write deadline of
// its own (http.Server.WriteTimeout is 0), so this is the only one.
func (c *limitedConn) Write(b []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.l.limits.WriteTimeout)); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

func (c *limitedConn) Close() error {
	c.close.Do(func() { c.l.release(c.over) })
	return c.Conn.Close()
}

type connKey struct{}

// withConn is http.Server.ConnContext: it lets refuseOverflow see the request's connection.
func withConn(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok { // TLS
		c = tc.NetConn()
	}
	if lc, ok := c.(*limitedConn); ok {
		return context.WithValue(ctx, connKey{}, lc)
	}
	return ctx
}

// refuseOverflow answers the requests of a connection past MaxConns with 503 UNAVAILABLE and
// Retry-After, and closes it.
func (s *HTTPServer) refuseOverflow(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lc, _ := r.Context().Value(connKey{}).(*limitedConn)
		if lc == nil || !lc.over {
			next.ServeHTTP(w, r)
			return
		}
		id := ids.New(ids.Request)
		r = r.WithContext(envelope.WithRequestID(r.Context(), id))
		w.Header().Set("Request-Id", id)
		w.Header().Set("Connection", "close")
		w.Header().Set("Retry-After", "1")
		status, obj := envelope.NewErrorObject(r, fault.Unavailable("the server holds %d connections, its limit; retry", s.limits.MaxConns))
		envelope.WriteJSON(w, status, envelope.ErrorBody{Error: obj})
	})
}
