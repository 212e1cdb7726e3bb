// Command inferload measures model invocations: what carehub adds in front of an external Open
// Inference Protocol v2 server, and what its embedded ONNX Runtime does per core against
// onnxruntime's own. It starts, in this process, a carehub node on its embedded defaults with the
// demo data (as eventload -self does; data under a new directory in /tmp, removed after), and a
// real MLServer serving the demo model (processors/inference/oip/mlservertest, driven through a
// minimal testing.TB of this command's own; the venv of tests/mlserver/setup.sh), deploys the demo
// catalogue's installation of "Deterioration Risk (synthetic demo)" twice with GraphQL
// createDeployment (embedded, and with backend {oip-v2, MLServer, deterioration, 1}; replicas
// -c, at most 16), waits for both to be RUNNING, and runs its phases one after another, each for
// -d after a short warm-up, with -c clients posting batch-1 requests (one row of vital signs, the
// rows of models.DeteriorationCases in turn) on keep-alive connections. With -rounds N the HTTP
// phases (a, b, c) take turns, N of -d ÷ N each (a b a b …), and each phase's answers are pooled,
// so that a drift of the machine or of MLServer's speed falls on the baseline and on carehub alike:
//
//	a  MLServer direct: POST {mlserver}/v2/models/deterioration/versions/1/infer (the baseline)
//	b  carehub → MLServer: POST /v1/deployments/{backend deployment}/invoke, the same tensor
//	c  carehub embedded: POST /v1/deployments/{embedded deployment}/invoke, the same tensor
//	d  the runtimes alone, batch 1, one thread: onnxruntime's Python API (InferenceSession.run,
//	   intra_op_num_threads=1, from $HOME/.cache/carehub/models-venv, else the MLServer venv,
//	   whichever has onnxruntime; none is installed) on the same model file, and carehub's
//	   processors/inference/onnx (Load + Run on one goroutine locked to its thread, no HTTP)
//	e  stream scoring (stream.go; only when asked for, -only e): a createDeployment scoreStream
//	   deployment of the same installation (-stream-replicas); the rate the node stores
//	   observations at with it running (-stream-devices posting FHIR Bundles unpaced for
//	   -stream-rate-window), and the rate until their events and predictions were all in the
//	   event log; then, at -stream-fraction (80 %) of the latter for -stream-window, each
//	   observation's accept (the 202) → its deployment.prediction in the event log (issue 54:
//	   p99 ≤ 1 s), and → received on a GraphQL eventStream subscription over WebSocket
//
// The report (stdout; JSON with -out, in loadtest/report's format: the figures below as its
// summary, the HTTP phases' second-by-second series laid end to end) gives each phase's
// requests/s, latency p50/p99/max, errors and refusals (429/503), the CPU this process (node and
// clients) and MLServer used, the machine's busy and stolen time; and the figures:
// b ÷ a throughput (target ≥ 0.9), b − a latency (added p99 target ≤ 2 ms) and b's own time per
// request (each answer's latency less its Server-Timing backend;dur), and runs per CPU
// second: embedded invocations (c: the node's whole HTTP path, and the clients, which share this
// process) and onnx.Run alone, each against onnxruntime's.
//
//	go run ./loadtest/cmd/inferload -d 20s -c 4 -out /tmp/inferload.json
//	go run ./loadtest/cmd/inferload -d 5s -only a,b
//	go run ./loadtest/cmd/inferload -d 60s -rounds 6 -only a,b          # b ÷ a and b − a, interleaved
//	go run ./loadtest/cmd/inferload -only e -stream-rate-window 20s -stream-window 30s
//
// Rate limits: the node is started with --rate-per-key and --rate-per-org raised to 1,000,000/s
// (node.Config.RatePerKey, RatePerOrg), and each client has a key of its own (live, exec:agents,
// read:patients, read:observations), so no phase measures the limiter. Loopback backends need
// node.Config.WebhooksAllowPrivate, which it also sets. Everything listens on loopback only.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"carehub/cmd/carehub/node"
	"carehub/e2e/pipelinetest"
	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/loadtest"
	"carehub/loadtest/loadcli"
	loadreport "carehub/loadtest/report"
	"carehub/models"
	"carehub/processors/inference/oip/mlservertest"
	"carehub/processors/inference/onnx"
	"carehub/storage/demo"
	"carehub/storage/postgres"
)

// phases in the order they run.
var phases = []struct{ id, name, label string }{
	{"a", "mlserver", "MLServer direct (OIP v2)"},
	{"b", "backend", "carehub → MLServer"},
	{"c", "embedded", "carehub embedded ONNX"},
	{"d", "onnxruntime", "runtimes alone, 1 thread"},
	{"e", "stream", "stream scoring"},
}

// Bounds: the tool must not run away.
const (
	maxDuration = 10 * time.Minute
	maxClients  = 64
	maxRounds   = 100
	// liftedRate is the per-key and per-organization rate the node is started with.
	liftedRate = 1_000_000
)

type config struct {
	Duration time.Duration
	Clients  int
	Rounds   int
	Out      string
	Only     map[string]bool // phase ids
	Quiet    bool
	Stream   streamConfig // phase e
}

func main() { os.Exit(inferload()) }

