package loadtest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kadm"

	"carehub/api/auth"
	"carehub/api/rest"
	"carehub/cmd/carehub/node"
	"carehub/ingest/intake"
	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/processors/eventlog"
	obs "carehub/processors/observations"
	"carehub/processors/patients"
	"carehub/storage"
	"carehub/storage/clickhouse"
	"carehub/storage/demo"
	"carehub/storage/kafka"
	"carehub/storage/outbox"
	"carehub/storage/postgres"
)

// Stack is an in-process carehub observation pipeline for -self runs: the embedded broker
// (kfake, persisted under the data dir, as `carehub serve` runs it), a local Postgres cluster
// with the demo data, intake and the patient routes behind the real authenticator, the
// observation writer and the outbox relay (and the event log writer, with
// StackOptions.EventLog), and /metrics, on a loopback port. It is the observation path of a
// `carehub serve` node with every role, without the rest of the API, and with a node's Go
// runtime settings (node.TuneRuntime).
type Stack struct {
	URL         string
	Brokers     []string
	Credentials kafka.Credentials // what a client of Brokers authenticates with
	Key         string            // a test-mode demo-health key: write:observations, read:patients
	Pool        *pgxpool.Pool     // the stack's database, for the raw COPY baseline
	// EventLog is the kind of store the event log writer runs on ("postgres", "clickhouse"),
	// or empty when it does not run: a name for reports, never a URL with its credentials.
	EventLog string

	local   *postgres.Local // for CPU
	closers []func()
}

// StackOptions adjusts a Stack.
type StackOptions struct {
	// MaxLag is intake's backpressure bound (ingest/intake.Config.MaxLag): 0 for the
	// default, -1 to measure intake without it.
	MaxLag int64
	// LatencyBudget is intake's accept → stored budget (Config.LatencyBudget): 0 for the
	// default, negative to measure without it.
	LatencyBudget time.Duration
	// EventLog also runs the event log writer, as every node does, so each observation's
	// device.observation_received event is stored in the log too: "postgres" for the embedded
	// default's event_log table (a second row in Postgres for each observation), or a
	// clickhouse:// URL (CAREHUB_CLICKHOUSE_URL's form). Empty: the log writer does not run.
	EventLog string
	// WriterMembers is how many members of its group the observation writer runs
	// (processors/observations.WriterConfig.Members): 0 for the default.
	WriterMembers int
	// WriterConcurrency is how many chunks of a poll each member stores at once
	// (WriterConfig.Concurrency): 0 for the default.
	WriterConcurrency int
}

