package node

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/api/auth"
	"carehub/api/fhir"
	"carehub/api/graphql"
	"carehub/api/server"
	"carehub/ingest/intake"
	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/fhirjson"
	"carehub/processors/agents"
	"carehub/processors/audit"
	"carehub/processors/deployments"
	"carehub/processors/eventlog"
	"carehub/processors/fanout"
	"carehub/processors/feed"
	"carehub/processors/fhirsubs"
	"carehub/processors/marketplace"
	obswriter "carehub/processors/observations"
	"carehub/processors/orgs"
	"carehub/processors/patients"
	"carehub/processors/retention"
	"carehub/processors/webhooks"
	"carehub/processors/workflows"
	"carehub/storage/clickhouse"
	"carehub/storage/demo"
	idemstore "carehub/storage/idempotency"
	"carehub/storage/kafka"
	"carehub/storage/kafka/publish"
	"carehub/storage/outbox"
	"carehub/storage/postgres"
)

// component is one row of the table: a part of a node, the roles that run it, the components it
// needs, and how it starts. Its name is what it provides to the components that need it (the
// field of Node it sets, or the worker or routes it runs). start may add closers (run in
// reverse on shutdown) and workers (s.run, on wctx, which lives until shutdown); ctx only
// bounds start-up.
type component struct {
	name  string
	roles []string // the roles whose nodes start it; none: only when another component needs it
	needs []string
	start func(s *Node, ctx, wctx context.Context) error
}