func inferload() int {
	var cfg config
	var only string
	flag.DurationVar(&cfg.Duration, "d", 20*time.Second, "length of each phase (after a warm-up of a quarter of it, at most 2 s)")
	flag.IntVar(&cfg.Clients, "c", 4, "concurrent clients of the HTTP phases (also the deployments' replicas, at most 16)")
	flag.IntVar(&cfg.Rounds, "rounds", 1, "run the HTTP phases (a, b, c) this many times in turn (a b c a b c …), each for -d ÷ rounds, their answers pooled: drift in the machine or MLServer then falls on every phase alike")
	flag.StringVar(&cfg.Out, "out", "", "write the report as JSON to this file (- for stdout)")
	flag.StringVar(&only, "only", "a,b,c,d", "phases to run, comma-separated: a (or mlserver), b (backend), c (embedded), d (onnxruntime), e (stream)")
	flag.BoolVar(&cfg.Quiet, "quiet", false, "no progress line on stderr")
	cpuProfile := flag.String("cpuprofile", "", "write this process's CPU profile (the node and the clients) over the whole run to this file")
	cfg.Stream.flags(flag.CommandLine)
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "inferload:", err)
			return 2
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	var err error
	if cfg.Only, err = parseOnly(only); err == nil {
		err = cfg.validate()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "inferload:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	started := time.Now()
	rep, err := run(ctx, cfg, os.Stderr)
	if rep != nil {
		rep.Print(os.Stdout)
		if cfg.Out != "" {
			if werr := writeReport(cfg.Out, started, rep); werr != nil && err == nil {
				err = werr
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "inferload:", err)
		return 1
	}
	return 0
}

func parseOnly(list string) (map[string]bool, error) {
	out := map[string]bool{}
	for p := range strings.SplitSeq(list, ",") {
		p = strings.TrimSpace(strings.ToLower(p))
		if p == "" {
			continue
		}
		found := false
		for _, ph := range phases {
			if p == ph.id || p == ph.name {
				out[ph.id], found = true, true
			}
		}
		if !found {
			return nil, fmt.Errorf("-only: unknown phase %q (a|mlserver, b|backend, c|embedded, d|onnxruntime, e|stream)", p)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("-only: no phase")
	}
	return out, nil
}

func (c *config) validate() error {
	var errs []error
	if c.Duration < 100*time.Millisecond || c.Duration > maxDuration {
		errs = append(errs, fmt.Errorf("-d %v: must be 100ms..%v", c.Duration, maxDuration))
	}
	if c.Clients < 1 || c.Clients > maxClients {
		errs = append(errs, fmt.Errorf("-c %d: must be 1..%d", c.Clients, maxClients))
	}
	if c.Rounds < 1 || c.Rounds > maxRounds || c.Duration/time.Duration(max(c.Rounds, 1)) < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("-rounds %d: must be 1..%d, and -d ÷ rounds at least 100ms", c.Rounds, maxRounds))
	}
	errs = append(errs, c.Stream.validate())
	return errors.Join(errs...)
}

// warmup is the unmeasured load before each phase: connections, MLServer's and the runtime's
// first calls, the node's caches.
func (c *config) warmup() time.Duration { return min(c.Duration/4, 2*time.Second) }

// run starts what the phases need, runs them and returns the report (also when it ends early
// with an error, with the phases done).
func run(ctx context.Context, cfg config, logw io.Writer) (*report, error) {
	rep := &report{Duration: cfg.Duration.String(), Rounds: cfg.Rounds, Clients: cfg.Clients, Cores: runtime.NumCPU(), Replicas: min(cfg.Clients, 16),
		MLServerModel: mlservertest.Model, MLServerVersion: "1"}
	cases, _ := models.DeteriorationCases()
	bodies := make([][]byte, len(cases))
	for i, c := range cases {
		bodies[i], _ = json.Marshal(map[string]any{"inputs": []any{map[string]any{"name": "vitals", "shape": []int{1, 5}, "datatype": "FP32", "data": c.Input}}})
	}
	machine := loadtest.StartMachineWindow()
	defer func() {
		if busy, steal, ok := machine.End(); ok {
			rep.MachineBusyPct, rep.MachineStealPct = busy, steal
		}
	}()

	var ml *mlservertest.Server
	if cfg.Only["a"] || cfg.Only["b"] {
		fmt.Fprintln(logw, "inferload: starting MLServer (mlservertest)")
		shim := &tbShim{log: logw}
		defer shim.cleanup()
		var err error
		if ml, err = startMLServer(shim); err != nil {
			return rep, err
		}
		rep.MLServerURL = ml.URL
	}
	var n *selfNode
	if cfg.Only["b"] || cfg.Only["c"] || cfg.Only["e"] {
		fmt.Fprintln(logw, "inferload: starting a carehub node (embedded defaults, demo data)")
		var err error
		if n, err = startNode(ctx, cfg.Clients); err != nil {
			return rep, err
		}
		defer n.Close()
		rep.NodeURL = n.URL
	}
	hc := loadcli.HTTPClient(cfg.Clients)
	defer hc.CloseIdleConnections()
	var backendDep, embeddedDep string
	if n != nil {
		var err error
		if backendDep, embeddedDep, err = deploy(ctx, n, hc, cfg, ml); err != nil {
			return rep, err
		}
		rep.BackendDeployment, rep.EmbeddedDeployment = backendDep, embeddedDep
	}

	mlPID := 0
	if ml != nil {
		mlPID = childNamed("mlserver")
	}
	var targets []target // the HTTP phases, a b c; d and e come after them
	for _, ph := range phases[:3] {
		if !cfg.Only[ph.id] {
			continue
		}
		t := target{id: ph.id, name: ph.name, label: ph.label, bodies: bodies, mlPID: mlPID}
		switch ph.id {
		case "a":
			t.url, t.check = ml.URL+"/v2/models/"+mlservertest.Model+"/versions/1/infer", checkOIP
		case "b":
			t.url, t.keys, t.check = n.URL+"/v1/deployments/"+backendDep+"/invoke", n.Keys, checkInvoke("oip-v2")
		case "c":
			t.url, t.keys, t.check = n.URL+"/v1/deployments/"+embeddedDep+"/invoke", n.Keys, checkInvoke("onnx")
		}
		targets = append(targets, t)
	}
	if err := runPhases(ctx, cfg, hc, targets, rep, logw); err != nil {
		return rep, err
	}
	if cfg.Only["d"] && ctx.Err() == nil {
		fmt.Fprintf(logw, "inferload: phase d (%s) for %v each: onnxruntime (Python), then onnx.Run (Go)\n", phases[3].label, cfg.Duration)
		rep.ORT = runPython(ctx, cfg)
		rep.GoONNX = runGoONNX(ctx, cfg)
	}
	if cfg.Only["e"] && ctx.Err() == nil {
		fmt.Fprintf(logw, "inferload: phase e (%s): a scoreStream deployment of %d replicas; stored rate over %v unpaced, then accept → prediction at %.0f %% of it over %v\n",
			phases[4].label, cfg.Stream.Replicas, cfg.Stream.RateWindow, 100*cfg.Stream.Fraction, cfg.Stream.Window)
		rep.Stream = runStream(ctx, n, cfg.Stream, logw)
	}
	rep.ratios()
	return rep, ctx.Err()
}

