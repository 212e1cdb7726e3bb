// Package graphql serves carehub's GraphQL API (schemas/graphql/schema.graphql, schema version
// 2.0) with graph-gophers/graphql-go: POST /graphql for queries and mutations, and an Executor for
// api/ws, which serves the same schema (subscriptions included) over WebSocket.
//
// Resolvers convert arguments and results only; the domain services under processors/ check
// scopes and tenancy, so every field is protected whichever transport reaches it. Nested fields
// resolve through per-request batched loaders (loader.go, loaders.go): a nested selection costs
// one statement per level whatever the length of the lists above it.
//
// A request's document is parsed once, by gqlparser (gqldoc.Parse, in precheck): the text check,
// the cost and depth limits, the locations of execution errors and the audit log's operation name
// (auth.SetGraphQLOperation) all read that one AST. graph-gophers parses the document again to
// validate and run it, inside its own API.
//
// Errors (errors.go) carry extensions.code, mapped from the services' fault kinds in one place.
// Limits: queries of at most 32 KiB (rejected before parsing), depth at most 12 (depth.go), a
// cost of at most 100 000 estimated values (cost.go), no NUL or invalid UTF-8 in any argument or
// variable (strict.go), limit 1..100 and offset ≥ 0 on list fields (args.go), an answer of at
// most 16 MiB (answer.go).
package graphql

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	gql "github.com/graph-gophers/graphql-go"
	gqlerrors "github.com/graph-gophers/graphql-go/errors"
	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vektah/gqlparser/v2/ast"

	"carehub/api/auth"
	"carehub/api/envelope"
	"carehub/api/graphql/gqldoc"
	"carehub/kernel/config"
	"carehub/processors/agents"
	"carehub/processors/deployments"
	"carehub/processors/feed"
	"carehub/processors/marketplace"
	"carehub/processors/orgs"
	"carehub/processors/patients"
	"carehub/processors/webhooks"
	"carehub/processors/workflows"
	"carehub/schemas"
)

// WebhookService is what the schema needs of the webhook service (*webhooks.Service).
type WebhookService interface {
	Create(ctx context.Context, projectID, url string, events []string, opts webhooks.Options) (*webhooks.Subscription, error)
	List(ctx context.Context, projectID string) ([]webhooks.Subscription, error)
	Update(ctx context.Context, id string, u webhooks.Update) (*webhooks.Subscription, error)
	RotateSecret(ctx context.Context, id string) (*webhooks.Subscription, error)
	Delete(ctx context.Context, id string) error
	Deliveries(ctx context.Context, webhookID, status string, limit, offset int) ([]webhooks.Delivery, error)
	Attempts(ctx context.Context, deliveryIDs []string) (map[string][]webhooks.Attempt, error)
	Redeliver(ctx context.Context, deliveryID string) (*webhooks.Delivery, error)
	Recover(ctx context.Context, webhookID string, since time.Time, all bool) (int, error)
	ByIDs(ctx context.Context, ids []string) (map[string]*webhooks.Subscription, error)
}

// Services are the domain services the resolvers call. Events may be nil on a node without the
// fan-out; subscriptions then fail with an INTERNAL error that says so.
type Services struct {
	Orgs        *orgs.Service
	Marketplace *marketplace.Service
	Deployments *deployments.Service
	Agents      *agents.Service
	Workflows   *workflows.Service
	Patients    *patients.Service
	Feed        *feed.Service
	Webhooks    WebhookService
	Events      EventSource
}

// Config configures a Handler. Zero fields take their defaults.
type Config struct {
	Logger *slog.Logger
	// MaxQueryBytes bounds the query document (default 32 KiB); a longer one is rejected before
	// it is parsed.
	MaxQueryBytes int
	// MaxParallelism bounds the resolvers of one request running at once (default 16).
	MaxParallelism int
	// MaxCost is the budget of one operation's estimated cost (default DefaultMaxCost; see
	// cost.go); a costlier one is refused before it runs.
	MaxCost int64
	// MaxResponseBytes bounds the answer of one query or mutation in bytes (default
	// DefaultMaxResponseBytes; see answer.go); a larger one is answered RESPONSE_TOO_LARGE.
	MaxResponseBytes int64
	// AnswerBytesPerSecond bounds the large values (answer.go) one API key's queries and
	// mutations fetch a second (default DefaultAnswerBytesPerSecond, negative: no bound);
	// past it an operation is answered RATE_LIMITED. See byterate.go.
	AnswerBytesPerSecond int64
	// FanOutBytesPerSecond bounds the bytes of events one organization's subscriptions are
	// sent a second on this node (default DefaultFanOutBytesPerSecond, negative: no bound).
	FanOutBytesPerSecond int64
	// Metrics registers the subscriptions' gauges (multiplex.go) when set.
	Metrics prometheus.Registerer
}