// components is the only place roles are wired. A node starts the components tagged with its
// roles and, first, everything they need; where the needs leave the order open, this table's
// order decides (routes match in the order they are mounted: api before ingest).
var components = []component{
	// Stores and the router: every node has them (/readyz checks the first two).
	{name: "postgres", roles: AllRoles, start: func(s *Node, ctx, _ context.Context) error { return s.startPostgres(ctx) }},
	{name: "seed", roles: AllRoles, needs: []string{"postgres"}, start: startSeed},
	{name: "kafka", roles: AllRoles, start: func(s *Node, ctx, _ context.Context) error { return s.startKafka(ctx) }},
	{name: "router", roles: AllRoles, needs: []string{"postgres", "kafka"}, start: startRouter},

	// Shared by the roles that need them.
	{name: "log-stores", needs: []string{"postgres"}, start: startLogStores},
	{name: "authenticator", needs: []string{"postgres"}, start: startAuthenticator},
	{name: "agents", needs: []string{"postgres", "deployment-invoker"}, start: startAgents},
	{name: "workflows", needs: []string{"postgres"}, start: func(s *Node, _, _ context.Context) error {
		s.workflows = workflows.New(s.pool, workflows.Config{EventsTopic: s.topics.Events, RunsTopic: s.topics.WorkflowRuns})
		return nil
	}},
	{name: "deployments", needs: []string{"postgres", "sealing-key"}, start: func(s *Node, _, _ context.Context) error {
		// Inference servers on private addresses are as trusted as webhook receivers there.
		s.deployments = deployments.New(s.pool, deployments.Config{EventsTopic: s.topics.Events, Key: s.sealKey, AllowPrivate: s.cfg.WebhooksAllowPrivate})
		return nil
	}},
	// Serves deployments' invocations on this node: the invoke route (api) and LLM agents' runs
	// (agents, wherever they run: api, the agent worker, the workflow runner).
	{name: "deployment-invoker", needs: []string{"deployments"}, start: func(s *Node, _, wctx context.Context) error {
		s.invoker = s.deployments.Invoker(deployments.InvokerConfig{Logger: s.logger, Registerer: s.registry})
		s.run("deployment-invoker", s.invoker.Run, wctx)
		return nil
	}},
	{name: "audit-publisher", needs: []string{"kafka"}, start: startAuditPublisher},
	{name: "edge", needs: []string{"authenticator", "audit-publisher", "log-stores"}, start: startEdge},
	{name: "fhir-subscriptions", needs: []string{"postgres", "sealing-key", "audit-publisher"}, start: startFHIRSubscriptions},
	{name: "sealing-key", start: startSealingKey},
	{name: "webhook-roots", start: startWebhookRoots},
	{name: "webhook-secrets", needs: []string{"postgres", "sealing-key"}, start: startWebhookSecrets},
	// Idempotency-Key claims and answers of every POST, the intake's included, and their sweeper.
	{name: "idempotency-keys", needs: []string{"postgres", "sealing-key"}, start: func(s *Node, _, wctx context.Context) error {
		s.idemKeys = idemstore.NewStore(s.pool, idemstore.Config{Logger: s.logger, Key: s.sealKey})
		s.run("idempotency-sweeper", s.idemKeys.Run, wctx)
		return nil
	}},

	// api: GraphQL, WebSocket subscriptions, REST, and the workers behind them.
	{name: "api", roles: []string{RoleAPI},
		needs: []string{"router", "edge", "agents", "workflows", "deployment-invoker", "log-stores", "sealing-key", "webhook-secrets", "webhook-roots", "idempotency-keys"}, start: startAPI},

	// ingest: what writes into Kafka.
	{name: "observation-intake", roles: []string{RoleIngest}, needs: []string{"router", "edge", "kafka", "idempotency-keys"}, start: startIntake},
	{name: "outbox-relay", roles: []string{RoleIngest}, needs: []string{"postgres", "kafka"}, start: startOutboxRelay},

	// The FHIR base: an api route that takes Observations through intake when the node also
	// runs ingest (listed after it, so that intake has started by then).
	{name: "fhir", roles: []string{RoleAPI}, needs: []string{"router", "edge", "fhir-subscriptions"}, start: func(s *Node, _, _ context.Context) error {
		server.MountFHIR(s.router, s.edge, fhir.Services{Patients: patients.New(s.pool), Intake: s.intake, Subscriptions: s.fhirSubs, Wake: s.fhirWake})
		return nil
	}},

	// processors: the consumer groups and background workers.
	{name: "eventlog-writer", roles: []string{RoleProcessors}, needs: []string{"kafka", "log-stores"}, start: startEventLogWriter},
	{name: "audit-writer", roles: []string{RoleProcessors}, needs: []string{"kafka", "log-stores"}, start: startAuditWriter},
	{name: "fhir-subscription-notifier", roles: []string{RoleProcessors}, needs: []string{"kafka", "fhir-subscriptions"}, start: startFHIRSubscriptionNotifier},
	{name: "fhir-subscription-deliverer", roles: []string{RoleProcessors}, needs: []string{"fhir-subscriptions"}, start: startFHIRSubscriptionDeliverer},
	{name: "observation-writer", roles: []string{RoleProcessors}, needs: []string{"postgres", "kafka"}, start: startObservationWriter},
	{name: "workflow-runner", roles: []string{RoleProcessors}, needs: []string{"kafka", "workflows", "agents"}, start: startWorkflowRunner},
	{name: "workflow-triggers", roles: []string{RoleProcessors}, needs: []string{"kafka", "workflows"}, start: startWorkflowTriggers},
	{name: "agent-worker", roles: []string{RoleProcessors}, needs: []string{"agents"}, start: func(s *Node, _, wctx context.Context) error {
		s.run("agent-worker", s.agents.Worker(agents.WorkerConfig{Logger: s.logger}).Run, wctx)
		return nil
	}},
	{name: "deployment-controller", roles: []string{RoleProcessors}, needs: []string{"deployments"}, start: startDeploymentController},
	// Models scoring the observation stream: deployment.prediction events.
	{name: "deployment-scorer", roles: []string{RoleProcessors}, needs: []string{"kafka", "deployments"}, start: func(s *Node, _, wctx context.Context) error {
		sc, err := s.deployments.Scorer(deployments.ScorerConfig{Brokers: s.brokers, Credentials: s.kafkaCreds,
			Group: s.ns.Name(deployments.DefaultScorerGroup), Logger: s.logger, Registerer: s.registry})
		if err != nil {
			return fmt.Errorf("deployment scorer: %w", err)
		}
		s.run("deployment-scorer", sc.Run, wctx)
		return nil
	}},
	{name: "webhook-dispatcher", roles: []string{RoleProcessors}, needs: []string{"postgres", "kafka", "sealing-key", "webhook-secrets", "webhook-roots"}, start: startWebhookDispatcher},
	// Writes the files of FHIR Bulk Data exports, as the key that asked for each while it is usable.
	{name: "bulk-export", roles: []string{RoleProcessors}, needs: []string{"postgres"}, start: func(s *Node, _, wctx context.Context) error {
		keys := postgres.NewAPIKeys(s.pool)
		runner := patients.New(s.pool).ExportRunner(patients.ExportRunnerConfig{Logger: s.logger.With("component", "bulk-export"),
			Credential: func(ctx context.Context, keyID string) (*access.Principal, error) {
				k, err := keys.Get(ctx, "", keyID)
				if err != nil {
					return nil, err
				}
				if !k.Usable(time.Now()) {
					return nil, fault.Unauthenticated("the key that started the export is " + k.Status)
				}
				return k.Principal(), nil
			}})
		s.run("bulk-export", runner.Run, wctx)
		return nil
	}},
	// Purges each organization's event log and audit log past its retention, in either store.
	{name: "retention", roles: []string{RoleProcessors}, needs: []string{"log-stores"}, start: func(s *Node, _, wctx context.Context) error {
		job, err := retention.NewJob(retention.JobConfig{Pool: s.pool, Events: s.eventLog, Audit: s.auditLog,
			Logger: s.logger.With("component", "retention")})
		if err != nil {
			return err
		}
		s.run("retention", job.Run, wctx)
		return nil
	}},
}

