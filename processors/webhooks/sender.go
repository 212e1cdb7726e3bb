package webhooks

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"carehub/kernel/egress"
	"carehub/kernel/whsig"
)

// DefaultTimeout bounds one delivery attempt, connection included (DECISIONS §5).
const DefaultTimeout = 15 * time.Second

// responseBodyLimit is how much of a receiver's answer an attempt keeps.
const responseBodyLimit = 1 << 10

// drainLimit is how much more of an answer is read, unkept, so the connection can be reused.
const drainLimit = 64 << 10

// sender makes signed delivery attempts. Its transport refuses non-public destinations at
// connect time (unless allowPrivate), uses no proxy from the environment (a proxy would connect
// on our behalf, past the address check) and bounds what an answer may hold it with
// (egress.Guard, egress.MaxAnswerHeaderBytes). Over TLS it offers HTTP/2 and HTTP/1.1 and takes
// what the receiver chooses; plain http:// (allowPrivate only) is HTTP/1.1, through fasthttp's
// client under the same rules (plain.go). Connections are kept alive and reused either way.
//
// Attempts over TLS go to the transport itself, not through an http.Client: a client's only work
// here would be following redirects, which an attempt never does (a 3xx is a failed attempt: the
// subscription's URL is the only destination), and copying every request's headers for them.
// A subscription's URL is parsed once (urls), not on every attempt.
type sender struct {
	rt      http.RoundTripper // https://
	plain   *plainClient      // http:// (plain.go)
	timeout time.Duration
	urls    sync.Map // URL string → *url.URL, parsed; cleared when it holds maxParsedURLs
	nurls   atomic.Int32
}

// maxParsedURLs bounds sender.urls: URLs of subscriptions since deleted or re-pointed stay in it
// until it is cleared.
const maxParsedURLs = 4096

// newSender returns a sender; roots, when not nil, are the certificate authorities receivers'
// certificates are checked against (nil: the system's).
func newSender(allowPrivate bool, timeout time.Duration, maxConnsPerHost int, roots *x509.CertPool) *sender {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	dialer := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		dialer.Control = egress.DialControl
	}
	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            dialer.DialContext,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           256,
		MaxIdleConnsPerHost:    max(maxConnsPerHost, 2),
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    timeout,
		ResponseHeaderTimeout:  timeout,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: egress.MaxAnswerHeaderBytes,
	}
	if roots != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	return &sender{timeout: timeout, rt: egress.Guard(tr), plain: newPlainClient(dialer, timeout)}
}

func (s *sender) close() {
	if c, ok := s.rt.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
	s.plain.c.CloseIdleConnections()
}

// abort ends the plain attempts in flight (an https attempt ends with its context) and refuses
// new ones: for a dispatcher that is stopping.
func (s *sender) abort() { s.plain.conns.closeAll() }

// parse returns raw parsed, from s.urls when it was parsed before. A URL that does not parse is
// not kept.
func (s *sender) parse(raw string) (*url.URL, error) {
	if u, ok := s.urls.Load(raw); ok {
		return u.(*url.URL), nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if s.nurls.Add(1) > maxParsedURLs {
		s.urls.Clear()
		s.nurls.Store(1)
	}
	s.urls.Store(raw, u)
	return u, nil
}

// The headers every attempt sends beside its signature's, as set on each request's header map.
var (
	contentTypeJSON = []string{"application/json"}
	userAgentHeader = []string{userAgent}
)

// answers holds the buffers an attempt reads the first bytes of an answer into.
var answers = sync.Pool{New: func() any { return new([responseBodyLimit]byte) }}

// outcome is what one attempt found.
type outcome struct {
	StatusCode   int // 0 when there was no response
	Latency      time.Duration
	Err          string // why there was no response or the response is a failure; "" on success
	ResponseBody string // the answer's first bytes as valid UTF-8 without NUL, at most responseBodyLimit
	RetryAfter   time.Duration
	Header       http.Header // the request headers sent
	AttemptedAt  time.Time
}

// Succeeded reports a 2xx answer.
func (o outcome) Succeeded() bool { return o.StatusCode >= 200 && o.StatusCode < 300 }

// Gone reports a 410 answer: the receiver asks not to be called again.
func (o outcome) Gone() bool { return o.StatusCode == http.StatusGone }

// send POSTs body to url signed for message id with secrets (current first).
func (s *sender) send(ctx context.Context, rawURL, id string, body []byte, secrets []string) outcome {
	now := time.Now()
	h := http.Header{}
	out := outcome{AttemptedAt: now, Header: h} // the client does not change a request's headers
	if err := whsig.SetHeaders(h, id, now, body, secrets...); err != nil {
		out.Err = "signing: " + err.Error()
		return out
	}
	u, err := s.parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		out.Err = "bad url"
		return out
	}
	h["Content-Type"], h["User-Agent"] = contentTypeJSON, userAgentHeader
	if u.Scheme == "http" {
		s.plain.send(ctx, rawURL, h, body, now.Add(s.timeout), &out)
	} else {
		s.sendTLS(ctx, u, h, body, &out)
	}
	out.Latency = time.Since(now)
	switch {
	case out.StatusCode == 0, out.Succeeded():
	case out.StatusCode >= 300 && out.StatusCode < 400:
		out.Err = "redirect not followed"
	default:
		out.Err = "HTTP " + strconv.Itoa(out.StatusCode)
	}
	return out
}

