package server

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"

	"carehub/api/auth"
	"carehub/api/fhir"
	"carehub/api/graphql"
	"carehub/api/graphql/explorer"
	"carehub/api/idempotency"
	"carehub/api/rest"
	"carehub/api/ws"
	"carehub/ingest/intake"
	"carehub/kernel/events"
	"carehub/processors/fanout"
	"carehub/processors/marketplace"
	"carehub/processors/patients"
	"carehub/processors/retention"
	"carehub/processors/webhooks"
	idemstore "carehub/storage/idempotency"
)

// Edge is what every authenticated route of both HTTP roles (api, ingest) runs through: they
// authenticate and audit the same way.
type Edge struct {
	Authn    *auth.Authenticator
	Auditor  *auth.Auditor
	Handlers *auth.Handlers // token exchange, key administration, audit log reads
}

// chain is the middleware of every authenticated route, outermost first: the body limit (so
// the auditor's GraphQL peek is bounded), the auditor (outside the authenticator, so refused
// calls of live keys are recorded too), the authenticator (principal, IP allowlist, rate limit).
func (e Edge) chain(bodyLimit int64, onError func(http.ResponseWriter, *http.Request, error)) []mux.MiddlewareFunc {
	return []mux.MiddlewareFunc{auth.LimitBodyWith(bodyLimit, onError), e.Auditor.Middleware(onError), e.Authn.Middleware(onError)}
}

// API is what the api role serves: the domain services (constructed, and their workers started,
// by the node) and the transport's own settings.
type API struct {
	Services    graphql.Services
	Patients    *patients.Service
	Webhooks    *webhooks.Service
	Invoker     rest.Invoker
	Idempotency *idemstore.Store
	Retention   *retention.Service

	Logger             *slog.Logger
	Registerer         prometheus.Registerer
	GraphQLMaxCost     int64         // 0: graphql.DefaultMaxCost
	SocketRecheck      time.Duration // 0: ws.DefaultRecheckInterval
	SocketKeepAlive    time.Duration // 0: ws.DefaultKeepAlive
	SocketWriteTimeout time.Duration // 0: ws.DefaultWriteTimeout
	SocketLimits       ws.Limits     // sockets and operations per key and per node (0 fields: the ws defaults)

	// GraphQLMaxResponseBytes bounds one GraphQL answer in bytes (0: graphql.DefaultMaxResponseBytes).
	GraphQLMaxResponseBytes int64
	// GraphQLAnswerBytesPerSecond and SubscriptionBytesPerSecond are graphql.Config's
	// AnswerBytesPerSecond and FanOutBytesPerSecond.
	GraphQLAnswerBytesPerSecond, SubscriptionBytesPerSecond int64
}

// MountAPI mounts GraphQL (POST and WebSocket on /graphql), the explorer and the platform REST
// routes on r. The returned shutdown closes the open WebSockets; the caller runs it on shutdown.
func MountAPI(r *mux.Router, e Edge, a API) (shutdown func(context.Context) error, err error) {
	gh, err := graphql.New(a.Services, graphql.Config{Logger: a.Logger, MaxCost: a.GraphQLMaxCost,
		MaxResponseBytes: a.GraphQLMaxResponseBytes, AnswerBytesPerSecond: a.GraphQLAnswerBytesPerSecond,
		FanOutBytesPerSecond: a.SubscriptionBytesPerSecond, Metrics: a.Registerer})
	if err != nil {
		return nil, err
	}
	wsh, err := ws.New(gh.Executor(e.Authn, e.Auditor), ws.Config{Logger: a.Logger, Metrics: a.Registerer, RecheckInterval: a.SocketRecheck,
		KeepAlive: a.SocketKeepAlive, WriteTimeout: a.SocketWriteTimeout, Limits: a.SocketLimits})
	if err != nil {
		return nil, err
	}

	// Idempotency-Key, inside the authenticator: keys belong to the credential.
	idem := idempotency.New(a.Idempotency, a.Logger)

	gql := r.NewRoute().Subrouter()
	gql.Use(e.chain(auth.DefaultBodyLimit, graphql.WriteAuthError)...)
	gql.Use(idem.GraphQL(graphql.WriteAuthError))
	gql.Handle("/graphql", graphql.WithWebSocket(gh, wsh)).Methods(http.MethodGet, http.MethodPost)
	r.Handle("/graphiql", explorer.Handler()).Methods(http.MethodGet)
	r.PathPrefix("/graphiql/").Handler(explorer.Handler()).Methods(http.MethodGet, http.MethodHead)
	authed := r.NewRoute().Subrouter()
	authed.Use(e.chain(auth.DefaultBodyLimit, nil)...)
	authed.Use(idem.REST())
	e.Handlers.PublicRoutes(r)
	e.Handlers.Routes(authed)
	svc := a.Services
	rest.Mount(r, authed, rest.Services{Orgs: svc.Orgs, Marketplace: svc.Marketplace, Deployments: svc.Deployments,
		Agents: svc.Agents, Workflows: svc.Workflows, Feed: svc.Feed, Webhooks: svc.Webhooks})
	rest.PatientRoutes(authed, a.Patients)
	rest.InvokeRoutes(authed, a.Invoker)
	rest.WebhookRoutes(authed, a.Webhooks)
	rest.RetentionRoutes(authed, a.Retention)
	// Model files take a body limit of their own.
	models := r.NewRoute().Subrouter()
	models.Use(e.chain(marketplace.MaxModelBytes, nil)...)
	models.Use(idem.REST())
	rest.ModelRoutes(models, svc.Marketplace)
	return wsh.Shutdown, nil
}

// MountIngest mounts observation intake on r: 16 MiB bodies; intake handles Idempotency-Key
// itself.
func MountIngest(r *mux.Router, e Edge, in *intake.Intake) {
	ing := r.NewRoute().Subrouter()
	ing.Use(e.chain(auth.IngestBodyLimit, nil)...)
	rest.ObservationIngestRoutes(ing, in)
}

// MountFHIR mounts the FHIR R4 base (/fhir/R4, package fhir) on r: the CapabilityStatement
// without a credential, the rest behind the same edge as every route, with errors as
// OperationOutcomes and the ingest body limit (transaction Bundles of observations). in is nil on
// a node without the ingest role.
func MountFHIR(r *mux.Router, e Edge, s fhir.Services) {
	authed := r.NewRoute().Subrouter()
	authed.Use(e.chain(auth.IngestBodyLimit, fhir.WriteError)...)
	fhir.Mount(r, authed, s)
}

// Events is the GraphQL event source of a node's fan-out hub. Each subscription buffers up to
// fanout.DefaultBuffer events (or fanout.MaxQueueBytes), allocated only while it is behind, so
// that it absorbs the scorer's bursts of 2,000 predictions. A subscriber the hub drops for
// falling behind further is closed with 4008, as one whose socket stays full is, so that its
// client resubscribes instead of seeing complete.
func Events(hub *fanout.Hub) graphql.EventSource {
	return graphql.EventSourceFunc(func(ctx context.Context, f graphql.EventFilter) (<-chan events.Event, func()) {
		sub := hub.SubscribeFilter(fanout.DefaultBuffer, fanout.Filter{ProjectID: f.ProjectID, Types: f.Types,
			OnOverflow: func() { ws.CloseSlow(ctx) }})
		return sub.C, sub.Close
	})
}
