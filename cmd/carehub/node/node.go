package node

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gorilla/mux"

	"carehub/api/auth"
	"carehub/api/server"
	"carehub/ingest/intake"
	"carehub/kernel/sealing"
	"carehub/kernel/telemetry"
	"carehub/processors/agents"
	"carehub/processors/audit"
	"carehub/processors/deployments"
	"carehub/processors/fhirsubs"
	"carehub/processors/workflows"
	"carehub/storage"
	idemstore "carehub/storage/idempotency"
	"carehub/storage/kafka"
	"carehub/storage/postgres"
)

// Node is a running carehub node.
type Node struct {
	cfg    Config
	logger *slog.Logger

	// Infrastructure, in start order.
	local   *postgres.Local // nil with an external database
	pool    *pgxpool.Pool   //
	broker  *kafka.Embedded // nil with external brokers
	brokers []string        //
	// kafkaCreds authenticate every Kafka client of the node (the embedded broker's own, or
	// the operator's for external brokers).
	kafkaCreds kafka.Credentials
	ns         kafka.Namespace // names of topics, groups and transactional ids
	topics     kafka.Topics    // ns.Topics(), passed to every producer and consumer
	kcl        *kgo.Client     // shared producer client
	registry   *prometheus.Registry
	eventLog   storage.EventLog
	auditLog   storage.AuditLog

	// What the components provide to those that need them (components.go says which sets what).
	router      *mux.Router
	keys        *postgres.APIKeys
	tokens      *auth.Tokens
	authn       *auth.Authenticator
	edge        server.Edge
	agents      *agents.Service
	workflows   *workflows.Service
	deployments *deployments.Service
	invoker     *deployments.Invoker
	intake      *intake.Intake // nil unless the node runs the ingest role
	sealKey     *sealing.Key   // the server sealing key (sealing.go)
	// webhookRoots are the authorities receivers' certificates are checked against (nil: the
	// system's; sealing.go).
	webhookRoots *x509.CertPool
	idemKeys     *idemstore.Store
	auditPub     *audit.Publisher
	fhirSubs     *fhirsubs.Service // FHIR Subscriptions and their websocket wake-ups
	fhirWake     *fhirsubs.Wake

	http     *http.Server
	debug    *http.Server // --debug-addr, when set
	listener net.Listener
	ready    atomic.Bool

	// What /readyz and `carehub status` report (readiness.go): the components started, the
	// last round of checks, the last error-level log lines.
	started    []string
	readyState readiness
	errs       *errorRing

	// Background workers (consumers, relays), each run by run() and waited for on shutdown.
	cancelWorkers context.CancelFunc
	workers       sync.WaitGroup
	workerErr     chan error

	// closers run in reverse order on shutdown.
	closers []func(context.Context) error

	closeOnce sync.Once
	closeErr  error
}

// Start brings a node up: the components its roles need, in dependency order (stores first,
// then workers and routes), then HTTP. On error everything already started is stopped again.
func Start(ctx context.Context, cfg Config, logger *slog.Logger) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	plan, err := startOrder(components, cfg.Roles)
	if err != nil {
		return nil, err
	}
	errs := &errorRing{}
	logger = slog.New(ringHandler{Handler: logger.Handler(), ring: errs})
	s := &Node{cfg: cfg, logger: logger, registry: prometheus.NewRegistry(), workerErr: make(chan error, 16),
		ns: cfg.namespace(), topics: cfg.namespace().Topics(), errs: errs}
	s.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		telemetry.BuildInfo(cfg.Version, cfg.Revision))
	defer func() {
		if err != nil {
			sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
			defer cancel()
			s.shutdown(sctx)
		}
	}()
	began := time.Now()
	if cfg.DataDir != "" {
		if err := CheckDataDir(cfg.DataDir); err != nil {
			return nil, err
		}
	}
	if len(cfg.KafkaBrokers) > 0 {
		if err := kafka.Reachable(ctx, cfg.KafkaBrokers, 5*time.Second); err != nil {
			return nil, fmt.Errorf("--kafka-brokers: %w", err)
		}
	}
	TuneRuntime(logger)
	// Workers live until shutdown; ctx only bounds start-up.
	wctx, cancel := context.WithCancel(context.Background())
	s.cancelWorkers = cancel
	for _, c := range plan {
		if err := c.start(s, ctx, wctx); err != nil {
			return nil, err
		}
		s.started = append(s.started, c.name)
	}
	if err := s.serveHTTP(s.router); err != nil {
		return nil, err
	}
	if err := s.serveDebug(); err != nil {
		return nil, err
	}
	s.ready.Store(true)
	logger.Info("carehub ready", "http_addr", s.Addr(), "roles", cfg.Roles, "kafka_brokers", s.brokers,
		"embedded_postgres", s.local != nil, "embedded_kafka", s.broker != nil, "startup_ms", time.Since(began).Milliseconds())
	return s, nil
}