// StartStack starts a Stack under dataDir. Close stops it.
func StartStack(ctx context.Context, dataDir string, logger *slog.Logger, opts StackOptions) (_ *Stack, err error) {
	node.TuneRuntime(logger)
	s := &Stack{}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	local, err := postgres.StartLocal(ctx, filepath.Join(dataDir, "postgres"), postgres.LocalConfig{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	s.closers = append(s.closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = local.Stop(sctx)
	})
	s.local = local
	if err := local.EnsureDatabase(ctx, "carehub"); err != nil {
		return nil, err
	}
	pool, err := postgres.Connect(ctx, local.DSN("carehub")+" pool_max_conns=24")
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, pool.Close)
	s.Pool = pool
	if _, err := postgres.Migrate(ctx, pool, logger); err != nil {
		return nil, err
	}
	if _, err := demo.Seed(ctx, pool, logger); err != nil {
		return nil, err
	}

	broker, err := kafka.StartEmbedded(ctx, filepath.Join(dataDir, "kafka"), kafka.EmbeddedConfig{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	s.closers = append(s.closers, func() { _ = broker.Close() })
	s.Brokers, s.Credentials = broker.Addrs(), broker.Credentials()
	reg := prometheus.NewRegistry()
	producer, err := kafka.NewClient(kafka.ClientConfig{Brokers: s.Brokers, Credentials: s.Credentials, ClientID: "carehub", Registerer: reg, Logger: logger})
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, producer.Close)
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := kafka.EnsureTopics(tctx, producer, kafka.Layout{Partitions: 6}, kafka.DefaultTopics().All()...); err != nil {
		return nil, err
	}

	in, err := intake.New(intake.Config{Brokers: s.Brokers, Credentials: s.Credentials, Pool: pool, Producers: 32, MaxLag: opts.MaxLag, LatencyBudget: opts.LatencyBudget, Logger: logger, Registerer: reg})
	if err != nil {
		return nil, err
	}
	writer, err := obs.NewWriter(obs.WriterConfig{Brokers: s.Brokers, Credentials: s.Credentials, Pool: pool, Members: opts.WriterMembers, Concurrency: opts.WriterConcurrency, Logger: logger,
		Registerer: reg})
	if err != nil {
		in.Close()
		return nil, err
	}
	relay := outbox.New(pool, producer, outbox.Config{Logger: logger, Registerer: reg})
	runs := []func(context.Context) error{in.Run, writer.Run, relay.Run}
	if opts.EventLog != "" {
		el, err := s.eventLogWriter(ctx, opts.EventLog, pool, logger, reg)
		if err != nil {
			in.Close()
			writer.Close()
			return nil, err
		}
		runs = append(runs, el.Run)
	}
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{}, len(runs))
	for _, run := range runs {
		go func() { _ = run(wctx); done <- struct{}{} }()
	}
	s.closers = append(s.closers, func() {
		stop()
		for range runs {
			<-done
		}
		in.Close()
	})
	// Load starts once the writer holds every partition: joining the group takes seconds, and
	// what is accepted meanwhile waits for it, a start-up cost, not the path's latency.
	if err := writerAssigned(ctx, kadm.NewClient(producer), cmp.Or(opts.WriterMembers, obs.DefaultMembers)); err != nil {
		return nil, err
	}

	keys := postgres.NewAPIKeys(pool)
	key, err := keys.Create(ctx, apikeys.NewKey{OrgID: demo.DemoOrgID, Mode: access.Test, Name: "loadtest",
		Scopes: []string{access.WriteObservations, access.ReadPatients}})
	if err != nil {
		return nil, err
	}
	s.Key = key.Secret
	// Rate limits are the deployment's choice; the load test measures the pipeline.
	authn := auth.NewAuthenticator(keys, nil, auth.AuthenticatorConfig{Limits: auth.Limits{
		Default: auth.Rate{PerSecond: 10_000, Burst: 10_000}, Ingest: auth.Rate{PerSecond: 100_000, Burst: 100_000}}})
	r := mux.NewRouter()
	r.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{})).Methods(http.MethodGet)
	ingestRoutes := r.NewRoute().Subrouter()
	ingestRoutes.Use(auth.LimitBody(auth.IngestBodyLimit), authn.Middleware(nil))
	rest.ObservationIngestRoutes(ingestRoutes, in)
	api := r.NewRoute().Subrouter()
	api.Use(auth.LimitBody(auth.DefaultBodyLimit), authn.Middleware(nil))
	rest.PatientRoutes(api, patients.New(pool))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	s.closers = append(s.closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			srv.Close()
		}
	})
	s.URL = "http://" + ln.Addr().String()
	return s, nil
}

// eventLogWriter returns the event log writer on store: "postgres" (the pool's database) or a
// clickhouse:// URL.
func (s *Stack) eventLogWriter(ctx context.Context, store string, pool *pgxpool.Pool, logger *slog.Logger,
	reg prometheus.Registerer) (*eventlog.Writer, error) {
	var log storage.EventLog
	switch {
	case store == "postgres":
		log = postgres.NewEventLog(pool)
		s.EventLog = "postgres"
	case strings.HasPrefix(store, "clickhouse://"):
		ch, err := clickhouse.Open(ctx, store, clickhouse.Config{})
		if err != nil {
			return nil, fmt.Errorf("clickhouse: %w", err)
		}
		s.closers = append(s.closers, func() { _ = ch.Close() })
		log = ch
		s.EventLog = "clickhouse"
	default:
		return nil, fmt.Errorf("event log store %q: want postgres or a clickhouse:// URL", store)
	}
	return eventlog.New(eventlog.Config{Brokers: s.Brokers, Credentials: s.Credentials, Store: log, Logger: logger, Registerer: reg})
}

// writerAssigned waits (at most 60 s) until the observation writer's group has assigned every
// partition of the observations topic among that many members: a member joining later would
// rebalance the load's first seconds.
func writerAssigned(ctx context.Context, adm *kadm.Client, members int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		lags, err := kafka.Lag(ctx, adm, obs.DefaultGroup, kafka.DefaultTopics().Observations)
		holders := map[string]bool{}
		for _, l := range lags {
			holders[l.MemberID] = true
		}
		if err == nil && len(lags) > 0 && !holders[""] && len(holders) >= min(members, len(lags)) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the observation writer did not join its group: %w", cmp.Or(err, ctx.Err()))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Close stops everything StartStack started, in reverse order.
func (s *Stack) Close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}
