package server

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/gorilla/mux"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/api/auth"
	"carehub/api/graphql"
	"carehub/api/graphql/explorer"
	"carehub/api/idempotency"
	"carehub/api/rest"
	"carehub/api/ws"
	ingestobs "carehub/ingest/observations"
	"carehub/ingest/outbox"
	"carehub/processors/agents"
	"carehub/processors/audit"
	"carehub/processors/deployments"
	"carehub/processors/eventlog"
	"carehub/processors/fanout"
	"carehub/processors/feed"
	idemstore "carehub/processors/idempotency"
	"carehub/processors/marketplace"
	obswriter "carehub/processors/observations"
	"carehub/processors/orgs"
	"carehub/processors/patients"
	"carehub/processors/webhooks"
	"carehub/processors/workflows"
	"carehub/storage"
	"carehub/storage/clickhouse"
	"carehub/storage/kafka"
	"carehub/storage/postgres"
)

// wire builds the HTTP handler and starts the background workers of the configured roles.
// wctx lives until shutdown; ctx only bounds start-up.
func (s *Server) wire(ctx context.Context, wctx context.Context) (http.Handler, error) {
	r := mux.NewRouter()
	obs := observe(s.logger, newHTTPMetrics(s.registry))
	r.Use(obs, rest.StrictInput)
	// mux runs middleware only on matched routes; these get it explicitly so every response
	// carries a Request-Id and the error envelope.
	r.NotFoundHandler = obs(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest.WriteError(w, r, notFound)
	}))
	r.MethodNotAllowedHandler = obs(rest.MethodNotAllowed(r))
	s.health(r)

	keys := auth.NewKeys(s.pool)
	tokens := auth.NewTokens(s.pool)
	clientIP, err := auth.TrustedProxies(s.cfg.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("--trusted-proxies: %w", err)
	}
	authn := auth.NewAuthenticator(keys, tokens, auth.WithClientIP(clientIP))
	if err := s.openLogStores(ctx); err != nil {
		return nil, err
	}
	auditLog := s.auditLog
	// One agents service per node, so runAgent wakes this node's worker.
	agentSvc := agents.New(s.pool, agents.WithLogger(s.logger))
	s.closers = append(s.closers, func(context.Context) error { return agentSvc.Close() })
	var a authRoutes
	if s.has(RoleAPI) || s.has(RoleIngest) {
		// Both HTTP roles authenticate and audit the same way.
		pub, err := audit.NewPublisher(audit.PublisherConfig{Brokers: s.brokers, Logger: s.logger, Registerer: s.registry})
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func(context.Context) error { pub.Close(5 * time.Second); return nil })
		a = authRoutes{authn: authn, auditor: auth.NewAuditor(pub, auth.WithRegisterer(s.registry)),
			handlers: auth.NewHandlers(tokens, auth.NewKeyAdmin(keys, authn), audit.NewService(auditLog))}
	}
	if s.has(RoleAPI) {
		if err := tokens.EnsureSigningKey(ctx); err != nil {
			return nil, fmt.Errorf("jwt signing key: %w", err)
		}
		if err := s.mountAPI(r, a, agentSvc, wctx); err != nil {
			return nil, err
		}
	}
	if s.has(RoleIngest) {
		in, err := ingestobs.New(ingestobs.Config{Brokers: s.brokers, Pool: s.pool,
			MaxLag: s.cfg.IngestMaxLag, Producers: s.cfg.IngestProducers, RequestTimeout: s.cfg.IngestTimeout,
			TransactionalIDPrefix: s.cfg.IngestTransactionalID, Logger: s.logger, Registerer: s.registry})
		if err != nil {
			return nil, fmt.Errorf("observation intake: %w", err)
		}
		s.closers = append(s.closers, func(context.Context) error { in.Close(); return nil })
		s.run("observation-intake", in.Run, wctx)
		ing := r.NewRoute().Subrouter()
		// 16 MiB bodies; intake handles Idempotency-Key itself.
		ing.Use(a.chain(auth.IngestBodyLimit, nil)...)
		rest.ObservationIngestRoutes(ing, in)

		// The outbox relay publishes what services wrote in their transactions; with several
		// nodes each runs one and SKIP LOCKED divides the rows.
		// The relay's own producer may cancel idempotent produces, so its PublishTimeout really
		// bounds a batch while the broker is unreachable (the rows stay unsent and are retried).
		relayClient, err := kafka.NewClient(kafka.ClientConfig{Brokers: s.brokers, ClientID: "carehub-outbox", Registerer: s.registry,
			Logger: s.logger}, kgo.AllowIdempotentProduceCancellation())
		if err != nil {
			return nil, fmt.Errorf("outbox relay: %w", err)
		}
		s.closers = append(s.closers, func(context.Context) error { relayClient.Close(); return nil })
		relay := outbox.New(s.pool, relayClient, outbox.Options{Logger: s.logger.With("component", "outbox"), Registerer: s.registry})
		s.run("outbox-relay", relay.Run, wctx)
	}
	if s.has(RoleProcessors) {
		el, err := eventlog.New(eventlog.Config{Brokers: s.brokers, Topic: kafka.DefaultTopics().Events, Store: s.eventLog,
			Logger: s.logger.With("component", "eventlog"), Registerer: s.registry})
		if err != nil {
			return nil, fmt.Errorf("event log writer: %w", err)
		}
		s.run("eventlog-writer", el.Run, wctx)
		w, err := audit.NewWriter(audit.WriterConfig{Brokers: s.brokers, Store: auditLog, Logger: s.logger, Registerer: s.registry})
		if err != nil {
			return nil, fmt.Errorf("audit writer: %w", err)
		}
		s.run("audit-writer", w.Run, wctx)
		ow, err := obswriter.NewWriter(obswriter.WriterConfig{Brokers: s.brokers, Pool: s.pool,
			Concurrency: s.cfg.ObservationWriterConcurrency, Logger: s.logger, Registerer: s.registry})
		if err != nil {
			return nil, fmt.Errorf("observation writer: %w", err)
		}
		s.run("observation-writer", ow.Run, wctx)
		wfSvc := workflows.New(s.pool)
		runner, err := workflows.NewRunner(workflows.RunnerConfig{Brokers: s.brokers, Service: wfSvc, Agents: agentSvc,
			Logger: s.logger, Registerer: s.registry})
		if err != nil {
			return nil, fmt.Errorf("workflow runner: %w", err)
		}
		s.run("workflow-runner", runner.Run, wctx)
		triggers, err := workflows.NewTriggers(workflows.TriggersConfig{Brokers: s.brokers, Service: wfSvc,
			Logger: s.logger, Registerer: s.registry})
		if err != nil {
			return nil, fmt.Errorf("workflow triggers: %w", err)
		}
		s.run("workflow-triggers", triggers.Run, wctx)
		s.run("agent-worker", agentSvc.Worker(agents.WorkerConfig{Logger: s.logger}).Run, wctx)
		ctrl, err := deployments.New(s.pool).Controller(deployments.ControllerConfig{Logger: s.logger,
			// {base_url} is known once the listener is up.
			BaseURL: func() string {
				if !s.ready.Load() {
					return ""
				}
				return s.URL()
			}})
		if err != nil {
			return nil, err
		}
		s.run("deployment-controller", ctrl.Run, wctx)
		d, err := webhooks.NewDispatcher(webhooks.DispatcherConfig{
			Pool: s.pool, Brokers: s.brokers, Topic: kafka.DefaultTopics().Events,
			Logger: s.logger.With("component", "webhooks"), Registerer: s.registry,
			AllowPrivate: s.cfg.WebhooksAllowPrivate,
		})
		if err != nil {
			return nil, fmt.Errorf("webhook dispatcher: %w", err)
		}
		s.run("webhooks", d.Run, wctx)
	}
	return r, nil
}