// tbShim is the testing.TB that mlservertest.Start needs, for a command: only the methods
// mlservertest calls (Helper, Logf, Fatal, Fatalf, Cleanup) are implemented; the embedded nil
// TB makes any other panic. Fatal panics with a tbFatal, which startMLServer recovers as an error.
type tbShim struct {
	testing.TB
	log      io.Writer
	cleanups []func()
}

type tbFatal struct{ msg string }

func (t *tbShim) Helper()                   {}
func (t *tbShim) Logf(f string, a ...any)   { fmt.Fprintf(t.log, f+"\n", a...) }
func (t *tbShim) Fatalf(f string, a ...any) { panic(tbFatal{fmt.Sprintf(f, a...)}) }
func (t *tbShim) Fatal(a ...any)            { panic(tbFatal{fmt.Sprint(a...)}) }
func (t *tbShim) Cleanup(f func())          { t.cleanups = append(t.cleanups, f) }

// cleanup runs the cleanups registered (the server's stop), last first.
func (t *tbShim) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
	t.cleanups = nil
}

func startMLServer(tb *tbShim) (s *mlservertest.Server, err error) {
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(tbFatal)
			if !ok {
				panic(r)
			}
			err = errors.New(f.msg)
		}
	}()
	return mlservertest.Start(tb), nil
}

// selfNode is the node this command starts, with one key a client.
type selfNode struct {
	URL   string
	Admin string   // every scope: createDeployment, GET /v1/deployments
	Keys  []string // exec:agents, read:patients, read:observations; one a client
	n     *node.Node
	dir   string
}

// startNode starts a node as loadtest.StartNode does (embedded defaults, demo data, no access
// log), with the rate limits lifted and loopback backends allowed.
func startNode(ctx context.Context, clients int) (_ *selfNode, err error) {
	dir, err := os.MkdirTemp("/tmp", "carehub-inferload-")
	if err != nil {
		return nil, err
	}
	// The embedded Postgres runs as user postgres when we are root: it must traverse dir.
	if err := os.Chmod(dir, 0o755); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	cfg := node.Defaults()
	cfg.DataDir, cfg.HTTPAddr, cfg.LogLevel, cfg.AccessLog = filepath.Join(dir, "node"), "127.0.0.1:0", "warn", "off"
	cfg.RatePerKey, cfg.RatePerOrg = liftedRate, liftedRate // the phases measure invocations, not the limiter
	cfg.WebhooksAllowPrivate = true                         // the backend is MLServer on loopback
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	nd, err := node.Start(ctx, cfg, logger)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start carehub: %w", err)
	}
	s := &selfNode{URL: nd.URL(), n: nd, dir: dir}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	var orgID string
	if err := nd.Pool().QueryRow(ctx, `select id from organizations where slug = $1`, demo.DemoOrgSlug).Scan(&orgID); err != nil {
		return nil, fmt.Errorf("organization %s: %w", demo.DemoOrgSlug, err)
	}
	keys := postgres.NewAPIKeys(nd.Pool())
	create := func(name string, scopes ...string) (string, error) {
		k, err := keys.Create(ctx, apikeys.NewKey{OrgID: orgID, Mode: access.Live, Name: name, Scopes: scopes})
		if err != nil {
			return "", fmt.Errorf("create key: %w", err)
		}
		return k.Secret, nil
	}
	if s.Admin, err = create("inferload admin", access.Scopes...); err != nil {
		return nil, err
	}
	for i := range clients {
		k, err := create(fmt.Sprintf("inferload client %d", i), access.ExecAgents, access.ReadPatients, access.ReadObservations)
		if err != nil {
			return nil, err
		}
		s.Keys = append(s.Keys, k)
	}
	return s, nil
}

func (s *selfNode) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = s.n.Close(ctx)
	_ = os.RemoveAll(s.dir)
}

// deploy creates the backend deployment (when MLServer runs) and the embedded one of the demo
// catalogue's installation of the deterioration model, and waits until they are RUNNING.
func deploy(ctx context.Context, n *selfNode, hc *http.Client, cfg config, ml *mlservertest.Server) (backendDep, embeddedDep string, err error) {
	admin := &pipelinetest.Client{BaseURL: n.URL, Key: n.Admin, HTTP: hc}
	project, err := loadcli.ProjectID(ctx, admin, demo.SepsisProjectName)
	if err != nil {
		return "", "", err
	}
	var installation string
	if err := n.n.Pool().QueryRow(ctx, `select i.id from installations i join assets a on a.id = i.asset_id where i.project_id = $1 and a.name = $2`,
		project, demo.DeteriorationModelName).Scan(&installation); err != nil {
		return "", "", fmt.Errorf("installation of %q in %q: %w", demo.DeteriorationModelName, demo.SepsisProjectName, err)
	}
	create := func(env string, backend map[string]any) (string, error) {
		var out struct{ CreateDeployment struct{ ID string } }
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		err := admin.GraphQL(cctx, `mutation($i: ID!, $e: String!, $r: Int, $b: InferenceBackendInput) {
  createDeployment(installationId: $i, environment: $e, replicas: $r, backend: $b) { id } }`,
			map[string]any{"i": installation, "e": env, "r": min(cfg.Clients, 16), "b": backend}, &out)
		if err != nil {
			return "", fmt.Errorf("createDeployment (%s): %w", env, err)
		}
		return out.CreateDeployment.ID, nil
	}
	var ids []string
	if ml != nil && cfg.Only["b"] {
		if backendDep, err = create("inferload-backend", map[string]any{"protocol": "oip-v2", "url": ml.URL, "model": mlservertest.Model, "version": "1"}); err != nil {
			return "", "", err
		}
		ids = append(ids, backendDep)
	}
	if cfg.Only["c"] {
		if embeddedDep, err = create("inferload-embedded", nil); err != nil {
			return "", "", err
		}
		ids = append(ids, embeddedDep)
	}
	for _, id := range ids {
		if err := waitRunning(ctx, admin, id); err != nil {
			return "", "", err
		}
	}
	return backendDep, embeddedDep, nil
}