// startOrder returns the components the roles need, each after everything it needs; ties keep
// the table's order. A need that names no component, or a cycle, is an error.
func startOrder(table []component, roles []string) ([]component, error) {
	byName := make(map[string]int, len(table))
	for i, c := range table {
		if _, dup := byName[c.name]; dup {
			return nil, fmt.Errorf("component %q is listed twice", c.name)
		}
		byName[c.name] = i
	}
	const (
		unvisited = iota
		visiting
		done
	)
	state := make([]int, len(table))
	var order []component
	var visit func(i int, path []string) error
	visit = func(i int, path []string) error {
		c := table[i]
		switch state[i] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("components need each other: %s", strings.Join(append(path, c.name), " → "))
		}
		state[i] = visiting
		for _, n := range c.needs {
			j, ok := byName[n]
			if !ok {
				return fmt.Errorf("component %q needs %q, which is not in the table", c.name, n)
			}
			if err := visit(j, append(path, c.name)); err != nil {
				return err
			}
		}
		state[i] = done
		order = append(order, c)
		return nil
	}
	for i, c := range table {
		if slices.ContainsFunc(c.roles, func(r string) bool { return slices.Contains(roles, r) }) {
			if err := visit(i, nil); err != nil {
				return nil, err
			}
		}
	}
	return order, nil
}

func startSeed(s *Node, ctx, _ context.Context) error {
	if s.cfg.Seed != "demo" {
		return nil
	}
	// Seed logs what it seeded.
	if _, err := demo.Seed(ctx, s.pool, s.logger); err != nil {
		return fmt.Errorf("seed demo data: %w", err)
	}
	return nil
}

func startRouter(s *Node, _, _ context.Context) error {
	s.router = server.NewRouter(s.logger, s.registry, s.readiness, s.cfg.accessLog())
	return nil
}

