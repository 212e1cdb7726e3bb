package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/config"
	"carehub/schemas/kafka/observation"
	"carehub/storage/idempotency"
	"carehub/storage/kafka"
	"carehub/storage/kafka/publish"
)

// Defaults of Config.
const (
	DefaultMaxLag         = 200_000
	DefaultLatencyBudget  = time.Second
	DefaultLagInterval    = 250 * time.Millisecond
	DefaultRetryAfter     = 2 * time.Second
	DefaultRequestTimeout = 30 * time.Second
	DefaultProducers      = 16
	DefaultMaxBodyBytes   = 16 << 20
	DefaultMaxEntries     = 10_000
	DefaultMaxFuture      = time.Hour
)

// Config configures an Intake.
type Config struct {
	Brokers     []string          // required
	Credentials kafka.Credentials // authenticate to brokers that require SASL
	Pool        *pgxpool.Pool     // required: patient lookups
	// Keys holds Idempotency-Key claims and answers; default a store on Pool under a sealing key
	// of its own, for tests: a node passes the store every route uses, whose sweeper it runs.
	Keys *idempotency.Store
	// Topic receives the observations; default kafka.DefaultTopics().Observations.
	Topic string
	// WriterGroup is the consumer group whose lag is watched; default
	// processors/observations.DefaultGroup.
	WriterGroup string
	// LatencyBudget bounds accept → stored: intake answers 503 with Retry-After while the
	// records waiting to be stored are more than the writers store within it (the limit is
	// fitted to the measured age of the oldest waiting record; see admission); default
	// DefaultLatencyBudget, negative disables it.
	LatencyBudget time.Duration
	// MaxLag is a hard bound on the writer lag (records) past which intake answers 503 with
	// Retry-After whatever the store rate; default DefaultMaxLag, negative disables it.
	MaxLag int64
	// LagInterval is how often the lag is measured; default 250 ms.
	LagInterval time.Duration
	// RetryAfter is the Retry-After of 503 answers when no better one is known (the writers
	// store nothing, a broker fails); default 2 s. Over the latency budget the answer is the
	// estimated time until the backlog fits it again.
	RetryAfter time.Duration
	// RequestTimeout bounds a request from its first byte to its answer, reading the body
	// included; default 30 s. A request over it is aborted (503) and nothing of it is stored.
	RequestTimeout time.Duration
	// Producers is the number of transactional producers, and so of requests producing at
	// once; default 16. A request waits for a free one within its RequestTimeout.
	Producers int
	// TransactionalIDPrefix prefixes the producers' transactional ids; default
	// "carehub-ingest-" and 12 random hex digits, unique per process. A stable prefix per
	// instance lets a restarted instance fence its predecessor's open transactions at once
	// rather than after their timeout; two live instances must never share one.
	TransactionalIDPrefix string
	MaxBodyBytes          int64         // default 16 MiB
	MaxEntries            int           // default 10,000 observations per request
	MaxFuture             time.Duration // how far effectiveDateTime may be ahead of now; default 1 h
	Logger                *slog.Logger  // default: discard
	Registerer            prometheus.Registerer
	// Refusing, when set, says why the broker refuses writes when the node knows (the embedded
	// broker's full disk); a 503 of observations Kafka did not take then says that.
	Refusing func() error
}

