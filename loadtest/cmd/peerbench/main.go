// Command peerbench measures carehub against peers on the same machine, in the same run, with
// the same bytes: FHIR transaction import against the HAPI FHIR JPA server (workloads vitals
// and synthea), FHIR search against it (workload search, below), subscription fan-out
// against a graphql-ws server on Node (workload fanout, fanout.go: carehub's eventStream and
// the peer's on one Kafka topic, N sockets, publish → receive, at each of -fanout-sockets) and
// Kafka → analytical store against ClickHouse's own Kafka table engine (workload analytics,
// below and analytics.go). Each workload writes its report; the run then writes one more,
// peers-summary, of every goal of issue 59 it judged, met or not (verdicts.go).
//
// FHIR transaction import is against the HAPI FHIR JPA server 8.8.0 (loadtest/peers/hapi): both servers are started by this command (carehub
// serve on its embedded defaults; HAPI on a fresh PostgreSQL cluster of its own, through
// loadtest/peers/hapi/run.sh), and each is sent
//
//   - vitals: transaction Bundles of one Patient and -obs vital-sign Observations referencing
//     it by its urn:uuid fullUrl, every entry a POST (built once, before any load);
//   - synthea: the Synthea patients' transaction Bundles (make synthea-deps), after the
//     hospital and practitioner batches their conditional references resolve to;
//
// by 1 and 4 concurrent clients (-clients) for -d each, after a warm-up of -warmup at the
// highest concurrency. Every answer must be 200/201 with a transaction-response Bundle whose
// every entry is 200/201; anything else is an error, counted and sampled (429/503 are counted
// as refusals and retried after Retry-After). After each phase the Observation search count
// (GET [base]/Observation?_summary=count) is polled until it counts every Observation
// acknowledged: carehub stores Observations after it answers (intake → Kafka → writer), HAPI
// before, so the report gives carehub's rate acknowledged and readable, HAPI's once, and each
// carehub figure as a ratio to HAPI's, with request p50/p99, errors and the CPU each server (its
// process and its PostgreSQL cluster) spent per resource. Load is bounded (-d ≤ 10 min,
// -max-requests) and loopback only.
//
// The search workload (search.go; after the import workloads, on the same two servers) loads
// -search-patients vitals Bundles into each server, not measured, waits until each counts their
// Observations, and reads a dozen searches to their end as a check. Then, per server and
// concurrency, each client makes searches one after another for -d, as a client reads a
// patient's vitals:
//
//	GET [base]/Observation?patient=<the server's id of the patient>&code=http://loinc.org|<a vital's code>&date=ge<a dateTime>&_count=20
//
// following every next link to the last page. The dateTime is half a minute after the
// patient's first or middle reading, so a search finds 8 to 17 Observations at -obs 100 (one
// page at -search-count 20). Each page must be a searchset Bundle of Observations matched, and
// the pages together must hold exactly the Observations loaded for that patient, vital and date;
// a search that does not is an error. Each page is a latency sample; the rates are searches
// read to the end and Observations found per second. The first page asks for no cached answer
// (HAPI reuses a repeated search's stored results for a minute otherwise).
//
// The analytics workload (analytics.go) starts an Apache Kafka broker (-kafka-sh) and a
// ClickHouse engine (-clickhouse-sh) of its own and puts carehub's event-log writer
// (processors/eventlog on storage/clickhouse's store, in this process) beside ClickHouse's Kafka
// table engine with a materialized view into the same event_log schema, each run into a fresh
// database, one side at a time: a backlog of -analytics-records carehub event envelopes already
// in the topic (rows/s from the side's start until every row is visible), then each of
// -analytics-rates for -d (publish → visible p50/p99/max, polled per 50-ms bucket of
// created_at). Every run must end with exactly the records published stored, each id once;
// the report gives carehub ÷ engine for rows/s (goal ≥ 0.8×) and lag, and the engine's flush
// interval (goal: carehub's p99 below it).
//
//	go build -o bin/peerbench ./loadtest/cmd/peerbench
//	bin/peerbench -d 20s -warmup 10s -results loadtest/results      # make bench-peers
//	bin/peerbench -workloads fanout -fanout-sockets 2000,10000      # the fan-out alone
//	bin/peerbench -workloads analytics -analytics-rates 5000 -d 30s  # Kafka → ClickHouse alone
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"carehub/loadtest/loadcli"
	"carehub/loadtest/report"
)