// startLogStores picks the event and audit log store: ClickHouse when configured, else Postgres
// tables of the same shape (the embedded default).
func startLogStores(s *Node, ctx, _ context.Context) error {
	if s.cfg.ClickHouseURL == "" {
		s.eventLog, s.auditLog = postgres.NewEventLog(s.pool), postgres.NewAuditLog(s.pool)
		return nil
	}
	ch, err := clickhouse.Open(ctx, s.cfg.ClickHouseURL,
		clickhouse.Config{EventRetention: s.cfg.ClickHouseEventRetention, AuditRetention: s.cfg.ClickHouseAuditRetention})
	if err != nil {
		return fmt.Errorf("clickhouse: %w", err)
	}
	s.closers = append(s.closers, func(context.Context) error { return ch.Close() })
	s.eventLog, s.auditLog = ch, ch
	return nil
}

// limits are the authenticator's limits the flags set; unset ones take auth.DefaultLimits().
func (c Config) limits() auth.Limits {
	rate := func(perSecond float64) auth.Rate {
		return auth.Rate{PerSecond: perSecond, Burst: int(math.Ceil(2 * perSecond))}
	}
	return auth.Limits{InFlight: c.MaxInFlightPerKey, Default: rate(c.RatePerKey), OrgDefault: rate(c.RatePerOrg),
		Ingest: rate(c.IngestRatePerKey), OrgIngest: rate(c.IngestRatePerOrg)}
}

// startAuthenticator makes the node's authenticator and the listener that drops its cached
// state of a key revoked or rotated anywhere (another node, the CLI). The listener listens
// before start-up ends, so a revocation committed once the node is up is never missed.
func startAuthenticator(s *Node, ctx, wctx context.Context) error {
	s.keys, s.tokens = postgres.NewAPIKeys(s.pool), auth.NewTokens(postgres.NewSigningKeys(s.pool))
	clientIP, err := auth.TrustedProxies(s.cfg.TrustedProxies)
	if err != nil {
		return fmt.Errorf("--trusted-proxies: %w", err)
	}
	s.authn = auth.NewAuthenticator(s.keys, s.tokens, auth.AuthenticatorConfig{ClientIP: clientIP, CacheTTL: s.cfg.KeyCacheTTL,
		Limits: s.cfg.limits()})
	keyChanges, err := postgres.ListenKeyChanges(ctx, s.pool.Config().ConnConfig.Copy(), s.authn, s.logger.With("component", "key-changes"))
	if err != nil {
		return err
	}
	s.run("key-changes", keyChanges.Run, wctx)
	return nil
}

// startAgents makes the node's one agents service, so runAgent wakes this node's worker.
func startAgents(s *Node, _, _ context.Context) error {
	s.agents = agents.New(s.pool, agents.Config{EventsTopic: s.topics.Events, Logger: s.logger, Chat: s.invoker})
	s.closers = append(s.closers, func(context.Context) error { return s.agents.Close() })
	return nil
}

// startEdge builds what both HTTP roles put in front of their routes: authentication and the
// audit hook, whose records go to Kafka.
func startEdge(s *Node, _, _ context.Context) error {
	s.edge = server.Edge{Authn: s.authn, Auditor: auth.NewAuditor(s.auditPub, auth.AuditorConfig{Registerer: s.registry}),
		Handlers: auth.NewHandlers(s.tokens, auth.NewKeyAdmin(s.keys, s.authn), audit.NewService(s.auditLog)).WithOrgs(orgs.New(s.pool))}
	return nil
}

// startAuditPublisher makes the node's producer of audit records: the edge's, and FHIR
// Subscriptions' notifications that carry patient data.
func startAuditPublisher(s *Node, _, _ context.Context) error {
	pub, err := audit.NewPublisher(audit.PublisherConfig{Brokers: s.brokers, Credentials: s.kafkaCreds, Topic: s.topics.Audit, Logger: s.logger, Registerer: s.registry})
	if err != nil {
		return err
	}
	s.closers = append(s.closers, func(context.Context) error { pub.Close(5 * time.Second); return nil })
	s.auditPub = pub
	return nil
}

