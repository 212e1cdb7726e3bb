package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"carehub/kernel/access"
	"carehub/loadtest/loadcli"
	"carehub/loadtest/report"
	"carehub/loadtest/wsfleet"
	"carehub/storage/kafka"
)

// The fan-out workload (issue 59): carehub's GraphQL subscriptions beside the graphql-ws peer
// (loadtest/peers/graphqlws: graphql-js, graphql-ws and ws on Node, kafkajs reading the same
// topic), one server loaded at a time, on one Apache Kafka broker of its own
// (deploy/local/kafka). For each socket count carehub is started afresh on the broker (the same
// data dir every time), then
//
//  1. carehub: N graphql-transport-ws sockets, each with one eventStream(projectId, types)
//     subscription (wsfleet: socket i listens to project i mod P and type load.g<(i div P) mod
//     G>, G chosen so that an event reaches -fanout-reach sockets), events published through
//     carehub's publishEvent at -fanout-rate for -d, each received frame timestamped;
//  2. the peer, started then: the same N sockets and subscriptions, the same events at the same
//     rate published the same way through carehub, whose events topic the peer reads.
//
// Both servers get the same Kafka records. For each the phase reports publish call start →
// received p50/p99, delivered of expected, the server process's RSS growth per socket (after
// the sockets subscribed, and after the load) and its CPU per 1,000 deliveries; carehub's CPU
// is also given net of its publish path, which it runs in both phases (its CPU during the
// peer's phase, per second, is subtracted).

// fanoutPhase is one server's phase at one socket count.
type fanoutPhase struct {
	Server              string  `json:"server"`
	Sockets             int     `json:"sockets"`
	Groups              int     `json:"typeGroups"`
	SubscribersPerEvent float64 `json:"subscribersPerEvent"`

	ConnectSeconds    float64         `json:"connectSeconds"`
	ConnectFailed     int64           `json:"connectFailed"`
	FirstConnectError string          `json:"firstConnectError,omitempty"`
	Handshake         wsfleet.Summary `json:"handshake"` // dial → connection_ack

	Published         int64           `json:"published"`
	PublishFailed     int64           `json:"publishFailed"`
	RateLimited       int64           `json:"rateLimited"`
	FirstPublishError string          `json:"firstPublishError,omitempty"`
	PublishRate       float64         `json:"publishRate"` // achieved, events/s
	PublishCall       wsfleet.Summary `json:"publishCall"`

	Expected  int64           `json:"expected"` // Σ over published events of their subscribers
	Delivered int64           `json:"delivered"`
	Rate      float64         `json:"messagesPerSec"`
	FromCall  wsfleet.Summary `json:"publishToReceived"`        // publish call start → received
	FromEvent wsfleet.Summary `json:"eventTimestampToReceived"` // the event's createdAt → received
	Ended     map[string]int  `json:"connectionsEnded,omitempty"`

	// The server process's resident set: before the sockets, once they all subscribed (and
	// settled), and after the load and drain; per socket, the growth over the sockets.
	RSSBeforeMiB      float64 `json:"rssBeforeMiB"`
	RSSConnectedMiB   float64 `json:"rssConnectedMiB"`
	RSSAfterMiB       float64 `json:"rssAfterMiB"`
	KiBPerSocket      float64 `json:"kibPerSocketConnected"`
	KiBPerSocketAfter float64 `json:"kibPerSocketAfterLoad"`
	// The runtime's own count (fanoutTarget.runtime), before the sockets and once they
	// subscribed, and its growth per socket in the same units (bytes, goroutines); the heap
	// figure sums the runtime's memory for objects and stacks (fanoutTarget.heap).
	RuntimeBefore    map[string]float64 `json:"runtimeBefore"`
	RuntimeConnected map[string]float64 `json:"runtimeConnected"`
	RuntimeAfter     map[string]float64 `json:"runtimeAfterLoad"`
	RuntimePerSocket map[string]float64 `json:"runtimePerSocket"`
	// RuntimePerSocketAfter is the growth from before the sockets to after the load.
	RuntimePerSocketAfter map[string]float64 `json:"runtimePerSocketAfterLoad"`
	HeapKiBPerSocket      float64            `json:"heapKibPerSocket"`

	Seconds              float64 `json:"seconds"` // publishing and draining
	CPUSec               float64 `json:"cpuSec"`  // the server process, over Seconds
	CPUPer1000           float64 `json:"cpuSecPer1000Deliveries"`
	CarehubCPUSec        float64 `json:"carehubCpuSec"` // carehub's process over Seconds (the peer's phase: its publish path alone)
	KafkaCPUSec          float64 `json:"kafkaCpuSec"`   // the broker's
	ClientCPUSec         float64 `json:"clientCpuSec"`  // this process: the sockets' readers and the publishers
	OtherCPUSec          float64 `json:"otherCpuSec"`   // the rest of the machine
	CarehubNetCPUPer1000 float64 `json:"carehubNetCpuSecPer1000Deliveries,omitempty"`

	points []report.Point
}