// sendTLS POSTs body to u over net/http, HTTP/2 where the receiver offers it. It fills out's
// status, answer and error.
func (s *sender) sendTLS(ctx context.Context, u *url.URL, h http.Header, body []byte, out *outcome) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	// An empty URL parses to nothing in particular: the request is then given u, which requests
	// only read, and the body's length and GetBody (for a retry on a new HTTP/2 stream).
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "", bytes.NewReader(body))
	if err != nil {
		out.Err = "bad url"
		return
	}
	req.URL = u
	req.Header = h
	resp, err := s.rt.RoundTrip(req)
	if err != nil {
		out.Err = egress.Clip(describeSendError(err, ctx), egress.MaxErrorText)
		return
	}
	readAnswer(out, resp.StatusCode, resp.Body, func() string { return resp.Header.Get("Retry-After") })
	resp.Body.Close()
}

// readAnswer records an answer in out: its status, the first KiB of its body as storable text
// (the rest read and dropped, up to drainLimit, so that the connection can be used again), and
// on 429 and 503 its Retry-After.
func readAnswer(out *outcome, status int, body io.Reader, retryAfter func() string) {
	buf := answers.Get().(*[responseBodyLimit]byte)
	defer answers.Put(buf)
	n, _ := io.ReadFull(body, buf[:])
	_, _ = io.CopyN(io.Discard, body, drainLimit)
	out.StatusCode = status
	out.ResponseBody = egress.Clip(cleanText(buf[:n]), responseBodyLimit)
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		out.RetryAfter = parseRetryAfter(retryAfter(), time.Now())
	}
}

// describeSendError names a transport failure without echoing anything the receiver sent.
func describeSendError(err error, ctx context.Context) string {
	switch {
	case errors.Is(err, egress.ErrForbidden):
		return "webhook " + egress.ErrForbidden.Error()
	case errors.Is(ctx.Err(), context.DeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return "dns: " + dnsErr.Err
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		if opErr.Err != nil {
			return opErr.Op + ": " + opErr.Err.Error()
		}
		return opErr.Op + " failed"
	}
	msg := err.Error()
	if uerr, ok := errors.AsType[*url.Error](err); ok { // without the "Post \"url\"" preamble
		msg = uerr.Err.Error()
	}
	msg = strings.TrimPrefix(msg, "net/http: ")
	// net/http quotes what the receiver sent when it cannot read it (a malformed status or
	// header line, bytes that are not HTTP): the error keeps only what went wrong.
	if i := strings.IndexByte(msg, '"'); i >= 0 {
		msg = strings.TrimRight(msg[:i], ": ")
	}
	return msg
}

// cleanText makes b storable as Postgres text: valid UTF-8 without NUL. Each invalid byte
// becomes U+FFFD (three bytes), so the text can be longer than b.
func cleanText(b []byte) string {
	s := string(b)
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return strings.ReplaceAll(s, "\x00", "")
}
