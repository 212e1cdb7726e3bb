package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"carehub/cmd/carehub/node"
)

// version and revision are set at build time with -ldflags "-X main.version=... -X
// main.revision=...": a build with -buildvcs=false, or from a tree without .git, has no commit
// of Go's own to report.
var version, revision = "dev", ""

const usage = `carehub: the clinical AI platform event hub

Usage:
  carehub serve   [flags]    run a node (API, ingest, processors)
  carehub migrate [flags]    apply database migrations and exit
  carehub seed    [flags]    seed demo data into an empty database and exit
  carehub keys    create|list|rotate|revoke [flags]   manage API keys
  carehub health  [flags]    ask a running node's /healthz; exit 0 when it answers 200
  carehub status  [--url URL] [--json]   a running node's roles, dependencies, consumer lags and recent errors
  carehub subscribe --project ID [--types a,b] [--count N]   print a project's events as they happen (key in CAREHUB_KEY)
  carehub deadletter list|replay [--offset N|--all]   inspect and replay the events the event log set aside
  carehub version            print the version

Run 'carehub <command> -h' for a command's flags. Every flag can also be set through the
environment as CAREHUB_<FLAG> (e.g. --data-dir as CAREHUB_DATA_DIR); flags win over the environment.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = cmdServe(ctx, args[1:], stdout, stderr)
	case "migrate":
		err = cmdMigrate(ctx, args[1:], stdout, stderr)
	case "seed":
		err = cmdSeed(ctx, args[1:], stdout, stderr)
	case "keys":
		err = cmdKeys(ctx, args[1:], stdout, stderr)
	case "health":
		err = cmdHealth(ctx, args[1:], stdout, stderr)
	case "status":
		err = cmdStatus(ctx, args[1:], stdout, stderr)
	case "subscribe":
		err = cmdSubscribe(ctx, args[1:], stdout, stderr)
	case "deadletter":
		err = cmdDeadLetter(ctx, args[1:], stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintln(stdout, "carehub", version)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "carehub: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if errors.Is(err, errUsage) {
			return 2
		}
		// One clear line per problem, nothing else: the operator reads it first.
		// Continuation lines (a driver's indented detail) fold into their problem's line.
		msg := strings.ReplaceAll(err.Error(), "\n\t", " ")
		fmt.Fprintln(stderr, "carehub:", strings.ReplaceAll(msg, "\n", "\ncarehub: "))
		return 1
	}
	return 0
}

var errUsage = errors.New("usage")

// serverFlags registers the flags that describe where carehub's stores are, shared by serve and
// the operator commands so they all find the same data.
func serverFlags(fs *flag.FlagSet, cfg *node.Config) {
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory of the embedded Postgres and Kafka")
	fs.StringVar(&cfg.DatabaseURL, "database-url", cfg.DatabaseURL, "Postgres URL (empty: embedded cluster under the data dir)")
	fs.Func("kafka-brokers", "comma-separated Kafka bootstrap brokers (empty: embedded broker)", func(v string) error {
		cfg.KafkaBrokers = splitList(v)
		return nil
	})
	fs.StringVar(&cfg.KafkaCredentials.User, "kafka-sasl-user", cfg.KafkaCredentials.User, "SASL/SCRAM-SHA-256 user of the external Kafka brokers (the embedded broker makes its own)")
	fs.StringVar(&cfg.KafkaCredentials.Password, "kafka-sasl-password", cfg.KafkaCredentials.Password, "its password; prefer CAREHUB_KAFKA_SASL_PASSWORD, which ps does not show")
	fs.StringVar(&cfg.KafkaNamespace, "kafka-namespace", cfg.KafkaNamespace,
		"prefix of every Kafka topic, consumer group and transactional id (several deployments share one cluster)")
	fs.StringVar(&cfg.ClickHouseURL, "clickhouse-url", cfg.ClickHouseURL, "ClickHouse URL for the event and audit log (empty: Postgres)")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "json or text")
}

func serveFlags(fs *flag.FlagSet, cfg *node.Config) {
	serverFlags(fs, cfg)
	fs.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, "HTTP listen address host:port")
	fs.StringVar(&cfg.DebugAddr, "debug-addr", cfg.DebugAddr, "loopback host:port serving Go's profiles at /debug/pprof/ (empty: off)")
	fs.StringVar(&cfg.AccessLog, "access-log", cfg.AccessLog, "level of the one log line per HTTP request: info, debug (shown with --log-level debug) or off")
	fs.Float64Var(&cfg.AccessLogSample, "access-log-sample", cfg.AccessLogSample, "fraction of HTTP requests in the access log, more than 0 up to 1 (0.01: one in a hundred); answers >= 500 are always logged")
	fs.Func("roles", "comma-separated roles: api, ingest, processors (default all)", func(v string) error {
		cfg.Roles = splitList(v)
		return nil
	})
	fs.IntVar(&cfg.Partitions, "partitions", cfg.Partitions, "partitions of the Kafka topics carehub creates")
	fs.IntVar(&cfg.KafkaReplication, "kafka-replication-factor", cfg.KafkaReplication,
		"replicas of each Kafka topic carehub creates, on a cluster (3 with --kafka-min-insync-replicas 2 survives a broker; 0: the broker's default.replication.factor)")
	fs.IntVar(&cfg.KafkaMinInsync, "kafka-min-insync-replicas", cfg.KafkaMinInsync,
		"min.insync.replicas of the topics carehub creates: replicas holding a record before it is acknowledged (0: the broker's)")
	fs.StringVar(&cfg.Seed, "seed", cfg.Seed, "demo data on an empty database: demo or none")
	fs.DurationVar(&cfg.ShutdownGrace, "shutdown-timeout", cfg.ShutdownGrace, "bound on graceful shutdown")
	fs.DurationVar(&cfg.ClickHouseEventRetention, "clickhouse-event-retention", cfg.ClickHouseEventRetention,
		"with --clickhouse-url: keep events this long (whole days, e.g. 8760h), then the server drops them a month's part at a time (0: keep)")
	fs.DurationVar(&cfg.ClickHouseAuditRetention, "clickhouse-audit-retention", cfg.ClickHouseAuditRetention,
		"with --clickhouse-url: keep audit records this long (HIPAA: six years, 52608h), then drop them as events (0: keep)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", cfg.TLSCert, "TLS certificate file (serve HTTPS)")
	fs.StringVar(&cfg.TLSKey, "tls-key", cfg.TLSKey, "TLS key file")
	fs.StringVar(&cfg.SealingKeyFile, "sealing-key-file", cfg.SealingKeyFile,
		"file holding the server sealing key, 32 bytes base64 (openssl rand -base64 32), the same on every node (empty: <data-dir>/sealing.key, made on first start)")
	fs.BoolVar(&cfg.AllowInsecureHTTP, "allow-insecure-http", cfg.AllowInsecureHTTP, "serve plain HTTP on a non-loopback address (behind a TLS proxy)")
	fs.BoolVar(&cfg.WebhooksAllowPrivate, "webhooks-allow-private", cfg.WebhooksAllowPrivate, "allow webhook delivery to private and loopback addresses (development, tests)")
	fs.StringVar(&cfg.WebhooksCAFile, "webhooks-ca-file", cfg.WebhooksCAFile, "PEM file of certificate authorities trusted for webhook receivers' certificates, beside the system's (a private PKI)")
	fs.DurationVar(&cfg.IngestLatencyBudget, "ingest-latency-budget", cfg.IngestLatencyBudget, "accept → stored bound: intake holds a request up to 250ms or answers 503 with Retry-After while more waits to be stored than the observation writers store within it (0: default 1s; negative: off)")
	fs.Int64Var(&cfg.IngestMaxLag, "ingest-max-lag", cfg.IngestMaxLag, "hard bound on the observation writer lag (records) that makes intake answer 503 (0: default 200000; -1: off)")
	fs.IntVar(&cfg.IngestProducers, "ingest-producers", cfg.IngestProducers, "concurrent transactional producers of observation intake (0: default 16)")
	fs.DurationVar(&cfg.IngestTimeout, "ingest-timeout", cfg.IngestTimeout, "bound on one observation intake request (0: default 30s)")
	fs.StringVar(&cfg.IngestTransactionalID, "ingest-transactional-id", cfg.IngestTransactionalID, "stable transactional id prefix of this instance's intake (default: random per process)")
	fs.IntVar(&cfg.ObservationWriterConcurrency, "observation-writer-concurrency", cfg.ObservationWriterConcurrency, "Postgres transactions (chunks of up to 1,000 records) the observation writer stores at once (0: default 3)")
	fs.Int64Var(&cfg.GraphQLMaxCost, "graphql-max-cost", cfg.GraphQLMaxCost, "budget of one GraphQL operation's estimated cost, in values its answer can hold (0: default 100000)")
	fs.Int64Var(&cfg.GraphQLAnswerBytesPerSecond, "graphql-answer-bytes-per-second", cfg.GraphQLAnswerBytesPerSecond, "large values (payload, input, output, config) one API key's GraphQL queries may fetch a second, with 4 s of burst; past it RATE_LIMITED (0: default 8 MiB, negative: no bound)")
	fs.Int64Var(&cfg.SubscriptionBytesPerSecond, "subscription-bytes-per-second", cfg.SubscriptionBytesPerSecond, "event bytes one organization's GraphQL subscriptions are sent a second on this node, with 4 s of burst; past it they wait, and those that stay behind are dropped as slow consumers (0: default 16 MiB, negative: no bound)")
	fs.Int64Var(&cfg.GraphQLMaxResponseBytes, "graphql-max-response-bytes", cfg.GraphQLMaxResponseBytes, "answer-size budget of one GraphQL query or mutation in bytes; a larger answer is refused with RESPONSE_TOO_LARGE (0: default 16 MiB)")
	fs.DurationVar(&cfg.HTTP.ReadHeaderTimeout, "http-read-header-timeout", cfg.HTTP.ReadHeaderTimeout, "bound on reading a request's line and headers")
	fs.DurationVar(&cfg.HTTP.ReadTimeout, "http-read-timeout", cfg.HTTP.ReadTimeout, "bound on reading a whole request, headers and body (observation ingest: --ingest-timeout)")
	fs.DurationVar(&cfg.HTTP.WriteTimeout, "http-write-timeout", cfg.HTTP.WriteTimeout, "a client that takes nothing of an answer (or a WebSocket frame) for this long is dropped; streamed exports run as long as the client reads")
	fs.DurationVar(&cfg.HTTP.IdleTimeout, "http-idle-timeout", cfg.HTTP.IdleTimeout, "bound on a keep-alive connection between requests")
	fs.IntVar(&cfg.HTTP.MaxConns, "http-max-conns", cfg.HTTP.MaxConns, "open HTTP connections (WebSockets included) the node serves; more are answered 503 (at most half the open-file limit)")
	fs.Float64Var(&cfg.RatePerKey, "rate-per-key", cfg.RatePerKey, "requests a second one API key (with its JWTs) makes of this node, with 2 s of burst; more are 429 (0: default 50; ingest: --ingest-rate-per-key)")
	fs.Float64Var(&cfg.RatePerOrg, "rate-per-org", cfg.RatePerOrg, "requests a second all the API keys of one organization make of this node together, with 2 s of burst (0: default 100)")
	fs.Float64Var(&cfg.IngestRatePerKey, "ingest-rate-per-key", cfg.IngestRatePerKey, "POST /v1/observations a second of one API key on this node, with 2 s of burst (0: default 200)")
	fs.Float64Var(&cfg.IngestRatePerOrg, "ingest-rate-per-org", cfg.IngestRatePerOrg, "POST /v1/observations a second of all the API keys of one organization on this node together, with 2 s of burst (0: default 1000)")
	fs.IntVar(&cfg.MaxInFlightPerKey, "max-in-flight-per-key", cfg.MaxInFlightPerKey, "HTTP requests one API key (with its JWTs) has in progress on this node at once; more are 429 (0: default 256)")
	fs.IntVar(&cfg.SocketLimits.SocketsPerKey, "ws-max-sockets-per-key", cfg.SocketLimits.SocketsPerKey, "GraphQL WebSockets one API key (with its JWTs) holds open on this node; more are closed with 4013")
	fs.IntVar(&cfg.SocketLimits.OperationsPerKey, "ws-max-operations-per-key", cfg.SocketLimits.OperationsPerKey, "subscriptions and other WebSocket operations one API key runs at once on this node")
	fs.IntVar(&cfg.SocketLimits.SocketsPerOrg, "ws-max-sockets-per-org", cfg.SocketLimits.SocketsPerOrg, "GraphQL WebSockets all the API keys of one organization hold open on this node together")
	fs.IntVar(&cfg.SocketLimits.OperationsPerOrg, "ws-max-operations-per-org", cfg.SocketLimits.OperationsPerOrg, "WebSocket operations all the API keys of one organization run at once on this node together")
	fs.IntVar(&cfg.SocketLimits.Operations, "ws-max-operations", cfg.SocketLimits.Operations, "subscriptions and other WebSocket operations running at once on this node, all keys together")
	fs.Func("trusted-proxies", "comma-separated proxy addresses whose X-Forwarded-For is believed", func(v string) error {
		cfg.TrustedProxies = splitList(v)
		return nil
	})
}

// parse applies CAREHUB_* environment variables, then the command line, so flags win. A
// command line flag package refuses is one line naming the nearest flag and -h, not the whole
// usage, which buries the mistake; -h prints the usage.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(io.Discard)
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		name := "CAREHUB_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if err := fs.Set(f.Name, v); err != nil && envErr == nil {
				envErr = fmt.Errorf("%s=%q: %w", name, v, err)
			}
		}
	})
	if envErr != nil {
		return envErr
	}
	if err := fs.Parse(args); err != nil {
		fs.SetOutput(stderr)
		if errors.Is(err, flag.ErrHelp) {
			fs.Usage()
			return err
		}
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
			msg = "unknown flag --" + name + suggestFlag(fs, name)
		}
		fmt.Fprintf(stderr, "carehub %s: %s (carehub %s -h lists the flags)\n", fs.Name(), msg, fs.Name())
		return errUsage
	}
	return nil
}

// suggestFlag returns "; did you mean --x?" for the defined flag nearest to name, when it is
// near enough to be a typo of it.
func suggestFlag(fs *flag.FlagSet, name string) string {
	best, bestDist := "", max(2, len(name)/4)+1
	fs.VisitAll(func(f *flag.Flag) {
		if d := editDistance(name, f.Name); d < bestDist {
			best, bestDist = f.Name, d
		}
	})
	if best == "" {
		return ""
	}
	return "; did you mean --" + best + "?"
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func splitList(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func cmdServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := node.Defaults()
	cfg.Version, cfg.Revision = version, revision
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	serveFlags(fs, &cfg)
	demoKey := fs.Bool("demo-key", false, "once ready, create an API key for the demo organization and print how to call carehub with it")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	logger := node.NewLogger(cfg)
	return node.Run(ctx, cfg, logger, func(s *node.Node) {
		fmt.Fprintf(stdout, "carehub %s listening on %s\n", version, s.URL())
		if *demoKey {
			// The tour that follows the banner needs the consumers assigned (on real Kafka a
			// group takes seconds to join); a node not ready after a minute says why in /readyz.
			if err := s.AwaitReady(ctx, time.Minute); err != nil {
				logger.Warn("not ready yet; the demo key is printed anyway", "err", err)
			}
			if err := printDemoKey(ctx, s, cfg.DataDir, stdout); err != nil {
				logger.Warn("could not create a demo key", "err", err)
			}
		}
	})
}