func (s *Node) startPostgres(ctx context.Context) error {
	dsn := s.cfg.DatabaseURL
	if dsn == "" {
		local, err := postgres.StartLocal(ctx, filepath.Join(s.cfg.DataDir, "postgres"), postgres.LocalConfig{Logger: s.logger})
		if err != nil {
			return fmt.Errorf("embedded postgres: %w", err)
		}
		s.local = local
		s.closers = append(s.closers, local.Stop)
		if err := local.EnsureDatabase(ctx, "carehub"); err != nil {
			return fmt.Errorf("embedded postgres: %w", err)
		}
		dsn = local.DSN("carehub")
	}
	pool, err := postgres.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	s.pool = pool
	s.closers = append(s.closers, func(context.Context) error { pool.Close(); return nil })
	applied, err := postgres.Migrate(ctx, pool, s.logger)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if applied > 0 {
		s.logger.Info("migrations applied", "count", applied)
	}
	return nil
}

func (s *Node) startKafka(ctx context.Context) error {
	s.brokers, s.kafkaCreds = s.cfg.KafkaBrokers, s.cfg.KafkaCredentials
	if len(s.brokers) == 0 {
		b, err := kafka.StartEmbedded(ctx, filepath.Join(s.cfg.DataDir, "kafka"), kafka.EmbeddedConfig{Logger: s.logger})
		if err != nil {
			return fmt.Errorf("embedded kafka: %w", err)
		}
		s.broker = b
		s.closers = append(s.closers, func(context.Context) error { return b.Close() })
		s.brokers, s.kafkaCreds = b.Addrs(), b.Credentials()
	}
	cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: s.brokers, Credentials: s.kafkaCreds, ClientID: "carehub", Registerer: s.registry, Logger: s.logger})
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	s.kcl = cl
	s.closers = append(s.closers, func(context.Context) error { cl.Close(); return nil })
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := kafka.EnsureTopics(tctx, cl, s.cfg.TopicLayout(), s.topics.All()...); err != nil {
		return fmt.Errorf("kafka brokers %v: %w", s.brokers, err)
	}
	return nil
}

// run starts a background worker owned by the node; Close cancels and waits for it.
func (s *Node) run(name string, fn func(ctx context.Context) error, ctx context.Context) {
	s.workers.Add(1)
	go func() {
		defer s.workers.Done()
		defer func() {
			if r := recover(); r != nil {
				s.logger.Error("worker panicked", "worker", name, "panic", fmt.Sprint(r))
				s.workerErr <- fmt.Errorf("%s panicked: %v", name, r)
			}
		}()
		if err := fn(ctx); err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
			s.logger.Error("worker stopped", "worker", name, "err", err)
			select {
			case s.workerErr <- fmt.Errorf("%s: %w", name, err):
			default:
			}
		}
	}()
}

