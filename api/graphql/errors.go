package graphql

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	gqlerrors "github.com/graph-gophers/graphql-go/errors"
	"github.com/vektah/gqlparser/v2/ast"

	"carehub/kernel/fault"
)

// Codes of extensions.code (DECISIONS §3).
const (
	CodeUnauthenticated = "UNAUTHENTICATED"
	CodeForbidden       = "FORBIDDEN"
	CodeNotFound        = "NOT_FOUND"
	CodeBadUserInput    = "BAD_USER_INPUT"
	CodeConflict        = "CONFLICT"
	CodeRateLimited     = "RATE_LIMITED"
	CodeInternal        = "INTERNAL"
	// CodeUnavailable is REST's 503 UNAVAILABLE: a dependency (extensions.dependency, when a
	// store) cannot serve now; the same operation may succeed when retried.
	CodeUnavailable = "UNAVAILABLE"
)

var errPanic = errors.New("panic in a data loader")

// Code returns the GraphQL error code for err: the one place that maps fault kinds to GraphQL.
func Code(err error) string {
	switch fault.KindOf(err) {
	case fault.KindInvalid, fault.KindValidation, fault.KindTooLarge, fault.KindUnsupportedMedia:
		return CodeBadUserInput
	case fault.KindUnauthenticated:
		return CodeUnauthenticated
	case fault.KindForbidden, fault.KindInsufficientScope, fault.KindIPNotAllowed:
		return CodeForbidden
	case fault.KindNotFound:
		return CodeNotFound
	case fault.KindConflict:
		return CodeConflict
	case fault.KindRateLimited:
		return CodeRateLimited
	case fault.KindUnavailable:
		return CodeUnavailable
	}
	return CodeInternal
}

// mapErrors rewrites the errors of one response in place so that every one carries
// extensions.code and no internal detail reaches the client:
//
//   - a resolver's error: the code of its fault kind (Code), the fault's message and its details
//     as further extension keys (the id that was not found, the required scope, the invalid
//     fields); an unclassified error becomes INTERNAL "internal error" and is logged;
//   - an error already carrying a code (from the panic handler): kept;
//   - an error raised while executing without a resolver error (graph-gophers' "got nil for a
//     non-null field", context errors): INTERNAL, logged;
//   - anything else comes before execution (syntax, validation, unknown operation, limits):
//     BAD_USER_INPUT with graph-gophers' message.
//
// locations and path are graph-gophers' own: it fills them for every resolver error.
func mapErrors(ctx context.Context, logger *slog.Logger, errs []*gqlerrors.QueryError) {
	for _, e := range errs {
		if e == nil {
			continue
		}
		if _, ok := e.Extensions["code"]; ok {
			continue
		}
		switch {
		case e.ResolverError != nil:
			code := Code(e.ResolverError)
			ext := map[string]any{"code": code}
			if f := fault.As(e.ResolverError); f != nil && code != CodeInternal {
				e.Message = f.Message
				for k, v := range f.Details {
					if k != "code" {
						ext[k] = v
					}
				}
			} else if errors.Is(e.ResolverError, context.Canceled) {
				e.Message = "request cancelled"
			} else {
				logger.ErrorContext(ctx, "graphql resolver failed", "path", fmt.Sprint(e.Path), "err", e.ResolverError)
				e.Message = "internal error"
			}
			e.Extensions = ext
		case e.Path != nil:
			logger.ErrorContext(ctx, "graphql execution error", "path", fmt.Sprint(e.Path), "err", e.Message)
			e.Message = "internal error"
			e.Extensions = map[string]any{"code": CodeInternal}
		default:
			if e.Message == "graphql-ws protocol header is missing" { // graph-gophers' answer to a subscription over POST
				e.Message = "subscriptions are served over a WebSocket on this path (graphql-transport-ws or graphql-ws), not over POST"
			}
			e.Extensions = map[string]any{"code": CodeBadUserInput}
		}
	}
}

// nullDataWhenAllFailed returns null when every root field of data is null and each of them has
// an error at its path; otherwise data unchanged.
//
// This is how the spec's "when a single lookup finds nothing … data is null" is honoured:
// graph-gophers answers a failed nullable root field with {"data": {"organization": null}}, as the
// GraphQL specification prescribes for a partial result. When nothing of the operation succeeded
// (the spec's case: a single lookup), there is no partial result to keep, so the whole data is
// null. When other root fields succeeded their data is kept and only the failed field is null,
// so a multi-field query never loses results because one lookup missed.
func nullDataWhenAllFailed(data json.RawMessage, errs []*gqlerrors.QueryError) json.RawMessage {
	if len(errs) == 0 || len(data) == 0 || !bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")) {
		return data
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil || len(fields) == 0 {
		return data
	}
	failed := map[string]bool{}
	for _, e := range errs {
		if e != nil && len(e.Path) > 0 {
			if s, ok := e.Path[0].(string); ok {
				failed[s] = true
			}
		}
	}
	for name, v := range fields {
		if string(bytes.TrimSpace(v)) != "null" || !failed[name] {
			return data
		}
	}
	return json.RawMessage("null")
}

// addLocations gives each error that has a path but no locations (graph-gophers fills the path
// of a resolver's error, not its locations) the location of the field its path names in doc, the
// document precheck parsed, running the operation operationName selects.
func addLocations(doc *ast.QueryDocument, operationName string, errs []*gqlerrors.QueryError) {
	for _, e := range errs {
		if e == nil || len(e.Path) == 0 || len(e.Locations) > 0 {
			continue
		}
		e.Locations = locate(doc, operationName, e.Path)
	}
}

// panicHandler turns a resolver panic into an INTERNAL error; the panic itself is logged by
// graph-gophers' logger (ours, see slogPanicLogger).
type panicHandler struct{}

func (panicHandler) MakePanicError(ctx context.Context, value any) *gqlerrors.QueryError {
	return &gqlerrors.QueryError{Message: "internal error", Extensions: map[string]any{"code": CodeInternal}}
}

// slogPanicLogger logs resolver panics once, through slog.
type slogPanicLogger struct{ logger *slog.Logger }

func (l slogPanicLogger) LogPanic(ctx context.Context, value any) {
	l.logger.ErrorContext(ctx, "graphql resolver panicked", "panic", fmt.Sprint(value))
}

// queryError returns a coded error for a request rejected before execution.
func queryError(code, format string, args ...any) *gqlerrors.QueryError {
	return &gqlerrors.QueryError{Message: fmt.Sprintf(format, args...), Extensions: map[string]any{"code": code}}
}
