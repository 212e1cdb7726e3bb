// Package httpcall is what carehub's clients of inference servers (processors/inference/oip,
// processors/inference/chat) share: one JSON request under a timeout with a bounded answer, the
// two ways it fails (StatusError: the server answered non-2xx; TransportError: it did not
// answer), and the rule of which failures are worth retrying (Retryable). Each client keeps
// what is its protocol's own: paths, bodies, and how its servers word an error.
package httpcall

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"carehub/kernel/egress"
)

// MaxErrorBody is how much of a non-2xx body is read for the error message.
const MaxErrorBody = 64 << 10

// StatusError is a non-2xx response: the HTTP status and the server's message.
type StatusError struct {
	Client     string // the client's name, which prefixes the error: oip, chat
	Method     string
	URL        string // without user information
	StatusCode int
	Message    string
}

func (e *StatusError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = "(no message)"
	}
	return fmt.Sprintf("%s: %s %s: %d %s: %s", e.Client, e.Method, e.URL, e.StatusCode, http.StatusText(e.StatusCode), msg)
}

// TransportError is a request that got no HTTP response: connection refused or reset,
// timeout, DNS failure, the connection closed mid-response.
type TransportError struct {
	Client string
	Method string
	URL    string // without user information
	Err    error
}

func (e *TransportError) Error() string {
	return fmt.Sprintf("%s: %s %s: %v", e.Client, e.Method, e.URL, e.Err)
}

func (e *TransportError) Unwrap() error { return e.Err }

// Retryable reports whether err is worth retrying later, on this or another replica: a
// TransportError (connection refused or reset, a timeout, including the call's own) or a
// StatusError with status 408, 429 or 5xx. Other 4xx statuses, a client's own refusals and a
// context the caller canceled are not.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	var se *StatusError
	if errors.As(err, &se) {
		return se.StatusCode >= 500 || se.StatusCode == http.StatusRequestTimeout || se.StatusCode == http.StatusTooManyRequests
	}
	var te *TransportError
	if errors.As(err, &te) {
		return !errors.Is(err, context.Canceled)
	}
	return false
}

// SharedClient is the keep-alive client of every inference client built without one. Its
// transport refuses a protocol switch (egress.Guard), whose answer no deadline bounds.
var SharedClient = &http.Client{Transport: egress.Guard(&http.Transport{
	Proxy: http.ProxyFromEnvironment,
	DialContext: (&net.Dialer{
		Timeout:   5 * time.Second,
		KeepAlive: 30 * time.Second,
	}).DialContext,
	ForceAttemptHTTP2:     true,
	MaxIdleConns:          256,
	MaxIdleConnsPerHost:   64,
	IdleConnTimeout:       90 * time.Second,
	TLSHandshakeTimeout:   5 * time.Second,
	ExpectContinueTimeout: time.Second,
})}

// Request is one call.
type Request struct {
	Client  string // the errors' prefix
	HTTP    *http.Client
	Method  string
	URL     string
	Shown   string // URL as errors show it (without user information); "" shows URL
	Header  http.Header
	Body    []byte // JSON; nil for none
	Timeout time.Duration
	// MaxBytes bounds the 2xx body; a longer one fails wrapping TooLarge.
	MaxBytes int64
	TooLarge error
	// ErrorMessage extracts the server's message from a non-2xx body (at most MaxErrorBody).
	ErrorMessage func([]byte) string
}

// Do sends r and returns the 2xx body.
func Do(ctx context.Context, r Request) ([]byte, error) {
	if r.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.Timeout)
		defer cancel()
	}
	shown := r.Shown
	if shown == "" {
		shown = r.URL
	}
	var rd io.Reader
	if r.Body != nil {
		rd = bytes.NewReader(r.Body)
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, r.URL, rd)
	if err != nil {
		return nil, fmt.Errorf("%s: %s %s: cannot build the request", r.Client, r.Method, shown)
	}
	for k, v := range r.Header {
		req.Header[k] = v
	}
	if r.Body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := r.HTTP.Do(req)
	if err != nil {
		return nil, &TransportError{Client: r.Client, Method: r.Method, URL: shown, Err: unwrapURLError(err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		msg, rerr := io.ReadAll(io.LimitReader(resp.Body, MaxErrorBody))
		se := &StatusError{Client: r.Client, Method: r.Method, URL: shown, StatusCode: resp.StatusCode, Message: r.ErrorMessage(msg)}
		if rerr != nil && se.Message == "" {
			se.Message = "reading the error body: " + rerr.Error()
		}
		return nil, se
	}
	if resp.ContentLength > r.MaxBytes {
		return nil, fmt.Errorf("%w: %s %s: Content-Length %d > %d bytes", r.TooLarge, r.Method, shown, resp.ContentLength, r.MaxBytes)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, r.MaxBytes+1))
	if err != nil {
		return nil, &TransportError{Client: r.Client, Method: r.Method, URL: shown, Err: fmt.Errorf("reading the response: %w", err)}
	}
	if int64(len(b)) > r.MaxBytes {
		return nil, fmt.Errorf("%w: %s %s: body over %d bytes", r.TooLarge, r.Method, shown, r.MaxBytes)
	}
	return b, nil
}

// unwrapURLError drops *url.Error's "Post "<url>": " prefix: the error says the URL, without
// the user information the full one may hold.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err
	}
	return err
}

// Truncate cuts s to n bytes, marking the cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