// fanoutComparison is carehub beside the peer at one socket count; each ratio is carehub ÷ peer
// (below 1: carehub is lower).
type fanoutComparison struct {
	Sockets             int     `json:"sockets"`
	SubscribersPerEvent float64 `json:"subscribersPerEvent"`
	EventsPerSec        float64 `json:"eventsPerSec"`

	CarehubP50Ms float64 `json:"carehubP50Ms"`
	CarehubP99Ms float64 `json:"carehubP99Ms"`
	PeerP50Ms    float64 `json:"peerP50Ms"`
	PeerP99Ms    float64 `json:"peerP99Ms"`
	RatioP50     float64 `json:"ratioP50"`
	RatioP99     float64 `json:"ratioP99"`

	CarehubDelivered int64 `json:"carehubDelivered"`
	CarehubExpected  int64 `json:"carehubExpected"`
	PeerDelivered    int64 `json:"peerDelivered"`
	PeerExpected     int64 `json:"peerExpected"`

	CarehubKiBPerSocket      float64 `json:"carehubKibPerSocket"`
	PeerKiBPerSocket         float64 `json:"peerKibPerSocket"`
	RatioMemory              float64 `json:"ratioMemory"`
	CarehubKiBPerSocketAfter float64 `json:"carehubKibPerSocketAfterLoad"`
	PeerKiBPerSocketAfter    float64 `json:"peerKibPerSocketAfterLoad"`
	RatioMemoryAfter         float64 `json:"ratioMemoryAfterLoad"`
	CarehubHeapKiBPerSocket  float64 `json:"carehubHeapKibPerSocket"`
	PeerHeapKiBPerSocket     float64 `json:"peerHeapKibPerSocket"`

	CarehubCPUPer1000    float64 `json:"carehubCpuSecPer1000"`    // the whole process: publish path and fan-out
	CarehubNetCPUPer1000 float64 `json:"carehubNetCpuSecPer1000"` // less its publish path
	PeerCPUPer1000       float64 `json:"peerCpuSecPer1000"`
	RatioCPU             float64 `json:"ratioCpuNet"`
	RatioCPUGross        float64 `json:"ratioCpuGross"`

	// Goal (issue 59): carehub's p99 and memory per socket no worse than the peer's.
	GoalP99    bool `json:"goalP99Met"`
	GoalMemory bool `json:"goalMemoryMet"`
}

type fanoutSummary struct {
	Config      fanoutConfig                `json:"config"`
	Servers     map[string]string           `json:"servers"`
	Notes       []string                    `json:"notes"`
	Comparisons map[string]fanoutComparison `json:"comparisons"`
	Phases      map[string]fanoutPhase      `json:"phases"`
	SeriesStart map[string]float64          `json:"seriesStart"`
}

// fanoutConfig is the workload's part of the flags.
type fanoutConfig struct {
	Sockets     []int         `json:"sockets"`
	Rate        float64       `json:"eventsPerSec"`
	Reach       int           `json:"subscribersPerEvent"`
	Duration    time.Duration `json:"-"`
	Warmup      time.Duration `json:"-"`
	Drain       time.Duration `json:"-"`
	Publishers  int           `json:"publishers"`
	PublishKeys int           `json:"publishKeys"`
	Dial        int           `json:"dialConcurrency"`
	KafkaScript string        `json:"kafkaScript"`
	Node        string        `json:"node"`
	PeerScript  string        `json:"peerScript"`
	PeerModules string        `json:"peerModules"`
	// ProfileDir, when set, receives carehub's heap and goroutine profiles once its sockets
	// subscribed and its CPU profile over the measured load (pprof, from --debug-addr).
	ProfileDir  string `json:"profileDir,omitempty"`
	DurationS   string `json:"duration"`
	WarmupS     string `json:"warmup"`
	DrainS      string `json:"drain"`
	socketsFlag string
}