func (c *Config) defaults() {
	config.Default(&c.Topic, kafka.DefaultTopics().Observations)
	config.Default(&c.WriterGroup, observation.WriterGroup)
	// Negative disables MaxLag and LatencyBudget: only zero takes the default.
	if c.MaxLag == 0 {
		c.MaxLag = DefaultMaxLag
	}
	if c.LatencyBudget == 0 {
		c.LatencyBudget = DefaultLatencyBudget
	}
	config.Default(&c.LagInterval, DefaultLagInterval)
	config.Default(&c.RetryAfter, DefaultRetryAfter)
	config.Default(&c.RequestTimeout, DefaultRequestTimeout)
	config.Default(&c.Producers, DefaultProducers)
	if c.TransactionalIDPrefix == "" {
		c.TransactionalIDPrefix = kafka.TransactionalID("carehub-ingest-")
	}
	config.Default(&c.MaxBodyBytes, DefaultMaxBodyBytes)
	config.Default(&c.MaxEntries, DefaultMaxEntries)
	config.Default(&c.MaxFuture, DefaultMaxFuture)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Intake is the service behind POST /v1/observations (api/rest.ObservationIngestRoutes is its
// transport). Submit reads the caller from the context (kernel/access). Run does its
// background work (lag measurement); Close it after the HTTP server has
// drained. It is safe for concurrent use.
type Intake struct {
	cfg       Config
	producers *publish.Transactional
	patients  *patientCache
	keys      *idempotency.Store
	adm       *admission  // nil when backpressure is disabled
	lag       *lagWatch   // nil when backpressure is disabled
	lagClient *kgo.Client // nil when backpressure is disabled
	m         *metrics
	logger    *slog.Logger
	closeOnce sync.Once
}

// New returns an Intake; it connects lazily.
func New(cfg Config) (*Intake, error) {
	switch {
	case len(cfg.Brokers) == 0:
		return nil, errors.New("observation intake: no Kafka brokers")
	case cfg.Pool == nil:
		return nil, errors.New("observation intake: no database pool")
	}
	cfg.defaults()
	if cfg.Keys == nil {
		cfg.Keys = idempotency.NewStore(cfg.Pool, idempotency.Config{Logger: cfg.Logger})
	}
	logger := cfg.Logger.With("component", "observation_intake")
	in := &Intake{
		cfg: cfg,
		producers: publish.NewTransactional(publish.TransactionalConfig{Brokers: cfg.Brokers, Credentials: cfg.Credentials, Size: cfg.Producers, Prefix: cfg.TransactionalIDPrefix,
			ClientID: "carehub-ingest", TxnTimeout: cfg.RequestTimeout + 30*time.Second, Logger: cfg.Logger}),
		patients: newPatientCache(cfg.Pool),
		keys:     cfg.Keys,
		m:        newMetrics(),
		logger:   logger,
	}
	if cfg.MaxLag > 0 || cfg.LatencyBudget > 0 {
		cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: cfg.Brokers, Credentials: cfg.Credentials, ClientID: "carehub-ingest-lag", Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("observation intake: %w", err)
		}
		in.lagClient = cl
		in.adm = newAdmission(cfg.LatencyBudget, max(20*cfg.LagInterval, 5*time.Second))
		in.lag = &lagWatch{adm: kadm.NewClient(cl), group: cfg.WriterGroup, topic: cfg.Topic, interval: cfg.LagInterval,
			logger: logger, gauge: in.m.lag, a: in.adm}
	}
	if err := in.m.register(cfg.Registerer); err != nil {
		if in.lagClient != nil {
			in.lagClient.Close()
		}
		return nil, fmt.Errorf("observation intake: %w", err)
	}
	return in, nil
}

// Run measures the writers' lag until ctx is done.
func (in *Intake) Run(ctx context.Context) error {
	if in.lag != nil {
		in.lag.run(ctx)
	}
	<-ctx.Done()
	return nil
}

// Close closes the Kafka clients. It is idempotent.
func (in *Intake) Close() {
	in.closeOnce.Do(func() {
		in.producers.Close()
		if in.lagClient != nil {
			in.lagClient.Close()
		}
	})
}

// Lag returns the writers' lag as last measured and whether that measurement is current.
func (in *Intake) Lag() (int64, bool) {
	if in.adm == nil {
		return 0, false
	}
	return in.adm.current(time.Now())
}

// RetryAfter is how long a client should wait after a 503 from Submit: over the latency
// budget, the estimated time until what waits fits it again (1 s to twice the budget);
// otherwise (the writers store nothing, a broker failed) Config.RetryAfter.
func (in *Intake) RetryAfter() time.Duration {
	var wait time.Duration
	if in.adm != nil {
		wait = in.adm.wait(time.Now())
	}
	if wait <= 0 || wait == time.Duration(math.MaxInt64) {
		return in.cfg.RetryAfter
	}
	return max(min(wait, budgetsPerRetry*in.cfg.LatencyBudget), time.Second)
}

// RequestTimeout bounds a Submit; transports bound reading the body by it too.
func (in *Intake) RequestTimeout() time.Duration { return in.cfg.RequestTimeout }

// MaxBodyBytes is the body limit of a Submission.
func (in *Intake) MaxBodyBytes() int64 { return in.cfg.MaxBodyBytes }
