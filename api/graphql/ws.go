package graphql

import (
	"context"
	"net/http"
	"net/netip"
	"strings"

	gql "github.com/graph-gophers/graphql-go"
	gqlerrors "github.com/graph-gophers/graphql-go/errors"

	"carehub/api/auth"
	"carehub/api/ws"
	"carehub/processors/access"
)

// Authenticator turns an Authorization value into a principal (*auth.Authenticator).
type Authenticator interface {
	Authenticate(ctx context.Context, authorization string, clientIP netip.Addr) (*access.Principal, error)
}

// Executor returns the adapter api/ws runs operations on: it authenticates connection_init's
// Authorization value with a and executes queries, mutations and subscriptions with the same
// schema, limits, loaders and error mapping as POST /graphql.
func (h *Handler) Executor(a Authenticator) ws.Executor { return &wsExecutor{h: h, a: a} }

type wsExecutor struct {
	h *Handler
	a Authenticator
}

func (e *wsExecutor) Authenticate(ctx context.Context, r *http.Request, authorization string) (context.Context, error) {
	p, err := e.a.Authenticate(ctx, authorization, auth.ClientIP(r))
	if err != nil {
		return nil, err
	}
	return access.With(ctx, p), nil
}

func (e *wsExecutor) Execute(ctx context.Context, req ws.Request) (<-chan *ws.Response, error) {
	if errs := e.h.precheck(req.Query); errs != nil {
		c := make(chan *ws.Response, 1)
		c <- &ws.Response{Errors: errs}
		close(c)
		return c, nil
	}
	ctx = withLoaders(ctx, newLoaders(e.h.s))
	src, err := e.h.schemaFor(req.Query).Subscribe(ctx, req.Query, req.OperationName, req.Variables)
	if err != nil {
		return nil, &gqlerrors.QueryError{Message: err.Error(), Extensions: map[string]any{"code": CodeInternal}}
	}
	// Map each response's errors on the way; keep draining src after ctx ends so graph-gophers'
	// goroutines finish (ws.ResponsesFrom relies on the channel closing).
	mapped := make(chan any)
	go func() {
		defer close(mapped)
		for item := range src {
			if res, ok := item.(*gql.Response); ok {
				item = e.h.finishWS(ctx, Request{Query: req.Query, OperationName: req.OperationName}, res)
			}
			select {
			case mapped <- item:
			case <-ctx.Done():
			}
		}
	}()
	return ws.ResponsesFrom(ctx, mapped), nil
}

// finishWS is finish for a WebSocket response: a response with no data stays without data (a
// rejected operation).
func (h *Handler) finishWS(ctx context.Context, req Request, res *gql.Response) *ws.Response {
	out := h.finish(ctx, req, res)
	return &ws.Response{Data: out.Data, Errors: out.Errors, Extensions: out.Extensions}
}

// WithWebSocket routes WebSocket upgrade requests to wsh (api/ws) and everything else to h, so
// that both share the GraphQL path.
func WithWebSocket(h, wsh http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			wsh.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}
