package graphql

import (
	"context"
	"net/http"
	"net/netip"
	"strings"
	"time"

	gql "github.com/graph-gophers/graphql-go"
	gqlerrors "github.com/graph-gophers/graphql-go/errors"
	"github.com/vektah/gqlparser/v2/ast"

	"carehub/api/ws"
	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/processors/audit"
)

// Authenticator turns an Authorization value into a principal, and tells whether a principal
// it returned still stands (*auth.Authenticator).
type Authenticator interface {
	Authenticate(ctx context.Context, authorization string, clientIP netip.Addr) (*access.Principal, error)
	Recheck(ctx context.Context, p *access.Principal) error
	// ClientIP is r's client address as the authenticator sees it (behind trusted proxies too).
	ClientIP(r *http.Request) netip.Addr
}

// Auditor records an operation in the HIPAA audit log (*auth.Auditor). When the operation touched
// a patient it returns an error unless the record is durable, and the data must not be sent.
// Refused records a refused credential.
type Auditor interface {
	Audit(ctx context.Context, c audit.Call) error
	Refused(c audit.Call, err error)
}

// Executor returns the adapter api/ws runs operations on: it authenticates connection_init's
// Authorization value with a and executes queries, mutations and subscriptions with the same
// schema, limits, loaders and error mapping as POST /graphql. With an auditor, every message an
// operation sends is audited first (live keys), as HTTP requests are by the audit middleware.
func (h *Handler) Executor(a Authenticator, au Auditor) ws.Executor {
	return &wsExecutor{h: h, a: a, au: au}
}

type wsExecutor struct {
	h  *Handler
	a  Authenticator
	au Auditor
}

type userAgentKey struct{}

// wsConnectionInit is the operation a refused connection_init is audited as.
const wsConnectionInit = "graphql ws connection_init"

func (e *wsExecutor) Authenticate(ctx context.Context, r *http.Request, authorization string) (context.Context, error) {
	start := time.Now()
	p, err := e.a.Authenticate(ctx, authorization, e.a.ClientIP(r))
	switch {
	case err == nil:
	case e.au == nil:
		return nil, err
	case p != nil: // a known key from outside its IP allowlist: a denied call of that key
		e.au.Audit(access.With(ctx, p), audit.Call{Start: start, UserAgent: r.UserAgent(), Operation: wsConnectionInit,
			Status: http.StatusForbidden})
		return nil, err
	default:
		e.au.Refused(audit.Call{Start: start, UserAgent: r.UserAgent(), Operation: wsConnectionInit}, err)
		return nil, err
	}
	return context.WithValue(access.With(ctx, p), userAgentKey{}, r.UserAgent()), nil
}

// Owner implements ws.Owner: a socket counts against its API key's limits of sockets and
// operations (docs/LIMITS.md), and one opened with a JWT against the key the JWT came from, so
// minting tokens does not multiply them; and against its organization's, so minting keys does
// not either.
func (e *wsExecutor) Owner(ctx context.Context) (key, org string) {
	if p := access.From(ctx); p != nil {
		return p.KeyID, p.OrgID
	}
	return "", ""
}

// Recheck implements ws.Rechecker: a socket lives only as long as the credential it was opened
// with (revoked, rotated past its grace, narrowed: closed with 4403). An unreachable key store
// proves nothing either way, so the socket stays and is asked again next time.
func (e *wsExecutor) Recheck(ctx context.Context) error {
	err := e.a.Recheck(ctx, access.From(ctx))
	if fault.KindOf(err) == fault.KindUnavailable {
		return nil
	}
	return err
}

// audit records one message of an operation, op its name (readDoc.operation); on failure the
// message becomes an UNAVAILABLE error so patient data never leaves unaudited.
func (e *wsExecutor) audit(ctx context.Context, op string, start time.Time, res *ws.Response) *ws.Response {
	if e.au == nil {
		return res
	}
	ua, _ := ctx.Value(userAgentKey{}).(string)
	status := http.StatusOK
	if len(res.Errors) > 0 && res.Data == nil {
		status = http.StatusBadRequest
	}
	err := e.au.Audit(ctx, audit.Call{Start: start, UserAgent: ua, Operation: op, Status: status})
	if err == nil {
		return res
	}
	return &ws.Response{Errors: []*gqlerrors.QueryError{{Message: "the audit log is unavailable; patient data withheld",
		Extensions: map[string]any{"code": CodeInternal}}}}
}

func (e *wsExecutor) Execute(ctx context.Context, req ws.Request) (ws.Results, error) {
	d, errs := e.h.precheck(Request(req))
	if errs != nil {
		c := make(chan *ws.Response, 1)
		c <- &ws.Response{Errors: errs}
		close(c)
		return ws.Chan(c), nil
	}
	if p := access.From(ctx); p != nil && isSubscription(d.doc, req.OperationName) {
		if key, ok := shareKey(p, req); ok {
			res, err := e.subscribeShared(ctx, p, d, req, key)
			if err != nil {
				return nil, &gqlerrors.QueryError{Message: err.Error(), Extensions: map[string]any{"code": CodeInternal}}
			}
			return res, nil
		}
	}
	ctx = withLoaders(ctx, newLoaders(e.h.s))
	ctx, _ = access.WithRecorder(ctx)
	// A query or mutation has the answer-size budget of POST /graphql. A subscription has none:
	// it would add up over the subscription's life; each of its answers is held to the bound
	// as serialized (finish).
	//
	// The budget's context (opCtx) is the operation's alone, and the answers travel on the
	// socket's (ctx): ending opCtx once the last answer is handed over must not drop that answer
	// on its way out.
	opCtx, cancel := ctx, context.CancelFunc(func() {})
	var budget *answerBudget
	if !isSubscription(d.doc, req.OperationName) {
		var refused *Response
		if opCtx, budget, cancel, refused = e.h.answerBudget(ctx); refused != nil {
			c := make(chan *ws.Response, 1)
			c <- &ws.Response{Errors: refused.Errors}
			close(c)
			return ws.Chan(c), nil
		}
	}
	start, op := time.Now(), d.operation(req.OperationName)
	src, err := d.schema.Subscribe(opCtx, req.Query, req.OperationName, req.Variables)
	if err != nil {
		cancel()
		return nil, &gqlerrors.QueryError{Message: err.Error(), Extensions: map[string]any{"code": CodeInternal}}
	}
	// Map each response on the way, in the one goroutine the operation holds besides
	// graph-gophers' own; keep draining src after ctx ends so those finish, and close the result
	// only then: a closed result means the operation's goroutines are done (Executor.Execute).
	mapped := make(chan *ws.Response)
	go func() {
		defer close(mapped)
		defer cancel()
		for item := range src {
			res, ok := item.(*gql.Response)
			if !ok {
				continue
			}
			if budget != nil {
				e.h.settle(opCtx, budget)
			}
			select {
			case mapped <- e.audit(ctx, op, start, e.h.finishWS(opCtx, d.doc, req.OperationName, res)):
			case <-ctx.Done():
			}
		}
	}()
	return ws.Chan(mapped), nil
}

// finishWS is finish for a WebSocket response: a response with no data stays without data (a
// rejected operation).
func (h *Handler) finishWS(ctx context.Context, doc *ast.QueryDocument, operationName string, res *gql.Response) *ws.Response {
	out := h.finish(ctx, doc, operationName, res)
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

// isSubscription reports whether the operation of doc that name selects is a subscription.
func isSubscription(doc *ast.QueryDocument, name string) bool {
	op := doc.Operations.ForName(name)
	return op != nil && op.Operation == ast.Subscription
}