func waitRunning(ctx context.Context, admin *pipelinetest.Client, id string) error {
	deadline := time.Now().Add(60 * time.Second)
	var d struct{ Status, StatusReason string }
	for {
		err := admin.REST(ctx, http.MethodGet, "/v1/deployments/"+id, nil, &d)
		if err == nil && d.Status == "RUNNING" {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("deployment %s not RUNNING after 60 s (status %q %q, last error %v)", id, d.Status, d.StatusReason, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// target is what an HTTP phase posts to.
type target struct {
	id, name, label string // the phase's
	url             string
	keys            []string // one a client in turn; none for MLServer
	bodies          [][]byte // taken in turn
	check           func([]byte) error
	mlPID           int // MLServer's process, for its CPU (0: unknown)
}

// checkOIP checks an OIP v2 answer: an output of two probabilities (predict_proba).
func checkOIP(b []byte) error {
	var r struct {
		Outputs []struct{ Data []float64 }
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.Outputs) != 1 || len(r.Outputs[0].Data) != 2 {
		return fmt.Errorf("unexpected OIP answer: %.300s", b)
	}
	return nil
}

// checkInvoke checks an invoke answer of runtime with one output tensor.
func checkInvoke(runtime string) func([]byte) error {
	return func(b []byte) error {
		var r struct {
			Runtime    string
			Prediction *struct{ Outputs []struct{ Data []float64 } }
		}
		if err := json.Unmarshal(b, &r); err != nil || r.Runtime != runtime || r.Prediction == nil || len(r.Prediction.Outputs) != 1 {
			return fmt.Errorf("unexpected invoke answer (want runtime %s): %.300s", runtime, b)
		}
		return nil
	}
}

// phase is one HTTP phase's figures. Latencies in milliseconds.
type phase struct {
	ID        string         `json:"id"`
	Name      string         `json:"name"`
	Label     string         `json:"label"`
	URL       string         `json:"url"`
	Turns     int            `json:"turns"` // measured stretches, pooled (-rounds)
	Elapsed   float64        `json:"elapsedSeconds"`
	Requests  int64          `json:"requests"` // answered 200
	PerSecond float64        `json:"requestsPerSecond"`
	Latency   loadcli.MsDist `json:"latencyMs"`
	// Own is carehub's own time per request, where the answer says the backend's
	// (Server-Timing backend;dur): the client's latency less the backend's round trip.
	Own        *loadcli.MsDist `json:"ownMs,omitempty"`
	Errors     int64           `json:"errors"`               // transport errors and answers other than 200, 429, 503
	Refused    int64           `json:"refused"`              // 429 and 503
	FirstError string          `json:"firstError,omitempty"` // the first error's, else the first refusal's answer
	// CPU in the phase, in cores (CPU seconds per second): this process (the clients, and the
	// node when it runs) and MLServer's process; per CPU second: requests ÷ this process's CPU.
	ProcessCores        float64 `json:"processCores"`
	MLServerCores       float64 `json:"mlserverCores,omitempty"`
	PerProcessCPUSecond float64 `json:"requestsPerProcessCpuSecond"`
	MachineBusyPct      float64 `json:"machineBusyPct,omitempty"`
	MachineStealPct     float64 `json:"machineStealPct,omitempty"`
	seriesStart         time.Time
	Series              []loadreport.Point `json:"series,omitempty"`
}

// runPhases runs the HTTP phases ts -rounds times in turn (a b c a b c …), each turn for
// -d ÷ -rounds, and adds each phase's figures, its turns' answers pooled, to rep. Each target's
// bodies are checked and its connections warmed before the first turn.
func runPhases(ctx context.Context, cfg config, hc *http.Client, ts []target, rep *report, logw io.Writer) error {
	if len(ts) == 0 {
		return nil
	}
	turns := make([][]turn, len(ts))
	each := cfg.Duration / time.Duration(cfg.Rounds)
	reached := len(ts) // the phases begun
	var err error
rounds:
	for round := 0; round < cfg.Rounds && ctx.Err() == nil; round++ {
		for i, t := range ts {
			if round == 0 {
				fmt.Fprintf(logw, "inferload: phase %s (%s): %d clients for %v after %v of warm-up → %s\n", t.id, t.label, cfg.Clients, cfg.Duration, cfg.warmup(), t.url)
				if werr := warm(ctx, cfg, hc, t); werr != nil {
					reached, err = i+1, fmt.Errorf("phase %s: %w", t.id, werr)
					break rounds
				}
			} else if i == 0 {
				fmt.Fprintf(logw, "inferload: round %d of %d, %v a phase\n", round+1, cfg.Rounds, each)
			}
			turns[i] = append(turns[i], measure(ctx, cfg, hc, t, each))
		}
	}
	for i, t := range ts[:reached] {
		rep.Phases = append(rep.Phases, phaseOf(t, turns[i]))
	}
	if err != nil {
		return err
	}
	return ctx.Err()
}

// warm checks that every body of t gets the answer the phase expects, then loads t unmeasured
// for the warm-up.
func warm(ctx context.Context, cfg config, hc *http.Client, t target) error {
	for i, b := range t.bodies {
		status, body, _, err := post(ctx, hc, t, i, b)
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("%d %.300s", status, body)
		}
		if err == nil {
			err = t.check(body)
		}
		if err != nil {
			return fmt.Errorf("check request: %w", err)
		}
	}
	load(ctx, cfg.warmup(), cfg.Clients, hc, t, nil)
	return ctx.Err()
}

// turn is one measured stretch of a phase.
type turn struct {
	res          loadResult
	elapsed      time.Duration
	cpu, mlCPU   time.Duration
	busy, steal  float64 // percent of the machine, over the turn
	machineKnown bool
	series       []loadreport.Point
	started      time.Time
}

// measure loads t for d and records what it took.
func measure(ctx context.Context, cfg config, hc *http.Client, t target, d time.Duration) turn {
	rec := loadreport.NewRecorder(loadreport.Options{Unit: "requests/s", Quiet: cfg.Quiet})
	cpu0, ml0 := loadcli.ProcessCPU(), treeCPU(t.mlPID)
	machine := loadtest.StartMachineWindow()
	rec.Start()
	began := time.Now()
	var tu turn
	tu.res = load(ctx, d, cfg.Clients, hc, t, rec)
	tu.elapsed = time.Since(began)
	tu.series, tu.started = rec.Stop(), rec.Started()
	tu.cpu, tu.mlCPU = loadcli.ProcessCPU()-cpu0, treeCPU(t.mlPID)-ml0
	tu.busy, tu.steal, tu.machineKnown = machine.End()
	return tu
}

// phaseOf is t's figures over its turns: answers pooled, rates and CPU over their summed time.
func phaseOf(t target, turns []turn) phase {
	p := phase{ID: t.id, Name: t.name, Label: t.label, URL: t.url, Turns: len(turns)}
	var lat, own []time.Duration
	var elapsed, cpu, ml time.Duration
	var busy, steal, known float64
	for i, tu := range turns {
		lat, own = append(lat, tu.res.latencies...), append(own, tu.res.own...)
		p.Errors, p.Refused = p.Errors+tu.res.errors, p.Refused+tu.res.refused
		if p.FirstError == "" {
			p.FirstError = tu.res.firstError
		}
		elapsed, cpu, ml = elapsed+tu.elapsed, cpu+tu.cpu, ml+tu.mlCPU
		if tu.machineKnown {
			busy, steal, known = busy+tu.busy*tu.elapsed.Seconds(), steal+tu.steal*tu.elapsed.Seconds(), known+tu.elapsed.Seconds()
		}
		if i == 0 {
			p.seriesStart = tu.started
		}
		off := tu.started.Sub(p.seriesStart).Seconds()
		for _, pt := range tu.series {
			pt.Seconds += off
			p.Series = append(p.Series, pt)
		}
	}
	if elapsed <= 0 {
		return p
	}
	p.Elapsed = elapsed.Seconds()
	p.Requests = int64(len(lat))
	p.PerSecond = float64(p.Requests) / p.Elapsed
	p.Latency = loadcli.Ms(lat)
	if len(own) > 0 {
		o := loadcli.Ms(own)
		p.Own = &o
	}
	p.ProcessCores = cpu.Seconds() / p.Elapsed
	if t.mlPID > 0 {
		p.MLServerCores = ml.Seconds() / p.Elapsed
	}
	if cpu > 0 {
		p.PerProcessCPUSecond = float64(p.Requests) / cpu.Seconds()
	}
	if known > 0 {
		p.MachineBusyPct, p.MachineStealPct = busy/known, steal/known
	}
	return p
}

type loadResult struct {
	latencies       []time.Duration
	own             []time.Duration // latency less the backend's Server-Timing, where an answer gave it
	errors, refused int64
	firstError      string
}

// load runs clients posting t's bodies for d; with rec, it records each answer.
func load(ctx context.Context, d time.Duration, clients int, hc *http.Client, t target, rec *loadreport.Recorder) loadResult {
	loadCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	results := make([]loadResult, clients)
	var wg sync.WaitGroup
	for w := range clients {
		wg.Go(func() {
			r := &results[w]
			r.latencies = make([]time.Duration, 0, 4096)
			for i := w; loadCtx.Err() == nil; i += clients {
				// A request in flight is measured to its answer, not cut by the end of the phase.
				callCtx, stop := context.WithTimeout(context.WithoutCancel(loadCtx), 30*time.Second)
				sent := time.Now()
				status, body, backend, err := post(callCtx, hc, t, w, t.bodies[i%len(t.bodies)])
				took := time.Since(sent)
				stop()
				switch {
				case err == nil && status == http.StatusOK:
					r.latencies = append(r.latencies, took)
					if backend > 0 {
						r.own = append(r.own, took-backend)
					}
					if rec != nil {
						rec.Observe(1, took)
					}
				case err == nil && (status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable):
					r.refused++
					if r.firstError == "" { // a 503 is also a backend that failed (its breaker open)
						r.firstError = fmt.Sprintf("refused: %d %.300s", status, body)
					}
					if rec != nil {
						rec.Refuse(1)
					}
				default:
					r.errors++
					if r.firstError == "" {
						if err == nil {
							err = fmt.Errorf("%d %.300s", status, body)
						}
						r.firstError = err.Error()
					}
					time.Sleep(10 * time.Millisecond) // a dead server must not make this spin
				}
			}
		})
	}
	wg.Wait()
	var out loadResult
	for _, r := range results {
		out.latencies = append(out.latencies, r.latencies...)
		out.own = append(out.own, r.own...)
		out.errors += r.errors
		out.refused += r.refused
		if out.firstError == "" {
			out.firstError = r.firstError
		}
	}
	return out
}

// post sends one request of client w and returns the answer's status and body, and the
// backend's time its Server-Timing gives (0 without one).
func post(ctx context.Context, hc *http.Client, t target, w int, body []byte) (int, []byte, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if len(t.keys) > 0 {
		req.Header.Set("Authorization", "Bearer "+t.keys[w%len(t.keys)])
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b, backendTiming(resp.Header.Get("Server-Timing")), err
}

// backendTiming reads the backend metric's duration from a Server-Timing header
// ("backend;dur=12.345", milliseconds); 0 when there is none.
func backendTiming(h string) time.Duration {
	for metric := range strings.SplitSeq(h, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(metric), ";")
		if name != "backend" {
			continue
		}
		for param := range strings.SplitSeq(params, ";") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(param), "dur="); ok {
				if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 {
					return time.Duration(ms * float64(time.Millisecond))
				}
			}
		}
	}
	return 0
}

// runtimeBench is a runtime's own figure at batch 1 on one thread: runs in Seconds (wall) and
// in CPUSeconds (the thread's, or for Python the process's).
type runtimeBench struct {
	Runtime      string  `json:"runtime"`
	Version      string  `json:"version,omitempty"`
	Runs         int64   `json:"runs"`
	Seconds      float64 `json:"seconds"`
	CPUSeconds   float64 `json:"cpuSeconds"`
	PerSecond    float64 `json:"runsPerSecond"`
	PerCPUSecond float64 `json:"runsPerCpuSecond"` // runs per core: per CPU second of the thread that ran them
	Error        string  `json:"error,omitempty"`
}

func (b *runtimeBench) rates() {
	if b.Seconds > 0 {
		b.PerSecond = float64(b.Runs) / b.Seconds
	}
	if b.CPUSeconds > 0 {
		b.PerCPUSecond = float64(b.Runs) / b.CPUSeconds
	}
}

// pythonBench times onnxruntime's InferenceSession.run at batch 1 on one intra-op thread.
const pythonBench = `
import json, sys, time
import numpy as np
import onnxruntime as ort
path, seconds, rows = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])
so = ort.SessionOptions()
so.intra_op_num_threads = 1
so.inter_op_num_threads = 1
so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
so.log_severity_level = 3
s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
name = s.get_inputs()[0].name
feeds = [{name: np.asarray([r], dtype=np.float32)} for r in rows]
k = len(feeds)
warm_end = time.perf_counter() + float(sys.argv[4])
i = 0
while time.perf_counter() < warm_end:
    s.run(None, feeds[i % k]); i += 1
n = 0
start, cpu0 = time.perf_counter(), time.process_time()
end = start + seconds
while True:
    for i in range(100):
        s.run(None, feeds[i % k])
    n += 100
    now = time.perf_counter()
    if now >= end:
        break
print(json.dumps({"runs": n, "seconds": now - start, "cpuSeconds": time.process_time() - cpu0, "version": ort.__version__}))
`

// pythonWithORT is the first venv's python that imports onnxruntime: the models venv, else the
// MLServer venv. Nothing is installed.
func pythonWithORT() (string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	mlVenv := os.Getenv("MLSERVER_VENV")
	if mlVenv == "" {
		mlVenv = filepath.Join(home, ".cache", "carehub", "mlserver-venv")
	}
	var tried []string
	for _, venv := range []string{filepath.Join(home, ".cache", "carehub", "models-venv"), mlVenv} {
		py := filepath.Join(venv, "bin", "python")
		if exec.Command(py, "-c", "import onnxruntime, numpy").Run() == nil {
			return py, nil
		}
		tried = append(tried, venv)
	}
	return "", fmt.Errorf("no venv with onnxruntime (tried %s; models/demo/requirements.txt's venv has it)", strings.Join(tried, ", "))
}

// runPython runs pythonBench on models.Deterioration (the bytes the node deploys) for cfg.Duration.
func runPython(ctx context.Context, cfg config) *runtimeBench {
	b := &runtimeBench{Runtime: "onnxruntime (Python InferenceSession.run, intra_op_num_threads=1)"}
	fail := func(err error) *runtimeBench { b.Error = err.Error(); return b }
	py, err := pythonWithORT()
	if err != nil {
		return fail(err)
	}
	f, err := os.CreateTemp("", "inferload-*.onnx")
	if err != nil {
		return fail(err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(models.Deterioration)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	cases, _ := models.DeteriorationCases()
	rows := make([][]float64, len(cases))
	for i, c := range cases {
		rows[i] = c.Input
	}
	rowsJSON, _ := json.Marshal(rows)
	cctx, cancel := context.WithTimeout(ctx, cfg.Duration+cfg.warmup()+60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, py, "-c", pythonBench, f.Name(), strconv.FormatFloat(cfg.Duration.Seconds(), 'f', -1, 64), string(rowsJSON),
		strconv.FormatFloat(cfg.warmup().Seconds(), 'f', -1, 64))
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fail(fmt.Errorf("%s: %v: %.500s", py, err, stderr.String()))
	}
	var r struct {
		Runs       int64
		Seconds    float64
		CPUSeconds float64 `json:"cpuSeconds"`
		Version    string
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
		return fail(fmt.Errorf("python output %q: %v", out, err))
	}
	b.Version, b.Runs, b.Seconds, b.CPUSeconds = r.Version, r.Runs, r.Seconds, r.CPUSeconds
	b.rates()
	return b
}

// runGoONNX times carehub's onnx.Run on one goroutine locked to its OS thread (the runtime runs
// a session's work on the calling thread), with the thread's CPU time.
func runGoONNX(ctx context.Context, cfg config) *runtimeBench {
	b := &runtimeBench{Runtime: "carehub processors/inference/onnx (Go, Load(…, 1) + Run, 1 goroutine)"}
	fail := func(err error) *runtimeBench { b.Error = err.Error(); return b }
	if err := onnx.Init(""); err != nil {
		return fail(err)
	}
	b.Version = onnx.LoadedRuntimeVersion()
	m, err := onnx.Load(models.Deterioration, 1)
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	cases, tolerance := models.DeteriorationCases()
	inputs := make([]map[string]onnx.Tensor, len(cases))
	for i, c := range cases {
		row := make([]float32, len(c.Input))
		for j, x := range c.Input {
			row[j] = float32(x)
		}
		inputs[i] = map[string]onnx.Tensor{"vitals": onnx.NewTensor(row, 1, int64(len(row)))}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	bg := context.Background() // no Done channel: Run arms no cancellation, as a benchmark's
	for i, c := range cases {
		out, err := m.Run(bg, inputs[i])
		if err != nil {
			return fail(err)
		}
		if p := out["probability"].Data; len(p) != 1 || math.Abs(float64(p[0])-c.Output) > tolerance {
			return fail(fmt.Errorf("case %s: %v, want %v", c.Name, p, c.Output))
		}
	}
	for i, warmEnd := 0, time.Now().Add(cfg.warmup()); time.Now().Before(warmEnd); i++ {
		_, _ = m.Run(bg, inputs[i%len(inputs)])
	}
	cpu0, cerr := threadCPU()
	start := time.Now()
	end := start.Add(cfg.Duration)
	for ctx.Err() == nil {
		for i := range 100 {
			if _, err := m.Run(bg, inputs[i%len(inputs)]); err != nil {
				return fail(err)
			}
		}
		b.Runs += 100
		if time.Now().After(end) {
			break
		}
	}
	b.Seconds = time.Since(start).Seconds()
	if cpu1, err := threadCPU(); err == nil && cerr == nil {
		b.CPUSeconds = (cpu1 - cpu0).Seconds()
	}
	b.rates()
	return b
}

// threadCPU is the calling OS thread's CPU time.
func threadCPU() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, err
	}
	return time.Duration(ts.Nano()), nil
}

// childNamed is the pid of this process's child whose command name is name (0: none, or not
// Linux): the MLServer mlservertest started.
func childNamed(name string) int {
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, ppid, _, ok := procStat(pid)
		if ok && ppid == self && comm == name {
			return pid
		}
	}
	return 0
}