// authRoutes is what mountAPI needs of api/auth.
type authRoutes struct {
	authn    *auth.Authenticator
	auditor  *auth.Auditor
	handlers *auth.Handlers
}

// chain is the middleware of every authenticated route, outermost first: the body limit (so
// the auditor's GraphQL peek is bounded), the auditor (outside the authenticator, so refused
// calls of live keys are recorded too), the authenticator (principal, IP allowlist, rate limit).
func (a authRoutes) chain(bodyLimit int64, onError func(http.ResponseWriter, *http.Request, error)) []mux.MiddlewareFunc {
	return []mux.MiddlewareFunc{auth.LimitBody(bodyLimit), a.auditor.Middleware(onError), a.authn.Middleware(onError)}
}

// mountAPI constructs the domain services and mounts GraphQL (POST and WebSocket on /graphql), the
// explorer and the platform REST routes.
func (s *Server) mountAPI(r *mux.Router, a authRoutes, agentSvc *agents.Service, wctx context.Context) error {
	authn := a.authn
	hub, err := fanout.New(fanout.Config{Brokers: s.brokers, Topic: kafka.DefaultTopics().Events, Logger: s.logger, Registerer: s.registry})
	if err != nil {
		return fmt.Errorf("event fan-out: %w", err)
	}
	s.run("fanout", hub.Run, wctx)
	deploySvc := deployments.New(s.pool)
	invoker := deploySvc.Invoker(deployments.InvokerConfig{Logger: s.logger, Registerer: s.registry})
	s.run("deployment-invoker", invoker.Run, wctx)
	var whOpts []webhooks.Option
	if s.cfg.WebhooksAllowPrivate {
		whOpts = append(whOpts, webhooks.AllowPrivate())
	}
	webhookSvc := webhooks.NewService(s.pool, whOpts...)
	svc := graphql.Services{Orgs: orgs.New(s.pool), Marketplace: marketplace.New(s.pool), Deployments: deploySvc,
		Agents: agentSvc, Workflows: workflows.New(s.pool), Patients: patients.New(s.pool),
		Feed: feed.New(s.pool, s.eventLog), Webhooks: webhookSvc,
		Events: graphql.EventSourceFunc(func(ctx context.Context, f graphql.EventFilter) (<-chan storage.Event, func()) {
			// A subscriber the hub drops for falling behind is closed with 4008, as one whose
			// socket stays full is, so that its client resubscribes instead of seeing complete.
			sub := hub.SubscribeFilter(256, fanout.Filter{ProjectID: f.ProjectID, Types: f.Types,
				OnOverflow: func() { ws.CloseSlow(ctx) }})
			return sub.C, sub.Close
		})}
	gh, err := graphql.New(svc, graphql.Options{Logger: s.logger, MaxCost: s.cfg.GraphQLMaxCost})
	if err != nil {
		return err
	}
	wsh := ws.New(gh.Executor(authn, a.auditor), ws.Options{Logger: s.logger, Metrics: s.registry, RecheckInterval: s.cfg.SocketRecheck})
	s.closers = append(s.closers, wsh.Shutdown)

	// Idempotency-Key, inside the authenticator: keys belong to the credential.
	idemKeys := idemstore.NewStore(s.pool, idemstore.WithLogger(s.logger))
	s.run("idempotency-sweeper", idemKeys.Run, wctx)
	idem := idempotency.New(idemKeys, s.logger)

	gql := r.NewRoute().Subrouter()
	gql.Use(a.chain(auth.DefaultBodyLimit, graphql.WriteAuthError)...)
	gql.Use(idem.GraphQL(graphql.WriteAuthError))
	gql.Handle("/graphql", graphql.WithWebSocket(gh, wsh)).Methods(http.MethodGet, http.MethodPost)
	r.Handle("/graphiql", explorer.Handler()).Methods(http.MethodGet)
	r.PathPrefix("/graphiql/").Handler(explorer.Handler()).Methods(http.MethodGet, http.MethodHead)
	authed := r.NewRoute().Subrouter()
	authed.Use(a.chain(auth.DefaultBodyLimit, nil)...)
	authed.Use(idem.REST())
	a.handlers.PublicRoutes(r)
	a.handlers.Routes(authed)
	rest.Mount(r, authed, rest.Services{Orgs: svc.Orgs, Marketplace: svc.Marketplace, Deployments: svc.Deployments,
		Agents: svc.Agents, Workflows: svc.Workflows, Feed: svc.Feed, Webhooks: svc.Webhooks})
	rest.PatientRoutes(authed, svc.Patients)
	rest.InvokeRoutes(authed, invoker)
	rest.WebhookRoutes(authed, webhookSvc)
	return nil
}

// openLogStores picks the event and audit log store: ClickHouse when configured, else Postgres
// tables of the same shape (the embedded default).
func (s *Server) openLogStores(ctx context.Context) error {
	if s.cfg.ClickHouseURL == "" {
		s.eventLog, s.auditLog = postgres.NewEventLog(s.pool), postgres.NewAuditLog(s.pool)
		return nil
	}
	ch, err := clickhouse.Open(ctx, s.cfg.ClickHouseURL)
	if err != nil {
		return fmt.Errorf("clickhouse: %w", err)
	}
	s.closers = append(s.closers, func(context.Context) error { return ch.Close() })
	s.eventLog, s.auditLog = ch, ch
	return nil
}

func (s *Server) has(role string) bool { return slices.Contains(s.cfg.Roles, role) }

// Router returns the node's HTTP router, for listings of the routes it serves (the OpenAPI
// document's test walks it).
func (s *Server) Router() *mux.Router {
	r, _ := s.http.Handler.(*mux.Router)
	return r
}