// fanoutTarget is the server whose sockets a phase opens.
type fanoutTarget struct {
	name  string
	wsURL string
	pid   int
	// subscriptions is the server's count of running subscriptions.
	subscriptions func(context.Context) (float64, error)
	// runtime is what the server's runtime counts of itself (bytes, goroutines), and heap the
	// names of it that sum to the memory it holds for objects and stacks: Go's heap and stacks
	// in use (carehub), V8's heap and the memory outside it its objects hold (the peer).
	runtime func(context.Context) (map[string]float64, error)
	heap    []string
}

type fanoutRunner struct {
	cfg       fanoutConfig
	quiet     bool
	carehub   *server
	kafka     *kafkaBroker
	node      *wsfleet.Node
	tenant    wsfleet.Tenant
	subKey    string
	publisher wsfleet.Sender
	debugAddr string // carehub's pprof, when profiles are asked for
}

// profile saves carehub's pprof profile name (heap, goroutine, profile?seconds=…) as file in
// the profile dir; a failure is reported, not fatal.
func (r *fanoutRunner) profile(ctx context.Context, name, file string) {
	if r.debugAddr == "" {
		return
	}
	err := func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.debugAddr+"/debug/pprof/"+name, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		f, err := os.Create(filepath.Join(r.cfg.ProfileDir, file))
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, resp.Body); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}()
	if err != nil {
		fmt.Fprintf(os.Stderr, "peerbench: carehub profile %s: %v\n", name, err)
	}
}

