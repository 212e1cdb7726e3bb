// Package node is carehub's composition root: it builds a node from one table of components
// tagged by role (components.go), starts what the configured roles need in dependency order,
// serves HTTP, and shuts down in reverse order after first reporting not-ready. cmd/carehub
// parses flags into a Config and calls Run; tests start whole nodes through
// carehub/e2e/servertest, which calls Start.
package node

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"carehub/api/server"
	"carehub/api/ws"
	"carehub/storage/kafka"
)

// Roles a node can run.
const (
	RoleAPI        = "api"
	RoleIngest     = "ingest"
	RoleProcessors = "processors"
)

// AllRoles is the default: one node does everything.
var AllRoles = []string{RoleAPI, RoleIngest, RoleProcessors}

// Config is everything carehub serve needs. Zero values mean "use the default"; Validate checks
// it up front so bad configuration fails before anything starts.
type Config struct {
	Version        string   // the build's version, served as carehub_build_info{version}
	Revision       string   // the build's VCS commit ("": the one Go stamped, if any), carehub_build_info{revision}
	DataDir        string   // embedded Postgres and Kafka live here
	HTTPAddr       string   // host:port
	DebugAddr      string   // loopback host:port serving /debug/pprof ("": none)
	Roles          []string // subset of AllRoles
	KafkaBrokers   []string // empty: embedded kfake broker
	KafkaNamespace string   // prefix of topics, consumer groups and transactional ids ("": none)
	// KafkaCredentials authenticate to external brokers that require SASL/SCRAM; the embedded
	// broker always requires it, with credentials of its own under the data dir.
	KafkaCredentials kafka.Credentials
	DatabaseURL      string // empty: embedded local Postgres cluster
	ClickHouseURL    string // empty: event and audit log in Postgres
	// ClickHouseEventRetention and ClickHouseAuditRetention become the tables' TTL (0: keep).
	ClickHouseEventRetention, ClickHouseAuditRetention time.Duration
	Partitions                                         int           // partitions of topics carehub creates
	Seed                                               string        // demo or none
	LogLevel                                           string        // debug, info, warn, error
	LogFormat                                          string        // json or text
	AccessLog                                          string        // info, debug or off: the level of the one line per HTTP request
	AccessLogSample                                    float64       // fraction of requests in the access log, (0, 1]; answers ≥ 500 always
	ShutdownGrace                                      time.Duration // bound on graceful shutdown
	// KafkaReplication and KafkaMinInsync lay out the topics carehub creates on a cluster
	// (0: the broker's default.replication.factor and min.insync.replicas).
	KafkaReplication, KafkaMinInsync int

	TLSCert, TLSKey      string
	AllowInsecureHTTP    bool // serve plain HTTP on a non-loopback address (behind a TLS proxy)
	WebhooksAllowPrivate bool // allow webhook delivery to private and loopback addresses
	// WebhooksCAFile holds PEM certificates of authorities trusted, beside the system's, for
	// webhook receivers' certificates (a hospital's private PKI).
	WebhooksCAFile string
	TrustedProxies []string
	// SealingKeyFile holds the server sealing key (kernel/sealing), which what is kept sealed
	// at rest is sealed under; every node sharing the database must use the same file's key.
	// Empty: DataDir/sealing.key, created on first start (mode 0600).
	SealingKeyFile string
	GraphQLMaxCost int64 // budget of one GraphQL operation's estimated cost (0: graphql.DefaultMaxCost)
	// GraphQLMaxResponseBytes is the answer-size budget of one GraphQL query or mutation, in
	// bytes (0: graphql.DefaultMaxResponseBytes).
	GraphQLMaxResponseBytes int64
	// GraphQLAnswerBytesPerSecond bounds the large values (payload, input, output, config) one
	// API key's GraphQL queries fetch a second; SubscriptionBytesPerSecond the event bytes one
	// organization's subscriptions are sent a second on this node. 0: the default, negative: none.
	GraphQLAnswerBytesPerSecond, SubscriptionBytesPerSecond int64
	// SocketRecheck is how often an open WebSocket re-checks its credential (revocation,
	// rotation expiry, scopes); 0 means ws.DefaultRecheckInterval. Not a flag: tests shorten it.
	SocketRecheck time.Duration
	// KeyCacheTTL is how long a node caches a key lookup; 0 means auth.DefaultCacheTTL.
	// Revocations reach the cache at once (postgres.KeyListener) whatever it is. Not a flag: tests
	// lengthen it to show that.
	KeyCacheTTL time.Duration
	// MaxInFlightPerKey bounds the requests one API key (with its JWTs) has in progress on the
	// node at once; 0 means auth.DefaultMaxInFlight.
	MaxInFlightPerKey int
	// RatePerKey and RatePerOrg are the requests a second one API key (with its JWTs), and all
	// the keys of one organization together, may make of this node; IngestRatePerKey and
	// IngestRatePerOrg the same for POST /v1/observations. Each bucket holds two seconds of its
	// rate. 0 means auth.DefaultLimits().
	RatePerKey, RatePerOrg, IngestRatePerKey, IngestRatePerOrg float64
	// SocketKeepAlive (ping interval and pong deadline) and SocketWriteTimeout (one frame's
	// write) drop dead peers; 0 means the ws defaults. Not flags: the slow-consumer test
	// lengthens both so that only the send queue decides.
	SocketKeepAlive, SocketWriteTimeout time.Duration
	// SocketLimits cap WebSockets and their operations per credential and per node (zero
	// fields: the ws defaults; docs/LIMITS.md).
	SocketLimits ws.Limits

	// HTTP bounds the server's connections: timeouts and the connection cap (docs/LIMITS.md,
	// "Connections"); zero fields take server.HTTPLimits' defaults.
	HTTP server.HTTPLimits

	// Observation ingest (zero values mean the defaults of ingest/intake).
	IngestLatencyBudget          time.Duration // accept → stored bound that turns intake away with 503; negative disables
	IngestMaxLag                 int64         // writer lag that turns intake away with 503; -1 disables
	IngestProducers              int           // concurrent transactional producers
	IngestTimeout                time.Duration // bound on one request, body read included
	IngestTransactionalID        string        // stable per instance, to fence a crashed predecessor at once
	ObservationWriterConcurrency int           // chunks stored at once
}