// startFHIRSubscriptions makes the FHIR Subscriptions service and runs this node's wake-ups
// (the deliverer's and the websocket channel's).
func startFHIRSubscriptions(s *Node, _, wctx context.Context) error {
	s.fhirSubs = fhirsubs.New(s.pool, fhirsubs.Config{Key: s.sealKey, AllowPrivate: s.cfg.WebhooksAllowPrivate,
		Read: func(ctx context.Context, typ, id string) (json.RawMessage, error) {
			doc, err := patients.New(s.pool).ReadResource(ctx, typ, id)
			if err != nil {
				return nil, err
			}
			return fhirjson.Rewrite(doc) // as the FHIR base answers it: FHIR ids and references
		}, Audit: s.auditPub.Publish, Logger: s.logger})
	s.fhirWake = fhirsubs.NewWake(s.pool)
	s.run("fhir-subscription-wake", s.fhirWake.Run, wctx)
	return nil
}

func startFHIRSubscriptionNotifier(s *Node, _, wctx context.Context) error {
	n, err := s.fhirSubs.NewNotifier(fhirsubs.NotifierConfig{Brokers: s.brokers, Credentials: s.kafkaCreds, Topic: s.topics.Events,
		DeadLetterTopic: s.topics.EventsDLQ, Group: s.ns.Name(fhirsubs.DefaultGroup), Logger: s.logger, Registerer: s.registry})
	if err != nil {
		return err
	}
	s.run("fhir-subscription-notifier", n.Run, wctx)
	return nil
}

func startFHIRSubscriptionDeliverer(s *Node, _, wctx context.Context) error {
	d := s.fhirSubs.NewDeliverer(fhirsubs.DelivererConfig{Wake: s.fhirWake, Logger: s.logger, Registerer: s.registry,
		// References in notifications are this node's FHIR base, known once it listens.
		BaseURL: func() string {
			if !s.ready.Load() {
				return ""
			}
			return s.URL() + "/fhir/R4"
		}})
	s.run("fhir-subscription-deliverer", d.Run, wctx)
	return nil
}

// startAPI starts the api role's worker (event fan-out) and mounts its routes.
func startAPI(s *Node, ctx, wctx context.Context) error {
	if err := s.tokens.EnsureSigningKey(ctx); err != nil {
		return fmt.Errorf("jwt signing key: %w", err)
	}
	hub, err := fanout.New(fanout.Config{Brokers: s.brokers, Credentials: s.kafkaCreds, Topic: s.topics.Events, Logger: s.logger, Registerer: s.registry})
	if err != nil {
		return fmt.Errorf("event fan-out: %w", err)
	}
	s.run("fanout", hub.Run, wctx)
	webhookSvc := webhooks.NewService(s.pool, webhooks.ServiceConfig{AllowPrivate: s.cfg.WebhooksAllowPrivate, RootCAs: s.webhookRoots, Key: s.sealKey})
	patientSvc := patients.New(s.pool)
	// Event batches go straight to the events topic, each in a transaction (feed.Config.Direct);
	// single events too, as one record of the node's client (feed.Config.Producer).
	// Ten seconds bounds how long a transaction left open by a killed node holds back the
	// topic's readers on a real broker (the embedded one aborts it when it restarts).
	direct := publish.NewTransactional(publish.TransactionalConfig{Brokers: s.brokers, Credentials: s.kafkaCreds, Size: 8, Prefix: s.cfg.transactionalID("events"),
		ClientID: "carehub-events", TxnTimeout: 10 * time.Second, Logger: s.logger})
	s.closers = append(s.closers, func(context.Context) error { direct.Close(); return nil })
	shutdown, err := server.MountAPI(s.router, s.edge, server.API{
		Services: graphql.Services{Orgs: orgs.New(s.pool), Marketplace: marketplace.New(s.pool, marketplace.Config{EventsTopic: s.topics.Events, AllowPrivate: s.cfg.WebhooksAllowPrivate}), Deployments: s.deployments,
			Agents: s.agents, Workflows: s.workflows, Patients: patientSvc, Feed: feed.New(s.pool, s.eventLog, feed.Config{EventsTopic: s.topics.Events, Direct: direct, Producer: publish.NewAcked(s.kcl), Refusing: s.diskFull}),
			Webhooks: webhookSvc, Events: server.Events(hub)},
		Patients: patientSvc, Webhooks: webhookSvc, Invoker: s.invoker, Idempotency: s.idemKeys, Retention: retention.New(s.pool),
		Logger: s.logger, Registerer: s.registry, GraphQLMaxCost: s.cfg.GraphQLMaxCost, SocketRecheck: s.cfg.SocketRecheck,
		SocketKeepAlive: s.cfg.SocketKeepAlive, SocketWriteTimeout: s.cfg.SocketWriteTimeout, SocketLimits: s.cfg.SocketLimits,
		GraphQLMaxResponseBytes:     s.cfg.GraphQLMaxResponseBytes,
		GraphQLAnswerBytesPerSecond: s.cfg.GraphQLAnswerBytesPerSecond,
		SubscriptionBytesPerSecond:  s.cfg.SubscriptionBytesPerSecond,
	})
	if err != nil {
		return err
	}
	s.closers = append(s.closers, shutdown)
	return nil
}

