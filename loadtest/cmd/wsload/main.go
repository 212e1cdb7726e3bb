// Command wsload loads carehub's GraphQL subscriptions: it opens -conns WebSocket connections
// (graphql-transport-ws) to a running node, each with one eventStream subscription, publishes
// events at -rate per second for -duration, and reports how long events took to reach the
// subscribers, how many arrived, and what the connections cost the server (memory and
// goroutines per connection, CPU per delivered message) from the node's /metrics. See
// loadtest/README.md.
//
//	wsload -url http://127.0.0.1:8080 -key chk_live_… -conns 1000 -rate 100 -duration 30s
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"carehub/loadtest/loadcli"
	loadreport "carehub/loadtest/report"
	"carehub/loadtest/wsfleet"
	"carehub/storage/kafka"
)

// Bounds: every run is bounded in time and count.
const (
	maxConns    = 20000
	maxRate     = 20000
	maxDuration = 10 * time.Minute
	maxPayload  = 64 << 10
)

type config struct {
	url, key, metricsURL string
	conns, idle, groups  int
	projects             []string
	rate                 float64
	duration, drain      time.Duration
	settle               time.Duration
	mode                 string
	brokers              []string
	kafkaDataDir         string // the embedded broker's data dir, whose credentials -publish kafka uses
	topic                string
	publishers, pubKeys  int
	payload              int
	dialConcurrency      int
	out                  string
	results              string
	quiet                bool
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "wsload:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	started := time.Now()
	rep, err := run(ctx, cfg)
	if rep != nil {
		rep.print(os.Stdout)
		if cfg.results != "" {
			path, werr := loadreport.Write(cfg.results, loadreport.Report{Scenario: "subscriptions", Started: started, Unit: "messages/s",
				LagName: "messages not yet delivered", Summary: rep, Series: rep.Series})
			if werr != nil {
				fmt.Fprintln(os.Stderr, "wsload:", werr)
			} else {
				fmt.Printf("report: %s (charts: %s)\n", path, loadreport.ChartsCommand(path))
			}
		}
		if cfg.out != "" {
			b, _ := json.MarshalIndent(rep, "", "  ")
			if werr := os.WriteFile(cfg.out, append(b, '\n'), 0o644); werr != nil {
				fmt.Fprintln(os.Stderr, "wsload:", werr)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "wsload:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	var c config
	var projects, brokers string
	fs := flag.NewFlagSet("wsload", flag.ContinueOnError)
	fs.StringVar(&c.url, "url", "http://127.0.0.1:8080", "base URL of the carehub node (loopback only)")
	fs.StringVar(&c.key, "key", "", "API key with admin:org of the organization to load (e.g. from carehub serve --demo-key); wsload makes and revokes test-mode keys with it")
	fs.StringVar(&c.metricsURL, "metrics-url", "", "the node's Prometheus metrics (default URL/metrics)")
	fs.IntVar(&c.conns, "conns", 1000, fmt.Sprintf("subscribed connections that receive events (≤ %d with -idle)", maxConns))
	fs.IntVar(&c.idle, "idle", 0, "additional connections subscribed to a type nothing publishes")
	fs.IntVar(&c.groups, "groups", 1, "type groups: connection i listens to load.g<i/P mod G>, so each event reaches conns/(P×G)")
	fs.StringVar(&projects, "projects", "", "project ids, comma-separated (default: every project of the key's organization)")
	fs.Float64Var(&c.rate, "rate", 100, fmt.Sprintf("events published per second (≤ %d)", maxRate))
	fs.DurationVar(&c.duration, "duration", 30*time.Second, fmt.Sprintf("how long to publish (≤ %v)", maxDuration))
	fs.DurationVar(&c.drain, "drain", 10*time.Second, "how long to wait for deliveries after publishing stops")
	fs.DurationVar(&c.settle, "settle", 2*time.Second, "wait after every subscription registered before reading the server's memory")
	fs.StringVar(&c.mode, "publish", "graphql", "graphql (publishEvent: outbox, relay, Kafka, fan-out) or kafka (produce envelopes to the events topic)")
	fs.StringVar(&brokers, "brokers", "", "Kafka brokers of the node, for -publish kafka (loopback only)")
	fs.StringVar(&c.kafkaDataDir, "kafka-data-dir", "", "the node's embedded broker data dir (<data-dir>/kafka), whose SASL credentials -publish kafka uses; empty: none")
	fs.StringVar(&c.topic, "topic", kafka.DefaultTopics().Events, "the events topic, for -publish kafka")
	fs.IntVar(&c.publishers, "publishers", 64, "concurrent publish calls")
	fs.IntVar(&c.pubKeys, "publish-keys", 0, "publisher keys to spread the per-key rate limit (default rate/40, at least 1)")
	fs.IntVar(&c.payload, "payload", 0, fmt.Sprintf("padding bytes added to each event's payload (≤ %d)", maxPayload))
	fs.IntVar(&c.dialConcurrency, "dial-concurrency", 100, "connections opened at once")
	fs.StringVar(&c.out, "out", "", "also write the report as JSON to this file")
	fs.StringVar(&c.results, "results", "", "write the report's JSON under this directory (loadtest/charts draws its PNG chart and HTML page)")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress line on stderr")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.projects, c.brokers = splitList(projects), splitList(brokers)
	if c.metricsURL == "" {
		c.metricsURL = strings.TrimRight(c.url, "/") + "/metrics"
	}
	if c.pubKeys == 0 {
		c.pubKeys = max(1, int(math.Ceil(c.rate/40)))
	}
	var errs []error
	if c.key == "" {
		errs = append(errs, errors.New("-key is required"))
	}
	if err := wsfleet.Loopback("-url", c.url, c.metricsURL); err != nil {
		errs = append(errs, err)
	}
	if err := wsfleet.Loopback("-brokers", c.brokers...); err != nil {
		errs = append(errs, err)
	}
	if c.conns < 1 || c.idle < 0 || c.conns+c.idle > maxConns {
		errs = append(errs, fmt.Errorf("-conns + -idle must be 1..%d", maxConns))
	}
	if c.groups < 1 || c.groups > c.conns {
		errs = append(errs, errors.New("-groups must be 1..conns"))
	}
	if c.rate <= 0 || c.rate > maxRate {
		errs = append(errs, fmt.Errorf("-rate must be in (0, %d]", maxRate))
	}
	if c.duration <= 0 || c.duration > maxDuration || c.drain < 0 || c.drain > time.Minute || c.settle < 0 || c.settle > time.Minute {
		errs = append(errs, fmt.Errorf("-duration must be in (0, %v], -drain and -settle in [0, 1m]", maxDuration))
	}
	if c.mode != "graphql" && c.mode != "kafka" {
		errs = append(errs, errors.New("-publish must be graphql or kafka"))
	}
	if c.mode == "kafka" && len(c.brokers) == 0 {
		errs = append(errs, errors.New("-publish kafka needs -brokers"))
	}
	if c.publishers < 1 || c.publishers > 1024 || c.pubKeys < 1 || c.pubKeys > 256 || c.dialConcurrency < 1 || c.dialConcurrency > 1000 {
		errs = append(errs, errors.New("-publishers 1..1024, -publish-keys 1..256, -dial-concurrency 1..1000"))
	}
	if c.payload < 0 || c.payload > maxPayload {
		errs = append(errs, fmt.Errorf("-payload must be 0..%d", maxPayload))
	}
	return c, errors.Join(errs...)
}

// serverMetrics are the node's figures the report uses.
var serverMetrics = []string{"process_resident_memory_bytes", "go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines",
	"process_cpu_seconds_total", "carehub_graphql_subscriptions", "carehub_graphql_subscription_executions",
	"carehub_fanout_subscribers", "carehub_ws_connections",
	"carehub_ws_slow_consumer_closes_total", "carehub_fanout_slow_subscribers_dropped_total"}

func run(ctx context.Context, cfg config) (*report, error) {
	n := wsfleet.NewNode(cfg.url, cfg.publishers+8)
	setup, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ten, err := n.Tenant(setup, cfg.key, cfg.projects)
	if err != nil {
		return nil, err
	}

	// Keys of this run: one for the subscribers (no scope: eventStream needs none), the
	// publishers' own. Revoked at the end, whatever happens.
	var made []wsfleet.CreatedKey
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, k := range made {
			if err := n.RevokeKey(cctx, cfg.key, k.ID); err != nil {
				fmt.Fprintln(os.Stderr, "wsload: revoke key:", err)
			}
		}
	}()
	subKey, err := n.CreateKey(setup, cfg.key, "wsload subscribers", []string{})
	if err != nil {
		return nil, err
	}
	made = append(made, subKey)
	var pubKeys []string
	for i := range cfg.pubKeys {
		k, err := n.CreateKey(setup, cfg.key, fmt.Sprintf("wsload publisher %d", i), []string{"exec:workflows"})
		if err != nil {
			return nil, err
		}
		made = append(made, k)
		pubKeys = append(pubKeys, k.Secret)
	}

	rep := &report{Config: reportConfig{Conns: cfg.conns, Idle: cfg.idle, Projects: len(ten.Projects), Groups: cfg.groups,
		Rate: cfg.rate, Duration: cfg.duration.String(), Publish: cfg.mode, Publishers: cfg.publishers, PublishKeys: cfg.pubKeys,
		PayloadPad: cfg.payload}}
	before, err := n.Metrics(setup, cfg.metricsURL, serverMetrics...)
	if err != nil {
		return nil, err
	}
	rep.Server.Before = before

	// Connect: connection i subscribes to project i mod P, group (i div P) mod G; idle ones to a
	// type nothing publishes.
	wsURL := "ws" + strings.TrimPrefix(strings.TrimRight(cfg.url, "/"), "http") + "/graphql"
	f := wsfleet.New(wsURL, subKey.Secret)
	readCtx, stopReading := context.WithCancel(context.Background())
	defer func() {
		stopReading()
		f.Close(cfg.dialConcurrency)
	}()
	p := wsfleet.NewPlan(ten.OrgID, ten.Projects, cfg.groups)
	total := cfg.conns + cfg.idle
	connStart := time.Now()
	var connErrs atomic.Int64
	var firstConnErr atomic.Value
	sem := make(chan struct{}, cfg.dialConcurrency)
	var wg sync.WaitGroup
	for i := range total {
		project, types := ten.Projects[i%len(ten.Projects)], []string{wsfleet.IdleType}
		if i < cfg.conns {
			project, types = p.Assign(i)
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return rep, ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := f.Connect(dctx, readCtx, project, types); err != nil {
				connErrs.Add(1)
				firstConnErr.CompareAndSwap(nil, err.Error())
			}
		})
	}
	wg.Wait()
	rep.Connect = connectReport{Opened: int(f.Open.Load()), Failed: int(connErrs.Load()), Seconds: time.Since(connStart).Seconds(),
		Handshake: f.Handshake.Summary()}
	if e, ok := firstConnErr.Load().(string); ok {
		rep.Connect.FirstError = e
	}
	if connErrs.Load() > 0 {
		// Listeners of failed connections were counted; the expected figure would be wrong.
		return rep, fmt.Errorf("%d connections failed, first: %s", connErrs.Load(), rep.Connect.FirstError)
	}
	// Every subscription registered (identical ones share an execution and one fan-out
	// subscriber), and the memory settled.
	want := before["carehub_graphql_subscriptions"] + float64(total)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		m, err := n.Metrics(ctx, cfg.metricsURL, serverMetrics...)
		if err != nil {
			return rep, err
		}
		if m["carehub_graphql_subscriptions"] >= want {
			break
		}
		if time.Now().After(deadline) {
			return rep, fmt.Errorf("only %v of %v subscriptions registered after 2 min", m["carehub_graphql_subscriptions"], want)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(cfg.settle)
	if rep.Server.Connected, err = n.Metrics(ctx, cfg.metricsURL, serverMetrics...); err != nil {
		return rep, err
	}

	var snd wsfleet.Sender
	if cfg.mode == "kafka" {
		ks, err := wsfleet.NewKafkaSender(cfg.brokers, cfg.kafkaDataDir, cfg.topic, ten.OrgID)
		if err != nil {
			return rep, err
		}
		snd = ks
	} else {
		snd = &wsfleet.GraphQLSender{Node: n, Keys: pubKeys}
	}
	defer snd.Close()

	// Warm up: publish until some subscriber receives (the hub reads from the tail of the topic
	// once it has its partitions), then measure from zero.
	if err := wsfleet.WarmUp(ctx, f, p, snd, 30*time.Second); err != nil {
		return rep, err
	}

	pub := &wsfleet.Publisher{Plan: p, Sender: snd, Workers: cfg.publishers, Pad: strings.Repeat("x", cfg.payload)}
	rec := loadreport.NewRecorder(loadreport.Options{Unit: "messages/s", LagName: "messages not yet delivered", Quiet: cfg.quiet,
		Lag: func() float64 { return float64(max(0, pub.Expected.Load()-f.Received.Load())) }})
	pub.Rec, f.Rec = rec, rec
	rec.Start()
	defer rec.Stop()
	cpu0 := loadcli.ProcessCPU()
	elapsed := pub.Run(ctx, cfg.rate, cfg.duration)
	published := time.Now()
	for f.Received.Load() < pub.Expected.Load() && time.Since(published) < cfg.drain && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
	}
	rep.Series = rec.Stop()
	deliveredIn := time.Since(published) + elapsed
	after, err := n.Metrics(context.Background(), cfg.metricsURL, serverMetrics...)
	if err != nil {
		return rep, err
	}
	rep.Server.After = after
	rep.fill(cfg, f, pub, elapsed, deliveredIn, loadcli.ProcessCPU()-cpu0)
	return rep, nil
}

func splitList(v string) []string {
	var out []string
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