// Defaults returns the configuration `carehub serve` starts from.
func Defaults() Config {
	return Config{
		Version:         "dev",
		DataDir:         DefaultDataDir,
		HTTPAddr:        "127.0.0.1:8080",
		Roles:           slices.Clone(AllRoles),
		Partitions:      6,
		Seed:            "demo",
		LogLevel:        "info",
		AccessLog:       "info",
		AccessLogSample: 1,
		LogFormat:       "json",
		ShutdownGrace:   20 * time.Second,
		HTTP:            server.HTTPLimits{}.WithDefaults(),
		SocketLimits:    ws.Limits{}.WithDefaults(),
	}
}

// DefaultDataDir is the one data-dir default: every command (serve, migrate, seed, keys) and every
// make target (DATA_DIR) uses it, so a key created without --data-dir is one the node sees. It is
// under /tmp rather than $HOME or $TMPDIR: the embedded Postgres runs as the postgres user, which
// must be able to traverse every parent directory (root's home, a private TMPDIR are not).
// TestMakefileDataDir keeps the Makefile's DATA_DIR equal to it.
const DefaultDataDir = "/tmp/carehub"

// accessLog is the router's access-log setting.
func (c *Config) accessLog() *server.AccessLog {
	a := &server.AccessLog{Level: slog.LevelInfo, Off: c.AccessLog == "off", Sample: c.AccessLogSample}
	if c.AccessLog == "debug" {
		a.Level = slog.LevelDebug
	}
	return a
}