func runFanout(ctx context.Context, cfg fanoutConfig, carehubBin string, results string, quiet bool, v *verdicts) error {
	started := time.Now()
	maxN := slices.Max(cfg.Sockets)
	// The client holds every socket and carehub serves at most half its open-file limit as HTTP
	// connections (--http-max-conns); the limit is inherited by the servers started here.
	limit, raiseErr := raiseOpenFiles(uint64(4*maxN + 8192))
	// carehub keeps its HTTP connections to half its descriptors, less an overflow band
	// (cmd/carehub/node/limits.go): about limit/2 × 16/17 sockets.
	serves := int(limit/2) * 16 / 17
	fits := func(n int) bool { return n+cfg.Publishers+64 <= serves }
	fmt.Fprintf(os.Stderr, "peerbench: fan-out: open-file limit %d (carehub serves about %d connections with it)\n", limit, serves)
	if raiseErr != nil {
		fmt.Fprintln(os.Stderr, "peerbench: fan-out: could not raise the open-file limit:", raiseErr)
	}

	fmt.Fprintln(os.Stderr, "peerbench: fan-out: starting Apache Kafka (deploy/local/kafka/kafka.sh up)")
	kb, err := startKafka(ctx, cfg.KafkaScript, prefixWriter(os.Stderr, "  "))
	if err != nil {
		return err
	}
	defer kb.Close()
	fmt.Fprintf(os.Stderr, "peerbench: fan-out: Kafka at %s\n", kb.addr)

	dir, err := os.MkdirTemp("/tmp", "carehub-peerbench-fanout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ops := strconv.Itoa(maxN + 1000)
	var debugAddr string
	if cfg.ProfileDir != "" {
		if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
			return err
		}
		port, err := freePort()
		if err != nil {
			return err
		}
		debugAddr = fmt.Sprintf("127.0.0.1:%d", port)
	}
	args := []string{"--kafka-brokers", kb.addr, "--rate-per-key", "100000", "--rate-per-org", "100000",
		"--http-max-conns", strconv.Itoa(maxN + 2000),
		"--ws-max-sockets-per-key", ops, "--ws-max-sockets-per-org", ops,
		"--ws-max-operations", ops, "--ws-max-operations-per-key", ops, "--ws-max-operations-per-org", ops}
	if debugAddr != "" {
		args = append(args, "--debug-addr", debugAddr)
	}

	sum := fanoutSummary{Config: cfg, Comparisons: map[string]fanoutComparison{}, Phases: map[string]fanoutPhase{}, SeriesStart: map[string]float64{},
		Servers: map[string]string{
			"carehub": "carehub serve " + carehubBin + " on Apache Kafka (deploy/local/kafka, this run's own broker) and its embedded PostgreSQL; " + strings.Join(args, " "),
			"peer": "graphql-ws 6.4.2 + graphql 16.15.0 + ws 8.23.0 + kafkajs 2.2.4 on " + nodeVersion(cfg.Node) +
				" (loadtest/peers/graphqlws/server.cjs, NODE_ENV=production, graphql-ws keep-alive 12 s, kafkajs consumer group of its own from the end, maxWaitTimeInMs 100, readUncommitted, eachBatch, autoCommit (its default), Snappy by kafkajs-snappy 1.1.0; subscriptions indexed by project and type, queue of 256 events each)",
		},
		Notes: []string{
			"one Apache Kafka broker (deploy/local/kafka/kafka.sh, its own ports and state) for both servers: carehub's embedded broker (kfake) is in carehub's process, where its CPU and memory would count as carehub's, and kafkajs cannot authenticate to it (kfake answers a SASL handshake with an empty mechanism list)",
			"one server loaded at a time: per socket count carehub is started afresh (same data dir), loaded, then the peer is started and loaded while carehub publishes; events are always published through carehub's publishEvent (test-mode keys), so both servers read the same records of carehub.events.v1",
			"latency: publish call start (the payload's sentAt) → the frame read by the socket's reader, in this process; every socket reads in its own goroutine",
			"memory: VmRSS of the server process (/proc) before the sockets, once all subscribed (+2 s), and after the load; per socket: the growth ÷ sockets. carehub's sockets and its publish path share one process: it publishes for a few seconds before its sockets connect, so the baseline holds the publish path",
			"CPU: user + system of the server process over publishing and draining, per 1,000 deliveries; carehub's net figure subtracts the CPU per second its process used in the peer's phase (the same publishing, no sockets)",
			"carehub shares one execution between identical subscriptions of one key (the fleet's sockets of one type group); graphql-ws executes every subscription on its own, as it does for its users",
			"the peer authenticates nothing, checks no tenancy and redacts nothing; carehub checks the key at connection_init and the project at subscribe, the payload's patient data for each execution, and every socket's credential again each second (a revoked key's sockets close within a second), and pings each socket every 15 s (graphql-ws: 12 s)",
			"the broker is started for the run: its JIT warm-up falls mostly in the first phase (carehub's); its CPU is given per phase (kafkaCpuSec) and counted for neither server",
			"Node runs the peer's JavaScript on one thread, Go carehub's on both cores: on this shared 2-core machine a stall of that thread (GC, the scheduler giving the core to another process) delays every socket at once",
		},
	}
	// A first start makes the database (migrations, demo data) and the keys; every measured
	// start then finds them, so no start carries the seeding's memory into its baseline.
	fmt.Fprintln(os.Stderr, "peerbench: fan-out: first carehub start (database, demo data, keys)")
	ch, err := startCarehubIn(ctx, carehubBin, dir, args)
	if err != nil {
		return err
	}
	// Test mode keeps the HIPAA audit of every call out of the measurement; the subscribers'
	// key needs no scope (eventStream), the publishers' exec:workflows.
	subKey, err := ch.createKey(ctx, access.Test, nil)
	var pubKeys []string
	for range cfg.PublishKeys {
		if err != nil {
			break
		}
		var k string
		k, err = ch.createKey(ctx, access.Test, []string{access.ExecWorkflows})
		pubKeys = append(pubKeys, k)
	}
	ch.Close()
	if err != nil {
		return err
	}

	var series []report.Point
	var offset float64
	var failures []error
	for _, n := range cfg.Sockets {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !fits(n) {
			// The largest thousand that fits is run instead, and said so: a bench that
			// always fails where the hard limit cannot be raised measures nothing.
			asked := n
			n = (serves - cfg.Publishers - 64) / 1000 * 1000
			if n < 1000 {
				err := fmt.Errorf("%d sockets: not run: with an open-file limit of %d carehub serves about %d connections (raise the hard limit: ulimit -Hn, as root with CAP_SYS_RESOURCE)", asked, limit, serves)
				fmt.Fprintln(os.Stderr, "peerbench: fan-out:", err)
				sum.Notes = append(sum.Notes, err.Error())
				failures = append(failures, err)
				continue
			}
			note := fmt.Sprintf("%d sockets asked, %d run: the open-file limit is %d and could not be raised (%v), and carehub serves HTTP connections on half its descriptors less an overflow band, about %d here",
				asked, n, limit, raiseErr, serves)
			fmt.Fprintln(os.Stderr, "peerbench: fan-out:", note)
			sum.Notes = append(sum.Notes, note)
		}
		fmt.Fprintf(os.Stderr, "peerbench: fan-out %d sockets: starting carehub\n", n)
		ch, err := startCarehubIn(ctx, carehubBin, dir, args)
		if err != nil {
			return err
		}
		res, err := runFanoutSockets(ctx, cfg, ch, kb, subKey, pubKeys, n, quiet, debugAddr)
		ch.Close()
		for _, ph := range res {
			key := fmt.Sprintf("%s n=%d", ph.Server, n)
			sum.Phases[key] = ph
			sum.SeriesStart[key] = offset
			prev := 0.0
			for _, p := range ph.points {
				short := p.Seconds-prev < 0.5 && prev > 0
				prev = p.Seconds
				if short {
					continue
				}
				p.Seconds += offset
				series = append(series, p)
			}
			offset += ph.Seconds
		}
		if err != nil {
			failures = append(failures, err)
			continue
		}
		sum.Comparisons[fmt.Sprintf("fanout n=%d", n)] = compareFanout(res[0], res[1], cfg.Rate)
	}
	printFanout(os.Stdout, sum)
	path, err := report.Write(results, report.Report{Scenario: "peers-ws-fanout", Started: started, Unit: "messages/s",
		LagName: "messages not yet delivered", Summary: sum, Series: series})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "peerbench: report %s (charts: %s)\n", path, report.ChartsCommand(path))
	v.add(fanoutVerdicts(sum, path)...)
	return errors.Join(failures...)
}