func (c *Config) defaults() {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	config.Default(&c.MaxQueryBytes, DefaultMaxQueryBytes)
	config.Default(&c.MaxParallelism, 16)
	config.Default(&c.MaxCost, DefaultMaxCost)
	config.Default(&c.MaxResponseBytes, DefaultMaxResponseBytes)
	if c.AnswerBytesPerSecond == 0 { // negative: no bound
		c.AnswerBytesPerSecond = DefaultAnswerBytesPerSecond
	}
	if c.FanOutBytesPerSecond == 0 {
		c.FanOutBytesPerSecond = DefaultFanOutBytesPerSecond
	}
}

// DefaultMaxQueryBytes is the query length limit of DECISIONS §3.
const DefaultMaxQueryBytes = 32 << 10

// Handler serves GraphQL over HTTP. It is safe for concurrent use.
type Handler struct {
	s             *Services
	schema        *gql.Schema // data operations: depth ≤ MaxDepth
	introspection *gql.Schema // introspection-only operations: depth ≤ IntrospectionMaxDepth
	logger        *slog.Logger
	maxQuery      int
	cost          *costModel
	maxCost       int64
	maxResponse   int64        // answer-size budget in bytes (answer.go)
	answerRate    *byteRate    // large values a key's operations fetch a second; nil: no bound
	subs          *multiplexer // subscriptions sharing an execution (multiplex.go)
	fanOut        *byteRate    // what one organization's subscriptions are sent a second
	// docs keeps what precheck and schemaFor learn of a document that passed them, by its text:
	// a client sends the same few documents again and again, with other variables, and reading
	// one took more CPU than graph-gophers' own parse and validation. Only documents of at most
	// maxCachedDoc bytes are kept, so that what it holds stays small whatever clients send.
	docs *lru.Cache[string, readDoc]
}

// readDoc is what precheck learnt of a document: when it parsed, its AST, the schema it runs on
// and (when cached) its operations' names in the audit log.
type readDoc struct {
	doc        *ast.QueryDocument // nil: not parsed; read only: shared by the requests that send this text
	schema     *gql.Schema        // the schema it runs on (schemaFor)
	names      map[string]string  // by operationName, gqldoc.OperationName's; nil: not computed
	unreadable bool               // gqlparser could not parse it
}

// operation names the operation that operationName selects for the audit log
// (gqldoc.OperationName): gqldoc.Unparsed for a document that did not parse, "" for one precheck
// refused before parsing it (too long, empty, bad variables).
func (d readDoc) operation(operationName string) string {
	switch {
	case d.unreadable:
		return gqldoc.Unparsed
	case d.doc == nil:
		return ""
	}
	if name, ok := d.names[operationName]; ok {
		return name
	}
	return gqldoc.OperationName(d.doc, operationName)
}

// operationNames names each operation of doc, by the operationName that selects it ("" too).
func operationNames(doc *ast.QueryDocument) map[string]string {
	names := map[string]string{"": gqldoc.OperationName(doc, "")}
	for _, op := range doc.Operations {
		if _, ok := names[op.Name]; !ok {
			names[op.Name] = gqldoc.OperationName(doc, op.Name)
		}
	}
	return names
}

// docCacheSize and maxCachedDoc bound Handler.docs.
const (
	docCacheSize = 512
	maxCachedDoc = 4 << 10
)

// New binds the schema (schemas.GraphQL) to the services. It fails when a resolver does not
// match the schema.
func New(s Services, cfg Config) (*Handler, error) {
	cfg.defaults()
	cost, err := newCostModel()
	if err != nil {
		return nil, err
	}
	docs, err := lru.New[string, readDoc](docCacheSize)
	if err != nil {
		return nil, err
	}
	h := &Handler{s: &s, logger: cfg.Logger, maxQuery: cfg.MaxQueryBytes, cost: cost, maxCost: cfg.MaxCost,
		maxResponse: cfg.MaxResponseBytes, answerRate: newByteRate(cfg.AnswerBytesPerSecond), subs: newMultiplexer(cfg.Metrics), docs: docs}
	h.fanOut = newByteRate(cfg.FanOutBytesPerSecond)
	rt := &root{s: h.s}
	opts := func(depth int) []gql.SchemaOpt {
		return []gql.SchemaOpt{
			gql.UseStringDescriptions(),
			gql.MaxDepth(depth),
			gql.MaxQueryLength(cfg.MaxQueryBytes),
			gql.MaxParallelism(cfg.MaxParallelism),
			gql.PanicHandler(panicHandler{}),
			gql.Logger(slogPanicLogger{cfg.Logger}),
		}
	}
	if h.schema, err = gql.ParseSchema(schemas.GraphQL, rt, opts(MaxDepth)...); err != nil {
		return nil, fmt.Errorf("graphql schema: %w", err)
	}
	if h.introspection, err = gql.ParseSchema(schemas.GraphQL, rt, opts(IntrospectionMaxDepth)...); err != nil {
		return nil, fmt.Errorf("graphql schema: %w", err)
	}
	return h, nil
}