// Validate checks the configuration and returns one error naming each problem.
func (c *Config) Validate() error {
	var errs []error
	if c.DataDir == "" && (c.DatabaseURL == "" || len(c.KafkaBrokers) == 0) {
		errs = append(errs, errors.New("--data-dir is required for the embedded Postgres or Kafka"))
	}
	if err := validateAddr(c.HTTPAddr); err != nil {
		errs = append(errs, fmt.Errorf("--http-addr %q: %w", c.HTTPAddr, err))
	}
	if c.DebugAddr != "" && !loopback(c.DebugAddr) {
		errs = append(errs, fmt.Errorf("--debug-addr %q: profiles are served on a loopback address only", c.DebugAddr))
	}
	if len(c.Roles) == 0 {
		errs = append(errs, errors.New("--roles: at least one role is required (api, ingest, processors)"))
	}
	for _, r := range c.Roles {
		if !slices.Contains(AllRoles, r) {
			errs = append(errs, fmt.Errorf("--roles: unknown role %q (valid: %s)", r, strings.Join(AllRoles, ", ")))
		}
	}
	if err := c.KafkaCredentials.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("--kafka-sasl-user/--kafka-sasl-password: %w", err))
	}
	for _, b := range c.KafkaBrokers {
		if err := validateAddr(b); err != nil {
			errs = append(errs, fmt.Errorf("--kafka-brokers: %q: %w", b, err))
		}
	}
	if err := kafka.Namespace(c.KafkaNamespace).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("--kafka-namespace: %w", err))
	}
	if c.DatabaseURL != "" {
		if _, err := pgconn.ParseConfig(c.DatabaseURL); err != nil {
			errs = append(errs, errors.New("--database-url: not a valid Postgres URL or connection string"))
		}
	}
	if c.ClickHouseURL != "" {
		if err := validateURL(c.ClickHouseURL, "clickhouse", "tcp"); err != nil {
			errs = append(errs, fmt.Errorf("--clickhouse-url: %w", err))
		}
	}
	if c.MaxInFlightPerKey < 0 {
		errs = append(errs, errors.New("--max-in-flight-per-key must not be negative (0: default)"))
	}
	if c.RatePerKey < 0 || c.RatePerOrg < 0 || c.IngestRatePerKey < 0 || c.IngestRatePerOrg < 0 {
		errs = append(errs, errors.New("--rate-per-key, --rate-per-org, --ingest-rate-per-key and --ingest-rate-per-org must not be negative (0: default)"))
	}
	if c.ClickHouseEventRetention < 0 || c.ClickHouseAuditRetention < 0 {
		errs = append(errs, errors.New("--clickhouse-event-retention and --clickhouse-audit-retention must not be negative (0: keep)"))
	}
	if c.Partitions < 1 || c.Partitions > 1000 {
		errs = append(errs, fmt.Errorf("--partitions %d: must be 1..1000", c.Partitions))
	}
	if c.KafkaReplication < 0 || c.KafkaReplication > 7 {
		errs = append(errs, fmt.Errorf("--kafka-replication-factor %d: must be 1..7 (0: the broker's default)", c.KafkaReplication))
	}
	if c.KafkaMinInsync < 0 || c.KafkaReplication > 0 && c.KafkaMinInsync > c.KafkaReplication {
		errs = append(errs, fmt.Errorf("--kafka-min-insync-replicas %d: must be 1..--kafka-replication-factor (0: the broker's default)", c.KafkaMinInsync))
	}
	if (c.KafkaReplication > 0 || c.KafkaMinInsync > 0) && len(c.KafkaBrokers) == 0 {
		errs = append(errs, errors.New("--kafka-replication-factor and --kafka-min-insync-replicas need --kafka-brokers: the embedded broker has no replicas"))
	}
	if c.Seed != "demo" && c.Seed != "none" {
		errs = append(errs, fmt.Errorf("--seed %q: must be demo or none", c.Seed))
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel) {
		errs = append(errs, fmt.Errorf("--log-level %q: must be debug, info, warn or error", c.LogLevel))
	}
	if !slices.Contains([]string{"info", "debug", "off"}, c.AccessLog) {
		errs = append(errs, fmt.Errorf("--access-log %q: must be info, debug or off", c.AccessLog))
	}
	if !(c.AccessLogSample > 0 && c.AccessLogSample <= 1) {
		errs = append(errs, fmt.Errorf("--access-log-sample %v: must be more than 0 and at most 1 (use --access-log off for none)", c.AccessLogSample))
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		errs = append(errs, fmt.Errorf("--log-format %q: must be json or text", c.LogFormat))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	}
	if c.TLSCert == "" && !c.AllowInsecureHTTP && validateAddr(c.HTTPAddr) == nil && !loopback(c.HTTPAddr) {
		errs = append(errs, fmt.Errorf("--http-addr %q is not a loopback address: serve TLS (--tls-cert, --tls-key) or set --allow-insecure-http behind a TLS-terminating proxy", c.HTTPAddr))
	}
	if c.IngestMaxLag < -1 || c.IngestProducers < 0 || c.IngestTimeout < 0 || c.ObservationWriterConcurrency < 0 {
		errs = append(errs, errors.New("--ingest-max-lag, --ingest-producers, --ingest-timeout and --observation-writer-concurrency must not be negative (except --ingest-max-lag -1: off)"))
	}
	if err := c.HTTP.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("--http-*-timeout, --http-max-conns: %w", err))
	}
	if err := c.SocketLimits.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("--ws-max-*: %w", err))
	}
	if c.GraphQLMaxCost < 0 {
		errs = append(errs, fmt.Errorf("--graphql-max-cost %d: must not be negative (0: the default)", c.GraphQLMaxCost))
	}
	if c.GraphQLMaxResponseBytes < 0 {
		errs = append(errs, fmt.Errorf("--graphql-max-response-bytes %d: must not be negative (0: the default)", c.GraphQLMaxResponseBytes))
	}
	if c.IngestLatencyBudget > 0 && c.IngestLatencyBudget < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("--ingest-latency-budget %v: at least 100ms (the writers' lag is measured every 250ms), or negative: off", c.IngestLatencyBudget))
	}
	for _, p := range c.TrustedProxies {
		if _, err := netip.ParsePrefix(p); err != nil {
			if _, err := netip.ParseAddr(p); err != nil {
				errs = append(errs, fmt.Errorf("--trusted-proxies: %q is not an IP address or CIDR", p))
			}
		}
	}
	if c.SealingKeyFile == "" && c.DataDir == "" {
		errs = append(errs, errors.New("--sealing-key-file is required without --data-dir (every node of a deployment uses the same key)"))
	}
	if c.ShutdownGrace <= 0 {
		errs = append(errs, errors.New("--shutdown-timeout must be positive"))
	}
	return errors.Join(errs...)
}