type config struct {
	Carehub        string        `json:"carehubBinary"`
	CarehubArgs    string        `json:"carehubArgs,omitempty"`
	KeysPerClient  int           `json:"carehubKeysPerClient"`
	HAPIRun        string        `json:"hapiRunScript"`
	HAPIHeap       string        `json:"hapiHeap"`
	HAPIPool       int           `json:"hapiPool"`
	SyntheaDir     string        `json:"syntheaDir"`
	Workloads      []string      `json:"workloads"`
	Clients        []int         `json:"clients"`
	Duration       time.Duration `json:"-"`
	Warmup         time.Duration `json:"-"`
	VitalsBundles  int           `json:"vitalsBundles"`
	ObsPerBundle   int           `json:"observationsPerVitalsBundle"`
	SearchPatients int           `json:"searchPatients"`
	SearchCount    int           `json:"searchCount"`
	MaxRequests    int           `json:"maxRequestsPerPhase,omitempty"`
	Readable       time.Duration `json:"-"`
	Results        string        `json:"-"`
	Quiet          bool          `json:"-"`
	DurationS      string        `json:"duration"`
	WarmupS        string        `json:"warmup"`
	ReadableS      string        `json:"readableTimeout"`
	Fanout         fanoutConfig  `json:"fanout"`
	workloadsFlag  string
	clientsFlag    string

	// Analytics is the analytics workload's part of the flags (analytics.go).
	Analytics analyticsConfig `json:"analytics"`
}

// fhir reports whether a workload beside HAPI (vitals, synthea, search) is to run.
func (c *config) fhir() bool {
	return slices.Contains(c.Workloads, "vitals") || slices.Contains(c.Workloads, "synthea") || slices.Contains(c.Workloads, "search")
}

