package webhooks

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"carehub/kernel/egress"
)

// Plain http:// attempts (allowPrivate only: a hospital's integration engine on its own network,
// a receiver beside the node) go through fasthttp's client rather than net/http's. An attempt is
// then written and its answer read on the goroutine that makes it, with no hand-over to a
// connection's reader and writer goroutines and no allocation per request: a delivery cost the
// node about 21 µs of CPU in net/http's client, and the attempt waited for those goroutines to be
// scheduled on a busy machine (docs/PERFORMANCE.md, "Webhooks at stream speed"). https:// stays on
// net/http, which offers HTTP/2 and takes it where the receiver does.
//
// The rules are net/http's path's: the same dialer (egress.DialControl refuses non-public
// addresses at connect time unless allowPrivate), no proxy, no redirect followed, answer headers
// bounded by egress.MaxAnswerHeaderBytes, a 101 refused and its connection closed, the first
// responseBodyLimit bytes of an answer kept and up to drainLimit more read so the connection can
// be reused, and the whole attempt bounded by the sender's timeout. Errors are named by what went
// wrong, never by what the receiver sent (fasthttp quotes the bytes it could not parse).

// plainClient makes plain http:// attempts.
type plainClient struct {
	c     *fasthttp.Client
	conns connSet
}

func newPlainClient(dialer *net.Dialer, timeout time.Duration) *plainClient {
	p := &plainClient{conns: connSet{open: map[*trackedConn]struct{}{}}}
	p.c = &fasthttp.Client{
		DialTimeout: func(addr string, t time.Duration) (net.Conn, error) {
			d := *dialer
			d.Timeout = min(t, timeout)
			c, err := d.Dial("tcp", addr)
			if err != nil {
				return nil, err
			}
			return p.conns.track(c)
		},
		NoDefaultUserAgentHeader: true, // each attempt names carehub
		// Attempts in flight are bounded by the dispatcher (DefaultMaxInFlight) and each
		// subscription's maxInFlight; this only keeps fasthttp from refusing one of them.
		MaxConnsPerHost:     4 * DefaultMaxInFlight,
		MaxConnWaitTimeout:  timeout,
		MaxIdleConnDuration: 90 * time.Second, // as net/http's IdleConnTimeout
		ReadBufferSize:      egress.MaxAnswerHeaderBytes,
		StreamResponseBody:  true,
		// The subscription's URL as it was given, as net/http sends it: fasthttp would otherwise
		// rewrite "//" and "/../" in its path.
		DisablePathNormalizing:    true,
		MaxIdemponentCallAttempts: 2,
		ConfigureClient: func(hc *fasthttp.HostClient) error {
			hc.RetryIfErr = retryStale(hc)
			return nil
		},
	}
	return p
}

// stale reports an error of a connection the receiver had closed: the end of it, or its reset
// (when the receiver's reset reached the client before its close was read).
func stale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, fasthttp.ErrConnectionClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// retryStale is a receiver's RetryIfErr. fasthttp retries no POST by itself, and unlike
// net/http it does not notice that a receiver closed a kept-alive connection while it was idle
// (as receivers with a keep-alive shorter than the client's 90 s do: Node's is 5 s): the next
// attempt on it finds it closed before any answer. Such an attempt is made once more, with the
// same webhook-id (at least once, as every retry), after the receiver's other idle connections
// are closed too: they were idle as long, and the retry would take the next of them.
func retryStale(hc *fasthttp.HostClient) fasthttp.RetryIfErrFunc {
	return func(_ *fasthttp.Request, attempts int, err error) (bool, bool) {
		if attempts >= 2 || !stale(err) {
			return false, false
		}
		hc.CloseIdleConnections()
		return false, true
	}
}

// send POSTs body to rawURL with the headers h (net/http's header map, as recorded), until
// deadline. It fills out's status, answer and error.
func (p *plainClient) send(ctx context.Context, rawURL string, h http.Header, body []byte, deadline time.Time, out *outcome) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(rawURL)
	req.Header.SetMethod(http.MethodPost)
	for k, vs := range h {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.SetBodyRaw(body)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	err := p.c.DoDeadline(req, resp, deadline)
	if err == nil && resp.StatusCode() == http.StatusSwitchingProtocols {
		err = egress.ErrProtocolSwitch // fasthttp closes a 101's connection
	}
	if err != nil {
		out.Err = egress.Clip(describePlainError(err, ctx), egress.MaxErrorText)
		if s := resp.BodyStream(); s != nil {
			_ = resp.CloseBodyStream()
		}
		return
	}
	answer := resp.BodyStream()
	if answer == nil { // an answer without a body
		answer = bytes.NewReader(resp.Body())
	}
	readAnswer(out, resp.StatusCode(), answer, func() string { return string(resp.Header.Peek("Retry-After")) })
	_ = resp.CloseBodyStream() // a body not read to its end closes the connection
}

// describePlainError names a failed plain attempt without echoing anything the receiver sent:
// fasthttp's parse errors quote the bytes they stopped at, so they are named by their kind.
func describePlainError(err error, ctx context.Context) string {
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, egress.ErrForbidden):
		return "webhook " + egress.ErrForbidden.Error()
	case errors.Is(err, egress.ErrProtocolSwitch):
		return egress.ErrProtocolSwitch.Error()
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, fasthttp.ErrDialTimeout), errors.Is(err, context.DeadlineExceeded),
		errors.Is(ctx.Err(), context.DeadlineExceeded):
		return "timeout"
	case ctx.Err() != nil:
		return "cancelled"
	case errors.Is(err, errStopping):
		return errStopping.Error()
	case errors.As(err, &small), errors.Is(err, fasthttp.ErrSmallReadBuffer):
		return "answer headers exceeded " + strconv.Itoa(egress.MaxAnswerHeaderBytes) + " bytes"
	case errors.Is(err, fasthttp.ErrConnectionClosed):
		return "connection closed by the receiver before it answered"
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return "no connection free to the receiver"
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return describeSendError(err, ctx)
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "status code"), strings.Contains(msg, "first line of response"):
		return "malformed HTTP status code"
	case strings.Contains(msg, "header"):
		return "malformed HTTP header"
	case strings.Contains(msg, "body"), strings.Contains(msg, "chunk"):
		return "malformed HTTP body"
	}
	return "malformed HTTP answer"
}

// connSet is the plain client's open connections, so that stopping can close them all: fasthttp
// takes no context, and an attempt in flight ends when its connection does.
type connSet struct {
	mu      sync.Mutex
	open    map[*trackedConn]struct{}
	stopped bool
}

// errStopping refuses connections after closeAll.
var errStopping = errors.New("stopping")

func (s *connSet) track(c net.Conn) (net.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		c.Close()
		return nil, errStopping
	}
	t := &trackedConn{Conn: c, set: s}
	s.open[t] = struct{}{}
	return t, nil
}

// closeAll closes every open connection (their attempts fail at once) and refuses new ones.
func (s *connSet) closeAll() {
	s.mu.Lock()
	s.stopped = true
	open := s.open
	s.open = map[*trackedConn]struct{}{}
	s.mu.Unlock()
	for c := range open {
		c.Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	set *connSet
}

func (c *trackedConn) Close() error {
	c.set.mu.Lock()
	delete(c.set.open, c)
	c.set.mu.Unlock()
	return c.Conn.Close()
}