// runFanoutSockets is one socket count: carehub's phase, then the peer's.
func runFanoutSockets(ctx context.Context, cfg fanoutConfig, ch *server, kb *kafkaBroker, subKey string, pubKeys []string, n int, quiet bool, debugAddr string) ([]fanoutPhase, error) {
	r := &fanoutRunner{cfg: cfg, quiet: quiet, carehub: ch, kafka: kb, subKey: subKey, node: wsfleet.NewNode(ch.origin, cfg.Publishers+8), debugAddr: debugAddr}
	setup, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var err error
	if r.tenant, err = r.node.Tenant(setup, pubKeys[0], nil); err != nil {
		return nil, err
	}
	r.publisher = &wsfleet.GraphQLSender{Node: r.node, Keys: pubKeys}
	defer r.publisher.Close()

	// carehub's publish path (HTTP, GraphQL, producer, its consumers) warms up and takes its
	// memory before carehub's baseline is read.
	idle := wsfleet.NewPlan(r.tenant.OrgID, r.tenant.Projects, 1)
	pre := &wsfleet.Publisher{Plan: idle, Sender: r.publisher, Workers: cfg.Publishers}
	pre.Run(ctx, cfg.Rate, 3*time.Second)
	if pre.OK.Load() == 0 {
		return nil, fmt.Errorf("carehub: no publishEvent succeeded: %s", pre.FirstError())
	}

	var out []fanoutPhase
	chPhase, err := r.phase(ctx, fanoutTarget{name: "carehub", wsURL: "ws" + ch.origin[len("http"):] + "/graphql", pid: ch.pid,
		subscriptions: func(ctx context.Context) (float64, error) {
			m, err := r.node.Metrics(ctx, ch.origin+"/metrics", "carehub_graphql_subscriptions")
			return m["carehub_graphql_subscriptions"], err
		},
		runtime: func(ctx context.Context) (map[string]float64, error) {
			return r.node.Metrics(ctx, ch.origin+"/metrics", "go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines")
		},
		heap: []string{"go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes"}}, n)
	out = append(out, chPhase)
	if err != nil {
		return out, fmt.Errorf("carehub, %d sockets: %w", n, err)
	}

	fmt.Fprintf(os.Stderr, "peerbench: fan-out %d sockets: starting the graphql-ws peer\n", n)
	peer, err := startGraphQLWS(ctx, cfg.Node, cfg.PeerScript, cfg.PeerModules, kb.addr, kafka.DefaultTopics().Events, prefixWriter(os.Stderr, "  peer: "))
	if err != nil {
		return out, err
	}
	defer peer.Close()
	peerPhase, err := r.phase(ctx, fanoutTarget{name: "graphql-ws", wsURL: peer.wsURL, pid: peer.pid,
		subscriptions: func(ctx context.Context) (float64, error) {
			st, err := peer.stats(ctx)
			return float64(st.Subscriptions), err
		},
		runtime: func(ctx context.Context) (map[string]float64, error) {
			st, err := peer.stats(ctx)
			return map[string]float64{"heapTotal_bytes": st.Memory.HeapTotal, "heapUsed_bytes": st.Memory.HeapUsed,
				"external_bytes": st.Memory.External}, err
		},
		heap: []string{"heapTotal_bytes", "external_bytes"}}, n)
	out = append(out, peerPhase)
	if err != nil {
		return out, fmt.Errorf("graphql-ws peer, %d sockets: %w", n, err)
	}
	// carehub's publish path per second, from the peer's phase, out of carehub's own figure.
	if chPhase.Delivered > 0 && peerPhase.Seconds > 0 {
		publishing := peerPhase.CarehubCPUSec / peerPhase.Seconds * chPhase.Seconds
		out[0].CarehubNetCPUPer1000 = max(0, chPhase.CPUSec-publishing) * 1000 / float64(chPhase.Delivered)
	}
	return out, nil
}