func defaultPeerModules() string {
	if d := os.Getenv("CAREHUB_GRAPHQLWS_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "carehub", "peers", "graphqlws")
}

func defaultSyntheaDir() string {
	if d := os.Getenv("CAREHUB_SYNTHEA_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "carehub", "synthea")
}

func main() {
	var cfg config
	flag.StringVar(&cfg.Carehub, "carehub", "bin/carehub", "the carehub binary to start (make build)")
	flag.StringVar(&cfg.CarehubArgs, "carehub-args", "", "extra flags for carehub serve, space-separated")
	flag.IntVar(&cfg.KeysPerClient, "keys-per-client", 8, "carehub API keys each client takes in turn (carehub limits requests per key; where serve has --rate-per-key and --rate-per-org they are raised too)")
	flag.StringVar(&cfg.HAPIRun, "hapi-run", "loadtest/peers/hapi/run.sh", "the script that builds and starts the HAPI FHIR JPA server")
	flag.StringVar(&cfg.HAPIHeap, "hapi-heap", "4g", "HAPI's JVM heap (-Xms and -Xmx)")
	flag.IntVar(&cfg.HAPIPool, "hapi-pool", 10, "HAPI's JDBC connections (HikariCP)")
	flag.StringVar(&cfg.SyntheaDir, "synthea", defaultSyntheaDir(), "Synthea's output (tests/synthea/generate.sh; make synthea-deps)")
	flag.StringVar(&cfg.workloadsFlag, "workloads", "vitals,synthea,fanout", "workloads to run, comma-separated: vitals, synthea (FHIR import beside HAPI), search (FHIR search beside HAPI), fanout (subscriptions beside graphql-ws), analytics (Kafka → ClickHouse beside ClickHouse's Kafka engine)")
	flag.StringVar(&cfg.clientsFlag, "clients", "1,4", "concurrent clients of the measured phases, comma-separated")
	flag.DurationVar(&cfg.Duration, "d", 20*time.Second, "length of each measured phase")
	flag.DurationVar(&cfg.Warmup, "warmup", 180*time.Second, "warm-up of each server and workload, at the highest concurrency, before any phase is measured (0: none); HAPI's JIT compilers settle after about three minutes of load")
	flag.IntVar(&cfg.VitalsBundles, "vitals-bundles", 200, "distinct vitals Bundles built (posted round robin)")
	flag.IntVar(&cfg.ObsPerBundle, "obs", 100, "Observations per vitals Bundle")
	flag.IntVar(&cfg.SearchPatients, "search-patients", 200, "search: vitals Bundles (a Patient and -obs Observations each) loaded into each server before the searches")
	flag.IntVar(&cfg.SearchCount, "search-count", 20, "search: _count, Observations a page (at -obs 100 a search finds 8 to 17 Observations: one page at 20, several at 5)")
	flag.IntVar(&cfg.MaxRequests, "max-requests", 0, "stop a phase after this many requests (0: -d alone bounds it)")
	flag.DurationVar(&cfg.Readable, "readable-timeout", 3*time.Minute, "how long to wait after a phase for every acknowledged Observation to be counted by a search")
	flag.StringVar(&cfg.Results, "results", "loadtest/results", "write the report's JSON under this directory (loadtest/charts draws its PNG chart and HTML page)")
	flag.BoolVar(&cfg.Quiet, "quiet", false, "no progress line on stderr")
	fo := &cfg.Fanout
	flag.StringVar(&fo.socketsFlag, "fanout-sockets", "2000,10000", "fanout: socket counts, comma-separated (each a carehub phase and a peer phase)")
	flag.Float64Var(&fo.Rate, "fanout-rate", 100, "fanout: events published a second (publishEvent)")
	flag.IntVar(&fo.Reach, "fanout-reach", 20, "fanout: sockets each event reaches (the sockets are spread over the demo organization's projects and type groups)")
	flag.DurationVar(&fo.Warmup, "fanout-warmup", 5*time.Second, "fanout: load at the full rate, not measured, once the sockets subscribed")
	flag.DurationVar(&fo.Drain, "fanout-drain", 10*time.Second, "fanout: how long to wait for deliveries after publishing stops")
	flag.IntVar(&fo.Publishers, "fanout-publishers", 8, "fanout: concurrent publishEvent calls")
	flag.IntVar(&fo.PublishKeys, "fanout-publish-keys", 4, "fanout: publisher keys, taken in turn")
	flag.IntVar(&fo.Dial, "fanout-dial", 100, "fanout: sockets opened at once")
	flag.StringVar(&fo.KafkaScript, "kafka-sh", "deploy/local/kafka/kafka.sh", "fanout, analytics: the script that runs an Apache Kafka broker (its own ports and state)")
	flag.StringVar(&fo.Node, "node", "node", "fanout: the Node.js binary (20 or later)")
	flag.StringVar(&fo.PeerScript, "graphqlws", "loadtest/peers/graphqlws/server.cjs", "fanout: the graphql-ws peer")
	flag.StringVar(&fo.PeerModules, "graphqlws-modules", defaultPeerModules(), "fanout: where make peers-deps installed the peer's packages (CAREHUB_GRAPHQLWS_DIR)")
	flag.StringVar(&fo.ProfileDir, "fanout-profile", "", "fanout: save carehub's heap and goroutine profiles (sockets subscribed) and CPU profile (the load) under this directory")
	an := &cfg.Analytics
	flag.IntVar(&an.Records, "analytics-records", 1_000_000, "analytics: records in the topic before the backlog runs (each side reads them all)")
	flag.StringVar(&an.ratesFlag, "analytics-rates", "5000,10000", "analytics: steady publish rates, records/s, comma-separated (each a run of -d per side; empty: the backlog alone)")
	flag.DurationVar(&an.Window, "analytics-window", 5*time.Minute, "analytics: the most a run waits for every row to be visible, from the side's start (backlog) or the last record published (steady rate); then it fails")
	flag.IntVar(&an.Partitions, "analytics-partitions", 6, "analytics: partitions of each topic")
	flag.IntVar(&an.FlushMs, "analytics-flush-ms", 0, "analytics: the Kafka table's kafka_flush_interval_ms (0: the server's stream_flush_interval_ms, reported)")
	flag.StringVar(&an.ClickHouseScript, "clickhouse-sh", "deploy/local/clickhouse/clickhouse.sh", "analytics: the script that runs a ClickHouse engine (its own ports and state)")
	flag.Parse()
	cfg.DurationS, cfg.WarmupS, cfg.ReadableS = cfg.Duration.String(), cfg.Warmup.String(), cfg.Readable.String()
	fo.Duration, fo.DurationS, fo.WarmupS, fo.DrainS = cfg.Duration, cfg.Duration.String(), fo.Warmup.String(), fo.Drain.String()
	an.Duration, an.DurationS, an.WindowS, an.KafkaScript = cfg.Duration, cfg.Duration.String(), an.Window.String(), fo.KafkaScript
	if err := cfg.parse(); err != nil {
		fmt.Fprintln(os.Stderr, "peerbench:", err)
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "peerbench:", err)
		cancel()
		os.Exit(1)
	}
}

func (c *config) parse() error {
	var errs []error
	for w := range strings.SplitSeq(c.workloadsFlag, ",") {
		switch w = strings.TrimSpace(w); w {
		case "vitals", "synthea", "search", "fanout", "analytics":
			c.Workloads = append(c.Workloads, w)
		case "":
		default:
			errs = append(errs, fmt.Errorf("-workloads: unknown %q", w))
		}
	}
	for s := range strings.SplitSeq(c.clientsFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 64 {
			errs = append(errs, fmt.Errorf("-clients: %q is not 1 to 64", s))
			continue
		}
		c.Clients = append(c.Clients, n)
	}
	if len(c.Workloads) == 0 || len(c.Clients) == 0 {
		errs = append(errs, errors.New("nothing to run"))
	}
	if slices.Contains(c.Workloads, "fanout") {
		fo := &c.Fanout
		for s := range strings.SplitSeq(fo.socketsFlag, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 || n > 20000 {
				errs = append(errs, fmt.Errorf("-fanout-sockets: %q is not 1 to 20,000", s))
				continue
			}
			fo.Sockets = append(fo.Sockets, n)
		}
		if len(fo.Sockets) == 0 {
			errs = append(errs, errors.New("-fanout-sockets: none"))
		}
		if fo.Rate <= 0 || fo.Rate > 5000 || fo.Reach < 1 || fo.Publishers < 1 || fo.Publishers > 256 || fo.PublishKeys < 1 || fo.PublishKeys > 64 || fo.Dial < 1 || fo.Dial > 1000 {
			errs = append(errs, errors.New("-fanout-rate must be within (0, 5000], -fanout-reach at least 1, -fanout-publishers 1..256, -fanout-publish-keys 1..64, -fanout-dial 1..1000"))
		}
		if fo.Warmup < 0 || fo.Warmup > time.Minute || fo.Drain < 0 || fo.Drain > time.Minute {
			errs = append(errs, errors.New("-fanout-warmup and -fanout-drain must be within [0, 1m]"))
		}
	}
	if slices.Contains(c.Workloads, "analytics") {
		c.Analytics.Duration = c.Duration
		errs = append(errs, c.Analytics.parse()...)
	}
	if c.Duration <= 0 || c.Duration > 10*time.Minute || c.Warmup < 0 || c.Warmup > 10*time.Minute {
		errs = append(errs, errors.New("-d must be within (0, 10m] and -warmup within [0, 10m]"))
	}
	if c.KeysPerClient < 1 || c.VitalsBundles < 1 || c.ObsPerBundle < 1 || c.ObsPerBundle > 10000 {
		errs = append(errs, errors.New("-keys-per-client, -vitals-bundles need at least 1, -obs 1 to 10,000"))
	}
	if slices.Contains(c.Workloads, "search") && (c.SearchPatients < 1 || c.SearchPatients > 10000 || c.SearchCount < 1 || c.SearchCount > 1000) {
		errs = append(errs, errors.New("-search-patients must be 1 to 10,000, -search-count 1 to 1,000"))
	}
	return errors.Join(errs...)
}

// comparison is one workload at one concurrency: carehub's figures, HAPI's, and the ratios.
type comparison struct {
	Unit                    string  `json:"unit"`
	CarehubAcknowledged     float64 `json:"carehubAcknowledged"`
	CarehubReadable         float64 `json:"carehubReadable"`
	HAPI                    float64 `json:"hapi"`
	HAPIReadable            float64 `json:"hapiReadable"`
	RatioAcknowledged       float64 `json:"ratioAcknowledged"` // carehub acknowledged ÷ HAPI
	RatioReadable           float64 `json:"ratioReadable"`     // carehub readable ÷ HAPI readable
	CarehubReadableAfterSec float64 `json:"carehubReadableAfterSec"`
	CarehubP50Ms            float64 `json:"carehubP50Ms"`
	CarehubP99Ms            float64 `json:"carehubP99Ms"`
	HAPIP50Ms               float64 `json:"hapiP50Ms"`
	HAPIP99Ms               float64 `json:"hapiP99Ms"`
	RatioP50                float64 `json:"ratioP50"`
	RatioP99                float64 `json:"ratioP99"`
	CarehubErrors           int64   `json:"carehubErrors"`
	HAPIErrors              int64   `json:"hapiErrors"`
	CarehubRefused          int64   `json:"carehubRefused"`
	HAPIRefused             int64   `json:"hapiRefused"`
	CarehubCPUMsPerResource float64 `json:"carehubCpuMsPerResource"`
	HAPICPUMsPerResource    float64 `json:"hapiCpuMsPerResource"`
	// CPU seconds the rest of the machine used during each phase (contention; see phase).
	CarehubPhaseOtherCPUSec float64 `json:"carehubPhaseOtherCpuSec"`
	HAPIPhaseOtherCPUSec    float64 `json:"hapiPhaseOtherCpuSec"`
	HAPIPhaseJITCPUSec      float64 `json:"hapiPhaseJitCpuSec"`
}

type summary struct {
	Config      config                `json:"config"`
	Servers     map[string]string     `json:"servers"`
	Notes       []string              `json:"notes"`
	Comparisons map[string]comparison `json:"comparisons"`
	Phases      map[string]phase      `json:"phases"`
	// SeriesStart is where each measured phase starts in the series (seconds): the chart runs
	// them one after another.
	SeriesStart map[string]float64 `json:"seriesStart"`
	Errors      int64              `json:"errors"`
}

// run runs the workloads asked for, each writing its report, then the run's one report of
// every goal judged (writeVerdicts).
func run(ctx context.Context, cfg config) error {
	started := time.Now()
	var failures []error
	v := &verdicts{}
	if cfg.fhir() {
		if err := runFHIR(ctx, cfg, v); err != nil {
			failures = append(failures, err)
		}
	}
	if slices.Contains(cfg.Workloads, "fanout") && ctx.Err() == nil {
		if err := runFanout(ctx, cfg.Fanout, cfg.Carehub, cfg.Results, cfg.Quiet, v); err != nil {
			failures = append(failures, fmt.Errorf("fanout: %w", err))
		}
	}
	if slices.Contains(cfg.Workloads, "analytics") && ctx.Err() == nil {
		if err := runAnalytics(ctx, cfg.Analytics, cfg.Results, cfg.Quiet, v); err != nil {
			failures = append(failures, fmt.Errorf("analytics: %w", err))
		}
	}
	if err := writeVerdicts(cfg.Results, started, cfg.Workloads, v, failures); err != nil {
		failures = append(failures, err)
	}
	return errors.Join(failures...)
}

// runFHIR is FHIR transaction import (the vitals and synthea workloads) beside HAPI.
func runFHIR(ctx context.Context, cfg config, v *verdicts) error {
	var loads []workload
	for _, name := range cfg.Workloads {
		switch name {
		case "vitals":
			loads = append(loads, vitalsWorkload(cfg.VitalsBundles, cfg.ObsPerBundle, 20261202))
		case "synthea":
			w, err := syntheaWorkload(cfg.SyntheaDir)
			if err != nil {
				return err
			}
			loads = append(loads, w)
		}
	}
	for _, w := range loads {
		e, o := w.resources()
		fmt.Fprintf(os.Stderr, "peerbench: %s: %d Bundles, %d resources (%d Observations), %d provider Bundles\n", w.name, len(w.bodies), e, o, len(w.providers))
	}
	var searched workload
	if slices.Contains(cfg.Workloads, "search") {
		searched = vitalsWorkload(cfg.SearchPatients, cfg.ObsPerBundle, 20261202)
		searched.name = "search"
		fmt.Fprintf(os.Stderr, "peerbench: search: %d vitals Bundles loaded into each server, %d distinct searches of them, _count=%d\n",
			len(searched.bodies), len(searchCases(cfg.SearchPatients, cfg.ObsPerBundle)), cfg.SearchCount)
	}
	maxClients := slices.Max(cfg.Clients)
	started := time.Now()

	// HAPI first: its first start builds it and starts a JVM, which is the heavier start.
	fmt.Fprintln(os.Stderr, "peerbench: starting HAPI FHIR (loadtest/peers/hapi/run.sh)")
	hapi, err := startHAPI(ctx, cfg.HAPIRun, cfg.HAPIHeap, cfg.HAPIPool, prefixWriter(os.Stderr, "  "))
	if err != nil {
		return err
	}
	defer hapi.Close()
	fmt.Fprintf(os.Stderr, "peerbench: HAPI ready at %s\n", hapi.base)
	// carehub limits requests per key and per organization; a benchmark node raises both
	// (--rate-per-key, --rate-per-org) where the binary has the flags. Without them, each
	// client takes -keys-per-client keys in turn.
	carehubArgs := strings.Fields(cfg.CarehubArgs)
	rateNote := fmt.Sprintf("carehub's per-key request limit (50/s, burst 100): this carehub binary has no --rate-per-key flag, so each client takes %d keys in turn (%d keys, %d requests/s per client); 429s are counted as refused",
		cfg.KeysPerClient, cfg.KeysPerClient*maxClients, 50*cfg.KeysPerClient)
	if help, _ := exec.Command(cfg.Carehub, "serve", "-h").CombinedOutput(); bytes.Contains(help, []byte("-rate-per-key")) && bytes.Contains(help, []byte("-rate-per-org")) {
		carehubArgs = append([]string{"--rate-per-key", "100000", "--rate-per-org", "100000"}, carehubArgs...)
		rateNote = fmt.Sprintf("carehub's rate limits raised for a benchmark node: serve --rate-per-key 100000 --rate-per-org 100000 (defaults 50 and 100 requests/s); each client also takes %d keys in turn; 429s are counted as refused", cfg.KeysPerClient)
	}
	fmt.Fprintln(os.Stderr, "peerbench: starting carehub serve (embedded defaults)", strings.Join(carehubArgs, " "))
	ch, err := startCarehub(ctx, cfg.Carehub, cfg.KeysPerClient*maxClients, carehubArgs)
	if err != nil {
		return err
	}
	defer ch.Close()
	cfg.CarehubArgs = strings.Join(carehubArgs, " ")
	fmt.Fprintf(os.Stderr, "peerbench: carehub ready at %s with %d keys\n", ch.base, len(ch.keys))
	servers := []*server{ch, hapi}

	r := &runner{client: loadcli.HTTPClient(maxClients), readable: cfg.Readable, maxReq: cfg.MaxRequests, quiet: cfg.Quiet, maxErrors: 5}
	r.client.Timeout = 5 * time.Minute // a Synthea transaction of hundreds of entries under load

	sum := summary{Config: cfg, Comparisons: map[string]comparison{}, Phases: map[string]phase{}, SeriesStart: map[string]float64{},
		Servers: map[string]string{
			"carehub": "carehub serve " + cfg.Carehub + " on its embedded defaults (local PostgreSQL, durable: fsync and synchronous_commit on; embedded Kafka broker; every role); " + ch.base,
			"hapi":    "HAPI FHIR JPA server 8.8.0 (loadtest/peers/hapi: Spring Boot 3.5.7, JpaR4Config + HapiJpaConfig, Hibernate 6.6.4 hbm2ddl=update, HapiFhirPostgresDialect, HikariCP pool " + strconv.Itoa(cfg.HAPIPool) + ", no request validation, Hibernate Search off, JVM -Xms/-Xmx " + cfg.HAPIHeap + ") on its own PostgreSQL cluster with carehub's settings; " + hapi.base,
		},
		Notes: []string{
			rateNote,
			"both servers run during the whole benchmark on the same 2-core machine, one loaded at a time, phases interleaved (carehub, then HAPI, per workload and concurrency)",
			fmt.Sprintf("warm-up: %s per server and workload at %d clients before the measured phases, not reported as figures", cfg.Warmup, maxClients),
			"readable: after each phase, GET [base]/Observation?_summary=count (Cache-Control: no-cache) is polled every 50 ms until it counts every acknowledged Observation; the readable rate divides what was acknowledged by the time from the first request to that moment. HAPI commits before it answers, so its two rates differ only by one poll",
			"CPU: the server's process and its PostgreSQL cluster (postmaster, backends, reaped children) from /proc, from a phase's start to the moment all was readable; the load generator (this process) is not counted for either",
		},
	}
	var order int
	record := func(ph phase) {
		order++
		tag := "measured"
		if ph.Warmup {
			tag = "warmup"
		}
		key := fmt.Sprintf("%02d %s %s %s c=%d", order, tag, ph.Server, ph.Workload, ph.Clients)
		sum.Phases[key] = ph
		sum.Errors += ph.Errors
		if ph.Workload == "search" {
			fmt.Fprintf(os.Stderr, "peerbench: %-42s %8.1f searches/s, %8.0f Observations/s  page p50 %.1f ms p99 %.1f ms  errors %d refused %d  CPU s server %.1f (JIT %.1f) postgres %.1f rest of machine %.1f\n",
				key, ph.SearchesPerSec, ph.ResourcesPerSec, ph.P50Ms, ph.P99Ms, ph.Errors, ph.Refused, ph.CPUServerSec, ph.JITCPUSec, ph.CPUPostgresSec, ph.OtherCPUSec)
		} else {
			fmt.Fprintf(os.Stderr, "peerbench: %-42s %8.0f resources/s acknowledged, %8.0f readable (+%.2fs)  p50 %.0f ms p99 %.0f ms  errors %d refused %d  CPU s server %.1f (JIT %.1f) postgres %.1f rest of machine %.1f\n",
				key, ph.ResourcesPerSec, ph.ReadableResourcesPerSec, ph.ReadableAfterSec, ph.P50Ms, ph.P99Ms, ph.Errors, ph.Refused, ph.CPUServerSec, ph.JITCPUSec, ph.CPUPostgresSec, ph.OtherCPUSec)
		}
		for _, s := range ph.ErrorSamples {
			fmt.Fprintln(os.Stderr, "    error:", s)
		}
	}
	jobs := make([]job, 0, len(loads)+1)
	for _, w := range loads {
		jobs = append(jobs, r.importJob(ctx, w))
	}
	if searched.name != "" {
		jobs = append(jobs, r.searchJob(ctx, searched, cfg))
		sum.Notes = append(sum.Notes, fmt.Sprintf("search: %d vitals Bundles (a Patient and %d Observations each) loaded into each server after the import workloads, not measured; then GET [base]/Observation?patient=<the server's id>&code=http://loinc.org|<a vital>&date=ge<half a minute after the patient's first or middle reading>&_count=%d, every next link followed; the first page with Cache-Control: no-cache (HAPI would otherwise answer a repeated search from the results it stored for it); latencies are of pages, the unit searches read to the end with every Observation they must find", cfg.SearchPatients, cfg.ObsPerBundle, cfg.SearchCount))
	}
	var series []report.Point
	var offset float64
	var failures []error
	for _, w := range jobs {
		if err := w.prepare(servers); err != nil {
			if w.name != "search" {
				return err
			}
			failures = append(failures, err) // the import workloads' figures stand
			break
		}
		if cfg.Warmup > 0 {
			for _, s := range servers {
				ph, err := w.run(s, maxClients, cfg.Warmup, true)
				record(ph)
				if err != nil {
					failures = append(failures, err)
				}
			}
		}
		for _, c := range cfg.Clients {
			res := map[string]phase{}
			for _, s := range servers {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				ph, err := w.run(s, c, cfg.Duration, false)
				record(ph)
				if err != nil {
					failures = append(failures, err)
				}
				sum.SeriesStart[fmt.Sprintf("%02d %s %s c=%d", order, s.name, w.name, c)] = offset
				prev := 0.0
				for _, p := range ph.points {
					// The recorder closes a phase with a last interval of what remained, often a
					// few milliseconds: its rate would be a spike, so the chart leaves it out (the
					// phase's figures count it).
					short := p.Seconds-prev < 0.5 && prev > 0
					prev = p.Seconds
					if short {
						continue
					}
					p.Seconds += offset
					series = append(series, p)
				}
				offset += ph.Seconds
				res[s.name] = ph
			}
			sum.Comparisons[fmt.Sprintf("%s c=%d", w.name, c)] = compare(w.name, res["carehub"], res["hapi"])
		}
	}
	printTable(os.Stdout, sum)
	path, err := report.Write(cfg.Results, report.Report{Scenario: "peers-fhir-transactions", Started: started, Unit: "resources/s",
		Summary: sum, Series: series})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "peerbench: report %s (charts: %s)\n", path, report.ChartsCommand(path))
	v.add(fhirVerdicts(sum, path)...)
	if sum.Errors > 0 {
		failures = append(failures, fmt.Errorf("%d requests were not answered with a whole transaction-response, or searches did not find what they must", sum.Errors))
	}
	return errors.Join(failures...)
}