// procStat reads /proc/pid/stat: the command name, the parent and the CPU time (user + system).
func procStat(pid int) (comm string, ppid int, cpu time.Duration, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, 0, false
	}
	s := string(b)
	lp, rp := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if lp < 0 || rp < lp {
		return "", 0, 0, false
	}
	comm = s[lp+1 : rp]
	f := strings.Fields(s[rp+1:]) // state ppid … utime (14th field of the line) stime
	if len(f) < 13 {
		return "", 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return comm, ppid, time.Duration(ut+st) * postgres.ClockTick, true
}

// treeCPU is the CPU time of pid and its live descendants (0 for pid 0).
func treeCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	entries, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	cpu := map[int]time.Duration{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, pp, c, ok := procStat(p); ok {
			parent[p], cpu[p] = pp, c
		}
	}
	var total time.Duration
	for p, c := range cpu {
		for q := p; q > 1; q = parent[q] {
			if q == pid {
				total += c
				break
			}
		}
	}
	return total
}

// report is a run's figures.
type report struct {
	Duration           string        `json:"duration"` // of each phase, its turns together
	Rounds             int           `json:"rounds"`   // turns of each HTTP phase (-rounds)
	Clients            int           `json:"clients"`
	Cores              int           `json:"cores"`
	Replicas           int           `json:"replicas"` // of each deployment
	NodeURL            string        `json:"nodeUrl,omitempty"`
	MLServerURL        string        `json:"mlserverUrl,omitempty"`
	MLServerModel      string        `json:"mlserverModel"`
	MLServerVersion    string        `json:"mlserverModelVersion"`
	BackendDeployment  string        `json:"backendDeployment,omitempty"`
	EmbeddedDeployment string        `json:"embeddedDeployment,omitempty"`
	Phases             []phase       `json:"phases"`
	ORT                *runtimeBench `json:"onnxruntime,omitempty"`
	GoONNX             *runtimeBench `json:"goOnnx,omitempty"`
	Stream             *streamBench  `json:"streamScoring,omitempty"` // phase e
	Ratios             ratios        `json:"ratios"`
	MachineBusyPct     float64       `json:"machineBusyPct,omitempty"`  // the whole run
	MachineStealPct    float64       `json:"machineStealPct,omitempty"` // the whole run
}