func (s *Node) serveHTTP(h http.Handler) error {
	ln, err := net.Listen("tcp", s.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.HTTPAddr, err)
	}
	s.listener = ln
	srv := server.NewHTTPServer(h, s.httpLimits(), s.logger, s.registry)
	s.http = srv.Server
	// The cap sees TCP connections, under TLS: ServeTLS wraps the limited listener.
	limited := srv.Listener(ln)
	go func() {
		var err error
		if s.cfg.TLSCert != "" {
			err = s.http.ServeTLS(limited, s.cfg.TLSCert, s.cfg.TLSKey)
		} else {
			err = s.http.Serve(limited)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Error("http server stopped", "err", err)
			s.workerErr <- fmt.Errorf("http: %w", err)
		}
	}()
	return nil
}

// Addr is the address the HTTP server listens on.
func (s *Node) Addr() string {
	if s.listener == nil {
		return ""
	}
	return s.listener.Addr().String()
}

// URL is the base URL of the HTTP server.
func (s *Node) URL() string {
	scheme := "http"
	if s.cfg.TLSCert != "" {
		scheme = "https"
	}
	return scheme + "://" + s.Addr()
}

// Router returns the node's HTTP router, for listings of the routes it serves (the OpenAPI
// document's test walks it).
func (s *Node) Router() *mux.Router { return s.router }

// Pool is the node's Postgres pool (for tests and the CLI).
func (s *Node) Pool() *pgxpool.Pool { return s.pool }

// Brokers are the Kafka bootstrap addresses the node uses.
func (s *Node) Brokers() []string { return s.brokers }

// KafkaCredentials returns what a client of Brokers authenticates with.
func (s *Node) KafkaCredentials() kafka.Credentials { return s.kafkaCreds }

// Topics are the node's topics, in its --kafka-namespace.
func (s *Node) Topics() kafka.Topics { return s.topics }

// Err delivers a fatal error of a background component.
func (s *Node) Err() <-chan error { return s.workerErr }

// Close shuts down: not-ready first, then HTTP drains, then workers, then stores in reverse start
// order. It is idempotent.
func (s *Node) Close(ctx context.Context) error {
	s.closeOnce.Do(func() { s.closeErr = s.shutdown(ctx) })
	return s.closeErr
}

func (s *Node) shutdown(ctx context.Context) error {
	s.ready.Store(false)
	var errs []error
	if s.http != nil {
		if err := s.http.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("http shutdown: %w", err))
			s.http.Close()
		}
	}
	if s.debug != nil {
		s.debug.Close()
	}
	if s.cancelWorkers != nil {
		s.cancelWorkers()
	}
	done := make(chan struct{})
	go func() { s.workers.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, errors.New("workers did not stop in time"))
	}
	for i := len(s.closers) - 1; i >= 0; i-- {
		if err := s.closers[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Run starts the node and blocks until ctx is cancelled (SIGINT/SIGTERM) or a component fails,
// then shuts down within the configured grace.
func Run(ctx context.Context, cfg Config, logger *slog.Logger, started func(*Node)) error {
	s, err := Start(ctx, cfg, logger)
	if err != nil {
		return err
	}
	if started != nil {
		started(s)
	}
	var runErr error
	select {
	case <-ctx.Done():
		logger.Info("shutting down")
	case runErr = <-s.Err():
		logger.Error("component failed; shutting down", "err", runErr)
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer cancel()
	if err := s.Close(sctx); err != nil {
		return errors.Join(runErr, err)
	}
	return runErr
}

// NewLogger returns the slog logger for cfg.
func NewLogger(cfg Config) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: lvl, ReplaceAttr: durationMillis}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, opts))
}

// durationMillis logs a time.Duration as <key>_ms, a number of milliseconds, the way carehub's
// own elapsed_ms and startup_ms are: JSON would otherwise show nanoseconds, and text "1.2s".
func durationMillis(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() != slog.KindDuration {
		return a
	}
	key := a.Key
	if !strings.HasSuffix(key, "_ms") {
		key += "_ms"
	}
	return slog.Float64(key, float64(a.Value.Duration().Microseconds())/1000)
}