func startIntake(s *Node, _, wctx context.Context) error {
	in, err := intake.New(intake.Config{Brokers: s.brokers, Credentials: s.kafkaCreds, Topic: s.topics.Observations, WriterGroup: s.ns.Name(obswriter.DefaultGroup), Pool: s.pool, Keys: s.idemKeys,
		LatencyBudget: s.cfg.IngestLatencyBudget, MaxLag: s.cfg.IngestMaxLag, Producers: s.cfg.IngestProducers, RequestTimeout: s.cfg.IngestTimeout,
		TransactionalIDPrefix: s.ns.Name(s.cfg.IngestTransactionalID), Logger: s.logger, Registerer: s.registry, Refusing: s.diskFull})
	if err != nil {
		return fmt.Errorf("observation intake: %w", err)
	}
	s.closers = append(s.closers, func(context.Context) error { in.Close(); return nil })
	s.run("observation-intake", in.Run, wctx)
	s.intake = in
	server.MountIngest(s.router, s.edge, in)
	return nil
}

// startOutboxRelay publishes what services wrote in their transactions; with several nodes each
// runs one and SKIP LOCKED divides the rows. The relay's own producer may cancel idempotent
// produces, so its PublishTimeout really bounds a batch while the broker is unreachable (the rows
// stay unsent and are retried).
func startOutboxRelay(s *Node, _, wctx context.Context) error {
	relayClient, err := kafka.NewClient(kafka.ClientConfig{Brokers: s.brokers, Credentials: s.kafkaCreds, ClientID: "carehub-outbox", Registerer: s.registry,
		Logger: s.logger}, kgo.AllowIdempotentProduceCancellation())
	if err != nil {
		return fmt.Errorf("outbox relay: %w", err)
	}
	s.closers = append(s.closers, func(context.Context) error { relayClient.Close(); return nil })
	relay := outbox.New(s.pool, relayClient, outbox.Config{Logger: s.logger, Registerer: s.registry})
	s.run("outbox-relay", relay.Run, wctx)
	return nil
}

func startEventLogWriter(s *Node, _, wctx context.Context) error {
	el, err := eventlog.New(eventlog.Config{Brokers: s.brokers, Credentials: s.kafkaCreds, Topic: s.topics.Events, DeadLetterTopic: s.topics.EventsDLQ, Group: s.ns.Name(eventlog.DefaultGroup), Store: s.eventLog,
		Logger: s.logger, Registerer: s.registry})
	if err != nil {
		return fmt.Errorf("event log writer: %w", err)
	}
	s.run("eventlog-writer", el.Run, wctx)
	return nil
}