// ratios are the figures; zero when a phase they need did not run.
type ratios struct {
	// BackendToDirect is b ÷ a requests/s (target ≥ 0.9); AddedP50Ms, AddedP99Ms are b − a.
	BackendToDirect float64 `json:"backendToDirect,omitempty"`
	AddedP50Ms      float64 `json:"addedP50Ms,omitempty"`
	AddedP99Ms      float64 `json:"addedP99Ms,omitempty"`
	// OwnP50Ms, OwnP99Ms are b's own time per request (phase.Own): what carehub adds, measured
	// per request rather than as the difference of two runs' percentiles.
	OwnP50Ms float64 `json:"ownP50Ms,omitempty"`
	OwnP99Ms float64 `json:"ownP99Ms,omitempty"`
	// EmbeddedPerCore is c's invocations per CPU second of this process (node and clients);
	// EmbeddedToORT that ÷ onnxruntime's runs per CPU second; GoToORT onnx.Run's ÷ onnxruntime's.
	EmbeddedPerCore float64 `json:"embeddedPerCore,omitempty"`
	EmbeddedToORT   float64 `json:"embeddedToOnnxruntime,omitempty"`
	GoToORT         float64 `json:"goOnnxToOnnxruntime,omitempty"`
}

func (r *report) phase(id string) *phase {
	for i := range r.Phases {
		if r.Phases[i].ID == id && r.Phases[i].Requests > 0 {
			return &r.Phases[i]
		}
	}
	return nil
}

