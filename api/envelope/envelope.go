// Package envelope is the HTTP edge every carehub transport shares: the error envelope and codes of
// DECISIONS §3, JSON responses and list metadata, strict request decoding, and the request id and
// logger carried in a request's context. REST, GraphQL, auth and idempotency write errors through it.
package envelope

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"carehub/kernel/fault"
)

// Error codes of the REST error envelope (DECISIONS §3).
const (
	CodeInvalidRequest    = "INVALID_REQUEST"
	CodeUnauthorized      = "UNAUTHORIZED"
	CodeForbidden         = "FORBIDDEN"
	CodeInsufficientScope = "INSUFFICIENT_SCOPE"
	CodeIPNotAllowed      = "IP_NOT_ALLOWED"
	CodeNotFound          = "NOT_FOUND"
	CodeMethodNotAllowed  = "METHOD_NOT_ALLOWED"
	CodeConflict          = "CONFLICT"
	CodeTooLarge          = "PAYLOAD_TOO_LARGE"
	CodeUnsupportedMedia  = "UNSUPPORTED_MEDIA_TYPE"
	CodeValidationFailed  = "VALIDATION_FAILED"
	CodeRateLimited       = "RATE_LIMITED"
	CodeInternal          = "INTERNAL"
	CodeUnavailable       = "UNAVAILABLE"
)

// Status returns the HTTP status and REST error code for err. It is the one place that maps fault
// kinds to HTTP.
func Status(err error) (int, string) {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge, CodeTooLarge
	}
	switch fault.KindOf(err) {
	case fault.KindInvalid:
		return http.StatusBadRequest, CodeInvalidRequest
	case fault.KindValidation:
		return http.StatusUnprocessableEntity, CodeValidationFailed
	case fault.KindUnauthenticated:
		return http.StatusUnauthorized, CodeUnauthorized
	case fault.KindForbidden:
		return http.StatusForbidden, CodeForbidden
	case fault.KindInsufficientScope:
		return http.StatusForbidden, CodeInsufficientScope
	case fault.KindIPNotAllowed:
		return http.StatusForbidden, CodeIPNotAllowed
	case fault.KindNotFound:
		return http.StatusNotFound, CodeNotFound
	case fault.KindConflict:
		return http.StatusConflict, CodeConflict
	case fault.KindTooLarge:
		return http.StatusRequestEntityTooLarge, CodeTooLarge
	case fault.KindUnsupportedMedia:
		return http.StatusUnsupportedMediaType, CodeUnsupportedMedia
	case fault.KindRateLimited:
		return http.StatusTooManyRequests, CodeRateLimited
	case fault.KindUnavailable:
		return http.StatusServiceUnavailable, CodeUnavailable
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return http.StatusServiceUnavailable, CodeUnavailable
	}
	return http.StatusInternalServerError, CodeInternal
}

// ErrorBody is the REST error envelope: {error: {code, message, requestId, docsUrl}}.
type ErrorBody struct {
	Error ErrorObject `json:"error"`
}

// ErrorObject is the inside of the error envelope. Details is our addition for per-field
// validation messages.
type ErrorObject struct {
	Code      string         `json:"code"`
	Message   string         `json:"message"`
	RequestID string         `json:"requestId"`
	DocsURL   string         `json:"docsUrl"`
	Details   map[string]any `json:"details,omitempty"`
}

// NewErrorObject builds the envelope for err on request r; internal errors never show their cause.
func NewErrorObject(r *http.Request, err error) (int, ErrorObject) {
	status, code := Status(err)
	msg := "internal error"
	var details map[string]any
	if f := fault.As(err); f != nil && f.Kind != fault.KindInternal {
		msg = f.Message
		details = f.Details
	} else if status == http.StatusRequestEntityTooLarge {
		msg = "request body too large"
	} else if status == http.StatusServiceUnavailable {
		msg = "service temporarily unavailable"
	}
	return status, ErrorObject{Code: code, Message: msg, RequestID: RequestID(r.Context()),
		DocsURL: DocsURL(r, code), Details: details}
}

// DocsURL points at the served error documentation for code.
func DocsURL(r *http.Request, code string) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host + "/docs/errors#" + code
}

// WriteError writes err in the REST envelope, logging internal errors once.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	status, obj := NewErrorObject(r, err)
	if status >= 500 {
		LoggerFrom(r.Context()).Error("request failed", "status", status, "err", err)
	}
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="carehub"`)
	}
	WriteJSON(w, status, ErrorBody{Error: obj})
}

// Respond answers a handler's call: err in the envelope when it is set, else v as JSON with
// status.
func Respond(w http.ResponseWriter, r *http.Request, status int, v any, err error) {
	if err != nil {
		WriteError(w, r, err)
		return
	}
	WriteJSON(w, status, v)
}

// WriteJSON writes v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, `{"error":{"code":"INTERNAL","message":"encode response"}}`, http.StatusInternalServerError)
		return
	}
	WriteEncoded(w, status, b)
}

// WriteEncoded writes b, JSON its caller encoded, as WriteJSON writes a value: for an answer
// encoded without encoding/json, which would read it through again to check it.
func WriteEncoded(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// List is the REST list envelope {data, meta}; Meta is a Meta, a CursorMeta or nil.
type List[T any] struct {
	Data []T `json:"data"`
	Meta any `json:"meta,omitempty"`
}

// Meta is the metadata of a list that counts its matches.
type Meta struct {
	Total int64 `json:"total"`
}

// CursorMeta is the metadata of a cursor-paginated list; Cursor is null on the last page.
type CursorMeta struct {
	Total  int64   `json:"total"`
	Cursor *string `json:"cursor"`
}

type ctxKey int

const (
	requestIDKey ctxKey = iota
	loggerKey
)

// WithRequestID returns ctx carrying the request id.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey, id)
}

// RequestID returns the request id in ctx.
func RequestID(ctx context.Context) string {
	s, _ := ctx.Value(requestIDKey).(string)
	return s
}

// WithLogger returns ctx carrying a request-scoped logger.
func WithLogger(ctx context.Context, l *slog.Logger) context.Context {
	return context.WithValue(ctx, loggerKey, l)
}

// LoggerFrom returns the request-scoped logger, or the default one.
func LoggerFrom(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey).(*slog.Logger); ok {
		return l
	}
	return slog.Default()
}

// Prefers reports whether the request's Prefer headers (RFC 7240: comma-separated preferences)
// hold name=value: the name matched case-insensitively, the value so too, spaces around either
// and quotes around the value ignored. The REST API's return=minimal and the FHIR base's
// handling=lenient read it.
func Prefers(r *http.Request, name, value string) bool {
	for _, v := range r.Header.Values("Prefer") {
		for _, p := range strings.Split(v, ",") {
			n, val, _ := strings.Cut(p, "=")
			if strings.EqualFold(strings.TrimSpace(n), name) && strings.EqualFold(strings.Trim(strings.TrimSpace(val), `"`), value) {
				return true
			}
		}
	}
	return false
}