func startAuditWriter(s *Node, _, wctx context.Context) error {
	w, err := audit.NewWriter(audit.WriterConfig{Brokers: s.brokers, Credentials: s.kafkaCreds, Topic: s.topics.Audit, DeadLetterTopic: s.topics.AuditDLQ, Group: s.ns.Name(audit.DefaultGroup), Store: s.auditLog, Logger: s.logger, Registerer: s.registry})
	if err != nil {
		return fmt.Errorf("audit writer: %w", err)
	}
	s.run("audit-writer", w.Run, wctx)
	return nil
}

func startObservationWriter(s *Node, _, wctx context.Context) error {
	ow, err := obswriter.NewWriter(obswriter.WriterConfig{Brokers: s.brokers, Credentials: s.kafkaCreds, Topic: s.topics.Observations, EventsTopic: s.topics.Events,
		Group: s.ns.Name(obswriter.DefaultGroup), Pool: s.pool, DeadLetterTopic: s.topics.ObservationsDLQ,
		TransactionalID: s.cfg.transactionalID("observation-writer"), Concurrency: s.cfg.ObservationWriterConcurrency,
		Logger: s.logger, Registerer: s.registry})
	if err != nil {
		return fmt.Errorf("observation writer: %w", err)
	}
	s.run("observation-writer", ow.Run, wctx)
	return nil
}

func startWorkflowRunner(s *Node, _, wctx context.Context) error {
	runner, err := workflows.NewRunner(workflows.RunnerConfig{Brokers: s.brokers, Credentials: s.kafkaCreds, Group: s.ns.Name(workflows.DefaultRunnerGroup), Service: s.workflows, Agents: s.agents,
		Logger: s.logger, Registerer: s.registry})
	if err != nil {
		return fmt.Errorf("workflow runner: %w", err)
	}
	s.run("workflow-runner", runner.Run, wctx)
	return nil
}

func startWorkflowTriggers(s *Node, _, wctx context.Context) error {
	triggers, err := workflows.NewTriggers(workflows.TriggersConfig{Brokers: s.brokers, Credentials: s.kafkaCreds, DeadLetterTopic: s.topics.EventsDLQ, Group: s.ns.Name(workflows.DefaultTriggersGroup), Service: s.workflows,
		Logger: s.logger, Registerer: s.registry})
	if err != nil {
		return fmt.Errorf("workflow triggers: %w", err)
	}
	s.run("workflow-triggers", triggers.Run, wctx)
	return nil
}

func startDeploymentController(s *Node, _, wctx context.Context) error {
	ctrl, err := s.deployments.Controller(deployments.ControllerConfig{Logger: s.logger,
		// {base_url} is known once the listener is up.
		BaseURL: func() string {
			if !s.ready.Load() {
				return ""
			}
			return s.URL()
		}})
	if err != nil {
		return err
	}
	s.run("deployment-controller", ctrl.Run, wctx)
	return nil
}

func startWebhookDispatcher(s *Node, _, wctx context.Context) error {
	d, err := webhooks.NewDispatcher(webhooks.DispatcherConfig{
		Pool: s.pool, Brokers: s.brokers, Credentials: s.kafkaCreds, Topic: s.topics.Events, Group: s.ns.Name(webhooks.DefaultGroup),
		Logger: s.logger.With("component", "webhooks"), Registerer: s.registry, Key: s.sealKey, DeadLetterTopic: s.topics.EventsDLQ,
		AllowPrivate: s.cfg.WebhooksAllowPrivate, RootCAs: s.webhookRoots,
	})
	if err != nil {
		return fmt.Errorf("webhook dispatcher: %w", err)
	}
	s.run("webhooks", d.Run, wctx)
	return nil
}