func (r *report) ratios() {
	a, b, c := r.phase("a"), r.phase("b"), r.phase("c")
	if a != nil && b != nil {
		r.Ratios.BackendToDirect = b.PerSecond / a.PerSecond
		r.Ratios.AddedP50Ms, r.Ratios.AddedP99Ms = b.Latency.P50-a.Latency.P50, b.Latency.P99-a.Latency.P99
	}
	if b != nil && b.Own != nil {
		r.Ratios.OwnP50Ms, r.Ratios.OwnP99Ms = b.Own.P50, b.Own.P99
	}
	ort := 0.0
	if r.ORT != nil {
		ort = r.ORT.PerCPUSecond
	}
	if c != nil {
		r.Ratios.EmbeddedPerCore = c.PerProcessCPUSecond
		if ort > 0 {
			r.Ratios.EmbeddedToORT = c.PerProcessCPUSecond / ort
		}
	}
	if r.GoONNX != nil && ort > 0 {
		r.Ratios.GoToORT = r.GoONNX.PerCPUSecond / ort
	}
}

func (r *report) Print(w io.Writer) {
	fmt.Fprintf(w, "inferload: %s a phase in %d turns, %d clients, batch 1, deployments of %d replicas, %d cores\n", r.Duration, r.Rounds, r.Clients, r.Replicas, r.Cores)
	if len(r.Phases) > 0 {
		fmt.Fprintf(w, "%-28s %9s %8s %8s %8s %6s %7s %9s %9s %10s %6s %6s\n",
			"phase", "req/s", "p50 ms", "p99 ms", "max ms", "errors", "refused", "proc CPU", "MLServer", "req/CPU-s", "busy%", "steal%")
		for _, p := range r.Phases {
			ml := "-"
			if p.MLServerCores > 0 {
				ml = fmt.Sprintf("%.2f", p.MLServerCores)
			}
			fmt.Fprintf(w, "%-28s %9.0f %8.2f %8.2f %8.2f %6d %7d %9.2f %9s %10.0f %6.1f %6.1f\n",
				p.ID+"  "+p.Label, p.PerSecond, p.Latency.P50, p.Latency.P99, p.Latency.Max, p.Errors, p.Refused,
				p.ProcessCores, ml, p.PerProcessCPUSecond, p.MachineBusyPct, p.MachineStealPct)
			if p.FirstError != "" {
				fmt.Fprintf(w, "    first error: %s\n", p.FirstError)
			}
		}
	}
	for _, b := range []*runtimeBench{r.ORT, r.GoONNX} {
		if b == nil {
			continue
		}
		if b.Error != "" {
			fmt.Fprintf(w, "d  %s: not measured: %s\n", b.Runtime, b.Error)
			continue
		}
		fmt.Fprintf(w, "d  %-70s %9.0f runs/s  %9.0f runs/CPU-s  (%d runs, %.1f s, onnxruntime %s)\n",
			b.Runtime, b.PerSecond, b.PerCPUSecond, b.Runs, b.Seconds, b.Version)
	}
	if r.Stream != nil {
		r.Stream.print(w)
	}
	q := r.Ratios
	if q.BackendToDirect > 0 {
		fmt.Fprintf(w, "b ÷ a throughput            %6.3f   (target ≥ 0.9: %s)\n", q.BackendToDirect, met(q.BackendToDirect >= 0.9))
		fmt.Fprintf(w, "b − a added latency         p50 %+.2f ms, p99 %+.2f ms   (target p99 ≤ 2 ms: %s)\n",
			q.AddedP50Ms, q.AddedP99Ms, met(q.AddedP99Ms <= 2))
	}
	if q.OwnP99Ms > 0 {
		fmt.Fprintf(w, "b carehub's own time        p50 %.2f ms, p99 %.2f ms   (each answer's latency less its Server-Timing backend;dur; target p99 ≤ 2 ms: %s)\n",
			q.OwnP50Ms, q.OwnP99Ms, met(q.OwnP99Ms <= 2))
	}
	if q.EmbeddedPerCore > 0 {
		fmt.Fprintf(w, "embedded per core           %6.0f invocations per CPU second of this process (node and clients)", q.EmbeddedPerCore)
		if q.EmbeddedToORT > 0 {
			fmt.Fprintf(w, " = %.3f × onnxruntime's runs per CPU second", q.EmbeddedToORT)
		}
		fmt.Fprintln(w)
	}
	if q.GoToORT > 0 {
		fmt.Fprintf(w, "onnx.Run per core           %6.3f × onnxruntime's (no HTTP)\n", q.GoToORT)
	}
	if r.MachineBusyPct > 0 {
		fmt.Fprintf(w, "machine over the run        %.0f %% busy, %.1f %% stolen by the hypervisor\n", r.MachineBusyPct, r.MachineStealPct)
	}
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// writeReport writes rep as loadtest/report's JSON (scenario "inference", rep as its summary) to
// path ("-": stdout), with the HTTP phases' series laid end to end on one clock.
func writeReport(path string, started time.Time, rep *report) error {
	var series []loadreport.Point
	for _, p := range rep.Phases {
		off := p.seriesStart.Sub(started).Seconds()
		for _, pt := range p.Series {
			pt.Seconds += off
			series = append(series, pt)
		}
	}
	slices.SortFunc(series, func(a, b loadreport.Point) int { return int(math.Copysign(1, a.Seconds-b.Seconds)) })
	b, err := json.MarshalIndent(loadreport.Report{Scenario: "inference", Started: started, Unit: "requests/s", Summary: rep, Series: series}, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if path == "-" {
		_, err = os.Stdout.Write(b)
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