// job is one workload beside HAPI: what each server needs first (not measured), and one phase
// of it on a server.
type job struct {
	name    string
	prepare func(servers []*server) error
	run     func(s *server, clients int, d time.Duration, warmup bool) (phase, error)
}

// importJob posts w's Bundles (vitals, synthea), after its provider Bundles.
func (r *runner) importJob(ctx context.Context, w workload) job {
	return job{name: w.name,
		prepare: func(servers []*server) error {
			for _, s := range servers {
				if err := r.providers(ctx, s, w); err != nil {
					return fmt.Errorf("%s providers: %w", w.name, err)
				}
			}
			return nil
		},
		run: func(s *server, clients int, d time.Duration, warmup bool) (phase, error) {
			return r.run(ctx, s, w, clients, d, warmup)
		}}
}

// searchJob loads w's vitals Bundles into every server and searches them (search.go).
func (r *runner) searchJob(ctx context.Context, w workload, cfg config) job {
	cases := searchCases(cfg.SearchPatients, cfg.ObsPerBundle)
	plans := map[string]searchPlan{}
	return job{name: w.name,
		prepare: func(servers []*server) error {
			for _, s := range servers {
				t0 := time.Now()
				plan, err := r.loadSearch(ctx, s, w, cases, cfg.SearchCount)
				if err != nil {
					return fmt.Errorf("search: %w", err)
				}
				fmt.Fprintf(os.Stderr, "peerbench: search: %s loaded and checked in %.0fs\n", s.name, time.Since(t0).Seconds())
				plans[s.name] = plan
			}
			return nil
		},
		run: func(s *server, clients int, d time.Duration, warmup bool) (phase, error) {
			return r.runSearch(ctx, s, plans[s.name], clients, d, warmup), nil
		}}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func compare(workload string, c, h phase) comparison {
	unit, ca, cr, ha, hr := "resources/s", c.ResourcesPerSec, c.ReadableResourcesPerSec, h.ResourcesPerSec, h.ReadableResourcesPerSec
	switch workload {
	case "vitals":
		unit, ca, cr, ha, hr = "observations/s", c.ObservationsPerSec, c.ReadableObservationsPerSec, h.ObservationsPerSec, h.ReadableObservationsPerSec
	case "search":
		// A search reads what is stored: what it answers is readable.
		unit, ca, cr, ha, hr = "searches/s", c.SearchesPerSec, c.SearchesPerSec, h.SearchesPerSec, h.SearchesPerSec
	}
	return comparison{Unit: unit, CarehubAcknowledged: ca, CarehubReadable: cr, HAPI: ha, HAPIReadable: hr,
		RatioAcknowledged: ratio(ca, ha), RatioReadable: ratio(cr, hr), CarehubReadableAfterSec: c.ReadableAfterSec,
		CarehubP50Ms: c.P50Ms, CarehubP99Ms: c.P99Ms, HAPIP50Ms: h.P50Ms, HAPIP99Ms: h.P99Ms,
		RatioP50: ratio(c.P50Ms, h.P50Ms), RatioP99: ratio(c.P99Ms, h.P99Ms),
		CarehubErrors: c.Errors, HAPIErrors: h.Errors, CarehubRefused: c.Refused, HAPIRefused: h.Refused,
		CarehubCPUMsPerResource: c.CPUMsPerRes, HAPICPUMsPerResource: h.CPUMsPerRes,
		CarehubPhaseOtherCPUSec: c.OtherCPUSec, HAPIPhaseOtherCPUSec: h.OtherCPUSec, HAPIPhaseJITCPUSec: h.JITCPUSec}
}

func printTable(w io.Writer, s summary) {
	keys := make([]string, 0, len(s.Comparisons))
	for k := range s.Comparisons {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tunit\tcarehub ack\tcarehub readable\tHAPI\tack/HAPI\treadable/HAPI\tcarehub p50/p99 ms\tHAPI p50/p99 ms\terrors c/H\trefused c/H\tCPU ms/res c/H\tother CPU s c/H\t")
	for _, k := range keys {
		c := s.Comparisons[k]
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%.0f\t%.2fx\t%.2fx\t%.0f/%.0f\t%.0f/%.0f\t%d/%d\t%d/%d\t%.2f/%.2f\t%.1f/%.1f\t\n", k, c.Unit,
			c.CarehubAcknowledged, c.CarehubReadable, c.HAPI, c.RatioAcknowledged, c.RatioReadable,
			c.CarehubP50Ms, c.CarehubP99Ms, c.HAPIP50Ms, c.HAPIP99Ms, c.CarehubErrors, c.HAPIErrors,
			c.CarehubRefused, c.HAPIRefused, c.CarehubCPUMsPerResource, c.HAPICPUMsPerResource,
			c.CarehubPhaseOtherCPUSec, c.HAPIPhaseOtherCPUSec)
	}
	_ = tw.Flush()
}

// prefixWriter indents another process's lines in our stderr.
func prefixWriter(w io.Writer, prefix string) io.Writer {
	pr, pw := io.Pipe()
	go func() {
		buf := make([]byte, 0, 4096)
		chunk := make([]byte, 4096)
		for {
			n, err := pr.Read(chunk)
			buf = append(buf, chunk[:n]...)
			for {
				i := slices.Index(buf, '\n')
				if i < 0 {
					break
				}
				fmt.Fprintf(w, "%s%s\n", prefix, buf[:i])
				buf = buf[i+1:]
			}
			if err != nil {
				return
			}
		}
	}()
	return pw
}