// transactionalID is the transactional id (or prefix) of one of the node's transactional
// producers, named by role: derived from --ingest-transactional-id when set; fixed with the
// embedded broker, which serves this node only; otherwise random per process. A stable id lets a
// restarted node fence what its killed predecessor left open instead of waiting out the timeout.
func (c *Config) transactionalID(role string) string {
	switch {
	case c.IngestTransactionalID != "":
		return c.namespace().Name(c.IngestTransactionalID + "-" + role)
	case len(c.KafkaBrokers) == 0:
		return "carehub-" + role
	}
	return kafka.TransactionalID("carehub-" + role + "-")
}

// namespace is the node's Kafka namespace: every topic, consumer group and transactional id the
// node uses is named through it (components.go), so the configuration is their one source.
func (c *Config) namespace() kafka.Namespace { return kafka.Namespace(c.KafkaNamespace) }

func validateAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("must be host:port")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return errors.New("port must be 0..65535")
	}
	if strings.ContainsAny(host, " /") {
		return errors.New("malformed host")
	}
	return nil
}

func validateURL(raw string, schemes ...string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("not a URL")
	}
	if !slices.Contains(schemes, u.Scheme) {
		return fmt.Errorf("scheme must be one of %s", strings.Join(schemes, ", "))
	}
	if u.Host == "" && u.Query().Get("host") == "" {
		return errors.New("missing host")
	}
	return nil
}

func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CheckDataDir makes sure dir exists and is writable, so an unwritable data dir is one clear line
// at start rather than a failure deep inside initdb.
func CheckDataDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("data dir %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".write-check-*")
	if err != nil {
		return fmt.Errorf("data dir %s is not writable: %w", dir, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// TopicLayout is how the topics this node creates are laid out on the brokers.
func (c Config) TopicLayout() kafka.Layout {
	return kafka.Layout{Partitions: int32(c.Partitions), Replication: int16(c.KafkaReplication), MinInsync: c.KafkaMinInsync}
}