// Request is a GraphQL request body.
type Request struct {
	Query         string         `json:"query"`
	OperationName string         `json:"operationName"`
	Variables     map[string]any `json:"variables"`
}

// Response is a GraphQL response body. Data is present (possibly null) when the operation was
// executed and absent when it was rejected before (syntax, validation, limits).
type Response struct {
	Errors     []*gqlerrors.QueryError `json:"errors,omitempty"`
	Data       json.RawMessage         `json:"data,omitempty"`
	Extensions map[string]any          `json:"extensions,omitempty"`
}

// ServeHTTP serves POST /graphql: a JSON body {query, variables, operationName}. Every operation
// is answered with HTTP 200, errors included (the spec's rule); the caller's principal must
// already be in the request context (the authentication middleware).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		h.write(w, http.StatusMethodNotAllowed, &Response{Errors: []*gqlerrors.QueryError{
			queryError(CodeBadUserInput, "use POST with a JSON body {query, variables, operationName}; subscriptions use a WebSocket on this path")}})
		return
	}
	body, err := io.ReadAll(r.Body)
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		envelope.WriteError(w, r, err) // 413 PAYLOAD_TOO_LARGE: the body limit is the middleware's
		return
	}
	if err != nil {
		h.write(w, http.StatusOK, &Response{Errors: []*gqlerrors.QueryError{queryError(CodeBadUserInput, "cannot read the request body")}})
		return
	}
	var req Request
	if err := json.Unmarshal(body, &req); err != nil {
		h.write(w, http.StatusOK, &Response{Errors: []*gqlerrors.QueryError{
			queryError(CodeBadUserInput, "the body must be a JSON object {query, variables, operationName}: %v", err)}})
		return
	}
	h.write(w, http.StatusOK, h.Execute(r.Context(), req))
}

// Execute runs one query or mutation under ctx (which carries the caller's principal) with fresh
// loaders, and returns the response with its errors mapped. The audit record of the call (when
// ctx is a request's under auth.Auditor's middleware) is given the operation's name from the
// document precheck parsed.
func (h *Handler) Execute(ctx context.Context, req Request) *Response {
	d, errs := h.precheck(req)
	if op := d.operation(req.OperationName); op != "" {
		auth.SetGraphQLOperation(ctx, op)
	}
	if errs != nil {
		return &Response{Errors: errs}
	}
	ctx = withLoaders(ctx, newLoaders(h.s))
	ctx, budget, cancel, refused := h.answerBudget(ctx)
	if refused != nil {
		return refused
	}
	defer cancel()
	res := d.schema.Exec(ctx, req.Query, req.OperationName, req.Variables)
	h.settle(ctx, budget)
	return h.finish(ctx, d.doc, req.OperationName, res)
}

