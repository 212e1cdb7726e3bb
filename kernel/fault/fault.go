// Package fault is carehub's error vocabulary: a small set of kinds that services return and that
// one place per transport (api/rest, api/graphql) maps to HTTP statuses and GraphQL codes.
package fault

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
)

// Kind classifies an error for the transports.
type Kind int

// The kinds. Their HTTP and GraphQL mappings live in the transports.
const (
	KindInternal          Kind = iota
	KindInvalid                // 400 INVALID_REQUEST / BAD_USER_INPUT
	KindValidation             // 422 VALIDATION_FAILED / BAD_USER_INPUT
	KindUnauthenticated        // 401 UNAUTHORIZED / UNAUTHENTICATED
	KindForbidden              // 403 FORBIDDEN
	KindInsufficientScope      // 403 INSUFFICIENT_SCOPE / FORBIDDEN
	KindIPNotAllowed           // 403 IP_NOT_ALLOWED / FORBIDDEN
	KindNotFound               // 404 NOT_FOUND
	KindConflict               // 409 CONFLICT
	KindTooLarge               // 413 PAYLOAD_TOO_LARGE
	KindUnsupportedMedia       // 415 UNSUPPORTED_MEDIA_TYPE
	KindRateLimited            // 429 RATE_LIMITED
	KindUnavailable            // 503 UNAVAILABLE
)

// Error is a classified error. Details carry per-field validation messages or context such as the
// id that was not found.
type Error struct {
	Kind    Kind
	Message string
	Details map[string]any
	Err     error // cause, never shown to clients
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// KindOf returns the kind of err, KindInternal when it is not classified.
func KindOf(err error) Kind {
	if f := As(err); f != nil {
		return f.Kind
	}
	return KindInternal
}

// As returns the classified error in err's chain, or nil.
//
// A database's refusal of a text value that slipped past the edge's input checks (SQLSTATE 22021
// character_not_in_repertoire: a NUL byte or invalid UTF-8; 22P05 untranslatable_character: a
// \u0000 in JSON) is the client's bad input, not an internal failure: it classifies as KindInvalid.
// The error is recognised by its SQLState method (pgconn.PgError's), so this package needs no
// database driver.
func As(err error) *Error {
	var f *Error
	if errors.As(err, &f) {
		return f
	}
	var db interface{ SQLState() string }
	if !errors.As(err, &db) {
		return nil
	}
	switch state := db.SQLState(); {
	case strings.HasPrefix(state, "57P") || strings.HasPrefix(state, "08"):
		// operator_intervention (the server shutting down, crashed, or recovering: 57P01-57P03)
		// and connection_exception: the server cannot take the call now, and nothing was done.
		return &Error{Kind: KindUnavailable, Message: "the database (Postgres) is unavailable; retry later",
			Details: map[string]any{"dependency": "postgres"}, Err: err}
	case state == "22021" || state == "22P05":
		return &Error{Kind: KindInvalid, Message: "a text value holds a NUL byte or invalid UTF-8, which text must not", Err: err}
	case state == "53100": // disk_full: the statement wrote nothing, and nothing will be until space is freed
		return &Error{Kind: KindUnavailable, Message: "the database's disk is full: nothing was written; writes are refused until space is freed, retry later",
			Details: map[string]any{"dependency": "postgres", "reason": "disk_full"}, Err: err}
	}
	return nil
}

// New returns an error of kind k.
func New(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Message: fmt.Sprintf(format, args...)}
}

// NotFound says resource id does not exist or is not visible to the caller; the two are
// deliberately indistinguishable so existence does not leak across tenants.
func NotFound(resource, id string) *Error {
	return &Error{Kind: KindNotFound, Message: fmt.Sprintf("%s %q not found", resource, id),
		Details: map[string]any{"resource": resource, "id": id}}
}

// Invalid reports bad input.
func Invalid(format string, args ...any) *Error { return New(KindInvalid, format, args...) }

// Validation reports failed validation with per-field messages.
func Validation(message string, fields map[string]string) *Error {
	d := make(map[string]any, len(fields))
	for k, v := range fields {
		d[k] = v
	}
	return &Error{Kind: KindValidation, Message: message, Details: map[string]any{"fields": d}}
}

// Unauthenticated reports a missing, invalid or expired credential.
func Unauthenticated(message string) *Error { return New(KindUnauthenticated, "%s", message) }

// InsufficientScope reports a credential lacking scope.
func InsufficientScope(scope string) *Error {
	return &Error{Kind: KindInsufficientScope, Message: fmt.Sprintf("this operation requires the %s scope", scope),
		Details: map[string]any{"requiredScope": scope}}
}

// Conflict reports a state conflict.
func Conflict(format string, args ...any) *Error { return New(KindConflict, format, args...) }

// Unavailable reports a dependency that cannot serve right now.
func Unavailable(format string, args ...any) *Error { return New(KindUnavailable, format, args...) }

// Wrap returns err classified as k with message, keeping err as the cause.
func Wrap(k Kind, err error, message string) *Error {
	return &Error{Kind: k, Message: message, Err: err}
}

// Context returns err unchanged when it is already classified, and otherwise wrapped with what
// the caller was doing, so an unclassified error reaches the transport as an internal error that
// says where it arose.
func Context(err error, what string) error {
	if As(err) != nil {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Disconnected reports whether err says a server could not be reached or the connection to it
// broke (a network error, refused, reset, closed, cut short): what the stores' readers answer as
// 503 naming the store, with their drivers' own errors of that meaning.
func Disconnected(err error) bool {
	_, netErr := errors.AsType[net.Error](err)
	return netErr || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