// phase opens n sockets to t, waits until t runs their subscriptions, warms up, publishes at
// the configured rate for the configured time, drains, and closes the sockets.
func (r *fanoutRunner) phase(ctx context.Context, t fanoutTarget, n int) (fanoutPhase, error) {
	cfg := r.cfg
	projects := r.tenant.Projects
	groups := max(1, int(math.Round(float64(n)/float64(len(projects)*cfg.Reach))))
	ph := fanoutPhase{Server: t.name, Sockets: n, Groups: groups, SubscribersPerEvent: float64(n) / float64(len(projects)*groups)}
	before, err := t.subscriptions(ctx)
	if err != nil {
		return ph, err
	}
	ph.RSSBeforeMiB = procRSS(t.pid) / (1 << 20)
	if ph.RuntimeBefore, err = t.runtime(ctx); err != nil {
		return ph, err
	}

	f := wsfleet.New(t.wsURL, r.subKey)
	readCtx, stopReading := context.WithCancel(context.Background())
	defer func() {
		stopReading()
		f.Close(cfg.Dial)
	}()
	plan := wsfleet.NewPlan(r.tenant.OrgID, projects, groups)
	connStart := time.Now()
	var failed atomic.Int64
	var firstErr atomic.Value
	sem := make(chan struct{}, cfg.Dial)
	var wg sync.WaitGroup
	for i := range n {
		project, types := plan.Assign(i)
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return ph, ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := f.Connect(dctx, readCtx, project, types); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			}
		})
	}
	wg.Wait()
	ph.ConnectSeconds, ph.ConnectFailed, ph.Handshake = time.Since(connStart).Seconds(), failed.Load(), f.Handshake.Summary()
	if e, ok := firstErr.Load().(string); ok {
		ph.FirstConnectError = e
	}
	fmt.Fprintf(os.Stderr, "peerbench: fan-out %s: %d sockets open in %.1fs (%d failed), %d type groups, %.1f subscribers per event\n",
		t.name, f.Open.Load(), ph.ConnectSeconds, ph.ConnectFailed, groups, ph.SubscribersPerEvent)
	if ph.ConnectFailed > 0 {
		// The plan counted the failed sockets as listeners: the expected figure would be wrong.
		return ph, fmt.Errorf("%d sockets failed, first: %s", ph.ConnectFailed, ph.FirstConnectError)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, err := t.subscriptions(ctx)
		if err != nil {
			return ph, err
		}
		if got >= before+float64(n) {
			break
		}
		if time.Now().After(deadline) {
			return ph, fmt.Errorf("only %.0f of %d subscriptions running after 2 minutes", got-before, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	ph.RSSConnectedMiB = procRSS(t.pid) / (1 << 20)
	if ph.RuntimeConnected, err = t.runtime(ctx); err != nil {
		return ph, err
	}
	ph.RuntimePerSocket = map[string]float64{}
	for k, v := range ph.RuntimeConnected {
		ph.RuntimePerSocket[k] = (v - ph.RuntimeBefore[k]) / float64(n)
	}
	for _, k := range t.heap {
		ph.HeapKiBPerSocket += ph.RuntimePerSocket[k] / 1024
	}
	if t.pid == r.carehub.pid {
		r.profile(ctx, "heap?gc=1", fmt.Sprintf("carehub-heap-n%d.pb.gz", n))
		r.profile(ctx, "goroutine", fmt.Sprintf("carehub-goroutine-n%d.pb.gz", n))
	}

	if err := wsfleet.WarmUp(ctx, f, plan, r.publisher, 30*time.Second); err != nil {
		return ph, err
	}
	if cfg.Warmup > 0 {
		warm := &wsfleet.Publisher{Plan: plan, Sender: r.publisher, Workers: cfg.Publishers}
		warm.Run(ctx, cfg.Rate, cfg.Warmup)
		for end := time.Now().Add(cfg.Drain); f.Received.Load() < warm.Expected.Load() && time.Now().Before(end) && ctx.Err() == nil; {
			time.Sleep(50 * time.Millisecond)
		}
		f.Reset()
	}

	pub := &wsfleet.Publisher{Plan: plan, Sender: r.publisher, Workers: cfg.Publishers}
	rec := report.NewRecorder(report.Options{Unit: "messages/s", LagName: "messages not yet delivered", Quiet: r.quiet,
		Lag: func() float64 { return float64(max(0, pub.Expected.Load()-f.Received.Load())) }})
	pub.Rec, f.Rec = rec, rec
	cpu0, _ := procCPU(t.pid, false)
	ch0, _ := procCPU(r.carehub.pid, false)
	kafka0, _ := procCPU(r.kafka.pid, true)
	machine0, self0 := machineBusy(), loadcli.ProcessCPU()
	start := time.Now()
	var profiling sync.WaitGroup
	if t.pid == r.carehub.pid {
		profiling.Go(func() {
			r.profile(ctx, fmt.Sprintf("profile?seconds=%d", max(1, int(cfg.Duration.Seconds()))), fmt.Sprintf("carehub-cpu-n%d.pb.gz", n))
		})
	}
	defer profiling.Wait()
	rec.Start()
	elapsed := pub.Run(ctx, cfg.Rate, cfg.Duration)
	for end := time.Now().Add(cfg.Drain); f.Received.Load() < pub.Expected.Load() && time.Now().Before(end) && ctx.Err() == nil; {
		time.Sleep(20 * time.Millisecond)
	}
	ph.points = rec.Stop()
	ph.Seconds = time.Since(start).Seconds()
	cpu1, _ := procCPU(t.pid, false)
	ch1, _ := procCPU(r.carehub.pid, false)
	kafka1, _ := procCPU(r.kafka.pid, true)
	self := (loadcli.ProcessCPU() - self0).Seconds()
	ph.RSSAfterMiB = procRSS(t.pid) / (1 << 20)
	if ph.RuntimeAfter, err = t.runtime(ctx); err != nil {
		return ph, err
	}
	ph.RuntimePerSocketAfter = map[string]float64{}
	for k, v := range ph.RuntimeAfter {
		ph.RuntimePerSocketAfter[k] = (v - ph.RuntimeBefore[k]) / float64(n)
	}
	if t.pid == r.carehub.pid {
		r.profile(ctx, "heap?gc=1", fmt.Sprintf("carehub-heap-after-n%d.pb.gz", n))
	}

	ph.Published, ph.PublishFailed, ph.RateLimited, ph.FirstPublishError = pub.OK.Load(), pub.Failed.Load(), pub.Limited.Load(), pub.FirstError()
	ph.PublishRate, ph.PublishCall = float64(ph.Published)/elapsed.Seconds(), pub.Call.Summary()
	ph.Expected, ph.Delivered = pub.Expected.Load(), f.Received.Load()
	ph.Rate, ph.FromCall, ph.FromEvent, ph.Ended = float64(ph.Delivered)/ph.Seconds, f.FromCall.Summary(), f.FromEvent.Summary(), f.Ended()
	ph.KiBPerSocket = (ph.RSSConnectedMiB - ph.RSSBeforeMiB) * 1024 / float64(n)
	ph.KiBPerSocketAfter = (ph.RSSAfterMiB - ph.RSSBeforeMiB) * 1024 / float64(n)
	ph.CPUSec, ph.CarehubCPUSec, ph.KafkaCPUSec, ph.ClientCPUSec = (cpu1 - cpu0).Seconds(), (ch1 - ch0).Seconds(), (kafka1 - kafka0).Seconds(), self
	if ph.Delivered > 0 {
		ph.CPUPer1000 = ph.CPUSec * 1000 / float64(ph.Delivered)
	}
	if m := machineBusy(); m > 0 && machine0 > 0 {
		other := (m - machine0).Seconds() - ph.CarehubCPUSec - ph.KafkaCPUSec - self
		if t.pid != r.carehub.pid {
			other -= ph.CPUSec
		}
		ph.OtherCPUSec = max(0, other)
	}
	fmt.Fprintf(os.Stderr, "peerbench: fan-out %-10s n=%-6d %6.0f msgs/s, %d of %d delivered; publish → received p50 %.1f ms p99 %.1f ms; RSS +%.1f KiB/socket (+%.1f after the load; heap +%.1f); CPU %.2f s (%.3f s per 1,000); carehub %.2f s, Kafka %.2f s, client %.2f s, rest of machine %.2f s\n",
		t.name, n, ph.Rate, ph.Delivered, ph.Expected, ph.FromCall.P50, ph.FromCall.P99, ph.KiBPerSocket, ph.KiBPerSocketAfter, ph.HeapKiBPerSocket,
		ph.CPUSec, ph.CPUPer1000, ph.CarehubCPUSec, ph.KafkaCPUSec, ph.ClientCPUSec, ph.OtherCPUSec)
	if ph.PublishFailed > 0 || ph.RateLimited > 0 {
		fmt.Fprintf(os.Stderr, "    publish: %d failed, %d rate-limited, first: %s\n", ph.PublishFailed, ph.RateLimited, ph.FirstPublishError)
	}
	for k, v := range ph.Ended {
		fmt.Fprintf(os.Stderr, "    ended: %d × %s\n", v, k)
	}
	return ph, nil
}

func compareFanout(c, p fanoutPhase, rate float64) fanoutComparison {
	cmp := fanoutComparison{Sockets: c.Sockets, SubscribersPerEvent: c.SubscribersPerEvent, EventsPerSec: rate,
		CarehubP50Ms: c.FromCall.P50, CarehubP99Ms: c.FromCall.P99, PeerP50Ms: p.FromCall.P50, PeerP99Ms: p.FromCall.P99,
		RatioP50: ratio(c.FromCall.P50, p.FromCall.P50), RatioP99: ratio(c.FromCall.P99, p.FromCall.P99),
		CarehubDelivered: c.Delivered, CarehubExpected: c.Expected, PeerDelivered: p.Delivered, PeerExpected: p.Expected,
		CarehubKiBPerSocket: c.KiBPerSocket, PeerKiBPerSocket: p.KiBPerSocket, RatioMemory: ratio(c.KiBPerSocket, p.KiBPerSocket),
		CarehubKiBPerSocketAfter: c.KiBPerSocketAfter, PeerKiBPerSocketAfter: p.KiBPerSocketAfter,
		RatioMemoryAfter:        ratio(c.KiBPerSocketAfter, p.KiBPerSocketAfter),
		CarehubHeapKiBPerSocket: c.HeapKiBPerSocket, PeerHeapKiBPerSocket: p.HeapKiBPerSocket,
		CarehubCPUPer1000: c.CPUPer1000, CarehubNetCPUPer1000: c.CarehubNetCPUPer1000, PeerCPUPer1000: p.CPUPer1000,
		RatioCPU: ratio(c.CarehubNetCPUPer1000, p.CPUPer1000), RatioCPUGross: ratio(c.CPUPer1000, p.CPUPer1000)}
	cmp.GoalP99 = c.Delivered == c.Expected && c.FromCall.P99 <= p.FromCall.P99
	cmp.GoalMemory = c.KiBPerSocket <= p.KiBPerSocket && c.KiBPerSocketAfter <= p.KiBPerSocketAfter
	return cmp
}

func printFanout(w io.Writer, s fanoutSummary) {
	keys := make([]string, 0, len(s.Comparisons))
	for k := range s.Comparisons {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return s.Comparisons[a].Sockets - s.Comparisons[b].Sockets })
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "sockets\tsubs/event\tevents/s\tp50 ms c/peer\tp99 ms c/peer\tp99 ratio\tdelivered c\tdelivered peer\tKiB/socket c/peer\tafter load c/peer\tmemory ratio\tCPU s/1,000 c (net)/peer\tCPU ratio net (gross)\t")
	for _, k := range keys {
		c := s.Comparisons[k]
		fmt.Fprintf(tw, "%d\t%.1f\t%.0f\t%.1f/%.1f\t%.1f/%.1f\t%.2fx\t%d/%d\t%d/%d\t%.1f/%.1f\t%.1f/%.1f\t%.2fx\t%.3f (%.3f)/%.3f\t%.2fx (%.2fx)\t\n",
			c.Sockets, c.SubscribersPerEvent, c.EventsPerSec, c.CarehubP50Ms, c.PeerP50Ms, c.CarehubP99Ms, c.PeerP99Ms, c.RatioP99,
			c.CarehubDelivered, c.CarehubExpected, c.PeerDelivered, c.PeerExpected,
			c.CarehubKiBPerSocket, c.PeerKiBPerSocket, c.CarehubKiBPerSocketAfter, c.PeerKiBPerSocketAfter, c.RatioMemory,
			c.CarehubCPUPer1000, c.CarehubNetCPUPer1000, c.PeerCPUPer1000, c.RatioCPU, c.RatioCPUGross)
	}
	_ = tw.Flush()
}

func nodeVersion(node string) string {
	out, err := exec.Command(node, "--version").Output()
	if err != nil {
		return "Node (version unknown)"
	}
	return "Node " + strings.TrimSpace(string(out))
}