// precheck rejects, before anything runs, what is too long, empty, holds bad text or costs more
// than the budget. A document it cannot read is left to graph-gophers' validation to explain;
// should graph-gophers accept what was not costed, it is refused all the same. This is where a
// request's document is parsed (gqldoc.Parse): the readDoc returned holds the AST whenever it
// parsed, refused or not.
func (h *Handler) precheck(req Request) (readDoc, []*gqlerrors.QueryError) {
	if len(req.Query) > h.maxQuery {
		return readDoc{}, []*gqlerrors.QueryError{queryError(CodeBadUserInput, "the query is %d bytes long; at most %d are allowed", len(req.Query), h.maxQuery)}
	}
	if strings.TrimSpace(req.Query) == "" {
		return readDoc{}, []*gqlerrors.QueryError{queryError(CodeBadUserInput, "no query: send {\"query\": \"...\"}")}
	}
	if e := checkVariables(req.Variables); e != nil {
		return readDoc{}, []*gqlerrors.QueryError{e}
	}
	d, ok := h.docs.Get(req.Query)
	if !ok {
		doc, perr := gqldoc.Parse(req.Query)
		if perr != nil {
			// Without an AST, graph-gophers validates it with the data operations' limits.
			return readDoc{unreadable: true}, h.unreadable(h.schema, req.Query, perr)
		}
		d = readDoc{doc: doc, schema: h.schemaFor(doc)}
		if e := checkLiterals(doc); e != nil {
			return d, []*gqlerrors.QueryError{e}
		}
		if len(req.Query) <= maxCachedDoc {
			d.names = operationNames(doc)
			h.docs.Add(req.Query, d)
		}
	}
	cost, err := h.cost.cost(d.doc, req.OperationName, req.Variables)
	if err != nil {
		return d, h.unreadable(d.schema, req.Query, err)
	}
	if cost > h.maxCost {
		if errs := h.invalid(d.schema, req.Query); errs != nil {
			return d, errs // an invalid document is reported as such, whatever it would cost
		}
		e := queryError(CodeBadUserInput, "the query's estimated cost is %d, over the budget of %d: lower the limit arguments, select fewer nested lists or fields, or split it into several requests", cost, h.maxCost)
		e.Extensions["cost"], e.Extensions["maxCost"] = cost, h.maxCost
		return d, []*gqlerrors.QueryError{e}
	}
	return d, nil
}

// unreadable answers a document precheck could not read: graph-gophers' validation errors
// (against schema), or err when graph-gophers finds nothing wrong.
func (h *Handler) unreadable(schema *gql.Schema, query string, err error) []*gqlerrors.QueryError {
	if errs := h.invalid(schema, query); errs != nil {
		return errs
	}
	return []*gqlerrors.QueryError{queryError(CodeBadUserInput, "%v", err)}
}

// invalid returns graph-gophers' validation errors of a document against schema
// (BAD_USER_INPUT), nil when it finds none.
func (h *Handler) invalid(schema *gql.Schema, query string) []*gqlerrors.QueryError {
	errs := schema.Validate(query)
	for _, e := range errs {
		e.Extensions = map[string]any{"code": CodeBadUserInput}
	}
	return errs
}

// schemaFor returns the schema a parsed document runs on: the introspection schema, with its
// deeper limit, for an introspection-only document (depth.go).
func (h *Handler) schemaFor(doc *ast.QueryDocument) *gql.Schema {
	if introspectionOnly(doc) {
		return h.introspection
	}
	return h.schema
}

// finish fills the locations graph-gophers leaves out (from doc, the document precheck parsed),
// maps the errors and applies the data-null rule to one graph-gophers response to the operation
// operationName selects; an answer over the answer-size budget (charged by the resolvers, or as
// serialized) is replaced by RESPONSE_TOO_LARGE alone.
func (h *Handler) finish(ctx context.Context, doc *ast.QueryDocument, operationName string, res *gql.Response) *Response {
	if budgetOf(ctx).exceeded() || int64(len(res.Data)) > h.maxResponse {
		return tooLarge(h.maxResponse)
	}
	addLocations(doc, operationName, res.Errors)
	mapErrors(ctx, h.logger, res.Errors)
	out := &Response{Errors: res.Errors, Data: res.Data, Extensions: res.Extensions}
	if out.Data != nil {
		out.Data = nullDataWhenAllFailed(out.Data, out.Errors)
	}
	return out
}

func (h *Handler) write(w http.ResponseWriter, status int, res *Response) {
	b, err := json.Marshal(res)
	if err != nil {
		h.logger.Error("encode graphql response", "err", err)
		b = []byte(`{"errors":[{"message":"internal error","extensions":{"code":"INTERNAL"}}]}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

// WriteAuthError answers a /graphql request the authentication middleware refused (its onError):
// the REST status (401, 403, 429, 503) with a body carrying both the REST error object and a
// GraphQL errors array, so REST and GraphQL clients alike understand it (DECISIONS §3).
func WriteAuthError(w http.ResponseWriter, r *http.Request, err error) {
	status, obj := envelope.NewErrorObject(r, err)
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="carehub"`)
	}
	ext := map[string]any{"code": Code(err)}
	for k, v := range obj.Details {
		ext[k] = v
	}
	envelope.WriteJSON(w, status, struct {
		Error  envelope.ErrorObject    `json:"error"`
		Errors []*gqlerrors.QueryError `json:"errors"`
	}{obj, []*gqlerrors.QueryError{{Message: obj.Message, Extensions: ext}}})
}
