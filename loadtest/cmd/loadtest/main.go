// Command loadtest drives a carehub node with bounded, loopback-only load and reports what it
// sustained; see loadtest/README.md.
//
//	loadtest -scenario observations -devices 32 -batch 1000 -duration 30s -url http://127.0.0.1:8080 -key chk_test_…
//	loadtest -self -devices 32 -batch 100 -duration 30s   # an in-process pipeline on the embedded broker
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"carehub/loadtest"
	"carehub/loadtest/report"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		scenario    = flag.String("scenario", "observations", "scenario to run (observations)")
		url         = flag.String("url", "", "base URL of a carehub node with the ingest and api roles (loopback only)")
		keys        = flag.String("key", "", "API key(s), comma-separated, with write:observations and read:patients; devices take them in turn")
		brokers     = flag.String("brokers", "", "Kafka broker(s) of that node, for the raw-produce baseline (loopback only); empty skips it")
		metricsURLs = flag.String("metrics-url", "", "/metrics of the processors node(s), comma-separated (default URL/metrics)")
		devices     = flag.Int("devices", 16, "simulated devices posting concurrently")
		batch       = flag.Int("batch", 100, "observations per request")
		duration    = flag.Duration("duration", 30*time.Second, "length of the ingest phase (and of each raw baseline, up to 20s)")
		maxRequests = flag.Int("max-requests", 0, "stop after this many requests (0: only the duration bounds the run)")
		paced       = flag.Float64("paced", 0, "after the run, load again at this fraction of its stored rate (say 0.8), without the baselines, and report that run too (0: none)")
		rate        = flag.Float64("rate", 0, "observations per second offered over all devices, in requests of -batch paced evenly (0: as fast as the devices go); 80 % of an unpaced run's stored rate measures accept → stored there")
		format      = flag.String("format", "mixed", "request bodies: bundle (FHIR batch), ndjson, or mixed")
		patientsN   = flag.Int("patients", 200, "spread readings over up to this many patients")
		drain       = flag.Duration("drain", 2*time.Minute, "how long to wait for the writers to store what was accepted")
		self        = flag.Bool("self", false, "start an in-process pipeline (embedded broker, local Postgres with demo data) and load it")
		eventLog    = flag.String("eventlog", "", "with -self: also run the event log writer, as every node does, so each observation's event is stored in the log too: postgres (the embedded default's event_log) or a clickhouse:// URL")
		dataDir     = flag.String("data-dir", "", "with -self: where Postgres and the broker keep their data (default: a new directory under /tmp, removed after)")
		out         = flag.String("out", "", "also write the report as JSON to this file")
		results     = flag.String("results", "", "write the report's JSON under this directory (loadtest/charts draws its PNG chart and HTML page)")
		quiet       = flag.Bool("quiet", false, "no progress line on stderr")
		budget      = flag.Duration("latency-budget", 0, "with -self: intake's accept → stored budget (default 1s; negative disables it)")
		members     = flag.Int("writer-members", 0, "with -self: members of its group the observation writer runs (default 2)")
		chunks      = flag.Int("writer-concurrency", 0, "with -self: chunks of a poll each writer member stores at once (default 2)")
		maxLag      = flag.Int64("max-lag", 0, "with -self: the writer lag past which intake answers 503 (default 200,000; -1 disables backpressure)")
		cpuProfile  = flag.String("cpuprofile", "", "write a CPU profile of this process during the load and its drain (with -self: of the whole pipeline but Postgres), not the raw baselines, to this file")
		memProfile  = flag.String("memprofile", "", "when the load and its drain end (before the raw baselines), write this process's allocation profile since it started to this file")
		verbose     = flag.Bool("v", false, "log progress")
	)
	flag.Parse()
	if *scenario != "observations" {
		return fmt.Errorf("-scenario %q: the only scenario is observations", *scenario)
	}
	lvl := slog.LevelWarn
	if *verbose {
		lvl = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	cfg := loadtest.Config{URL: *url, Keys: split(*keys), MetricsURLs: split(*metricsURLs), Brokers: split(*brokers),
		Devices: *devices, Batch: *batch, Rate: *rate, Duration: *duration, MaxRequests: *maxRequests, Format: *format,
		Patients: *patientsN, Drain: *drain, Logger: logger, Progress: !*quiet}
	if !(*paced >= 0 && *paced <= 1) {
		return errors.New("-paced must be a fraction between 0 and 1")
	}
	if *eventLog != "" && !*self {
		return errors.New("-eventlog needs -self (a node you start runs its own event log writer)")
	}
	if *self {
		dir := *dataDir
		if dir == "" {
			d, err := os.MkdirTemp("/tmp", "carehub-loadtest-")
			if err != nil {
				return err
			}
			// The embedded Postgres runs as user postgres when we are root: it must traverse dir.
			if err := os.Chmod(d, 0o755); err != nil {
				return err
			}
			defer os.RemoveAll(d)
			dir = d
		}
		logger.Info("starting the in-process pipeline", "data_dir", dir)
		st, err := loadtest.StartStack(ctx, dir, logger, loadtest.StackOptions{MaxLag: *maxLag, LatencyBudget: *budget,
			EventLog: *eventLog, WriterMembers: *members, WriterConcurrency: *chunks})
		if err != nil {
			return err
		}
		defer st.Close()
		cfg.URL, cfg.Keys, cfg.Brokers, cfg.Credentials, cfg.MetricsURLs, cfg.CopyPool = st.URL, []string{st.Key}, st.Brokers, st.Credentials, nil, st.Pool
		cfg.CPU = st.CPU
		cfg.EventLog = st.EventLog
	}
	if cfg.URL == "" {
		return errors.New("-url (or -self) is required")
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		// From the load's start, not the bodies' building or the calibration before it.
		cfg.LoadStarts = func() {
			if err := pprof.StartCPUProfile(f); err != nil {
				logger.Warn("no CPU profile", "err", err)
			}
		}
		defer pprof.StopCPUProfile()
		cfg.PipelineDone = pprof.StopCPUProfile
	}
	if *memProfile != "" {
		cpuDone := cfg.PipelineDone
		cfg.PipelineDone = func() {
			if cpuDone != nil {
				cpuDone()
			}
			if err := writeAllocs(*memProfile); err != nil {
				logger.Warn("no allocation profile", "err", err)
			}
		}
	}
	started := time.Now()
	rep, err := loadtest.RunObservations(ctx, cfg)
	if err != nil {
		return err
	}
	if *paced > 0 && rep.StoredPerSecond > 0 {
		pcfg := cfg
		pcfg.Rate, pcfg.NoBaselines, pcfg.PipelineDone, pcfg.LoadStarts = *paced*rep.StoredPerSecond, true, nil, nil
		if rep.Paced, err = loadtest.RunObservations(ctx, pcfg); err != nil {
			return fmt.Errorf("paced run: %w", err)
		}
	}
	print(rep)
	if rep.Paced != nil {
		fmt.Printf("then paced at %.0f %% of the stored rate:\n", *paced*100)
		print(rep.Paced)
	}
	if *out != "" {
		b, err := json.MarshalIndent(finite(rep), "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if *results != "" {
		scenario := "observations"
		if rep.EventLog != "" {
			scenario += "-with-eventlog" // a file of its own beside the path's run
		}
		path, err := report.Write(*results, report.Report{Scenario: scenario, Started: started, Unit: "observations/s",
			LagName: "records behind", Summary: finite(rep), Series: rep.Series})
		if err != nil {
			return err
		}
		fmt.Printf("report: %s (charts: %s)\n", path, report.ChartsCommand(path))
	}
	return nil
}

func split(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func print(r *loadtest.Report) {
	fmt.Printf("scenario %s: %d devices, %s bodies of %d observations, %.1f s", r.Scenario, r.Devices, r.Format, r.Batch, r.Seconds)
	if r.Rate > 0 {
		fmt.Printf(", %.0f observations/s offered", r.Rate)
	}
	if r.EventLog != "" {
		fmt.Printf(", events stored in the log too (%s)", r.EventLog)
	}
	fmt.Println()
	fmt.Printf("  requests %d: accepted %d observations (rejected %d), refused %d (429/503), failed %d\n",
		r.Requests, r.Accepted, r.Rejected, r.Refused, r.Failed)
	if r.FirstFailure != "" {
		fmt.Printf("  first failure: %s\n", r.FirstFailure)
	}
	fmt.Printf("  acknowledged  %10.0f observations/s   accept latency p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
		r.AcceptedPerSecond, r.AcceptP50Ms, r.AcceptP99Ms, r.AcceptMaxMs)
	fmt.Printf("  stored        %10.0f observations/s   (%.0f stored, %.0f during ingest, drained %.1f s after)\n",
		r.StoredPerSecond, r.Stored, r.StoredDuringIngest, r.DrainSeconds)
	over := ""
	if r.AcceptToStoredP99Capped {
		over = ">"
	}
	fmt.Printf("  accept→stored p50 %.0f ms, p99 %s%.0f ms (from the writer's histogram)\n", r.AcceptToStoredP50, over, r.AcceptToStoredP99)
	if r.ProcessCPUPerStoredUs > 0 {
		fmt.Printf("  CPU per stored %6.1f µs this process (devices, intake, broker, writer), %.1f µs Postgres\n",
			r.ProcessCPUPerStoredUs, r.PostgresCPUPerStoredUs)
		fmt.Printf("  machine       %10.0f %% busy           (%.1f %% other processes; %.1f %% waiting on the disk, %.1f %% stolen by the hypervisor)\n",
			r.MachineBusyPct, r.MachineOtherPct, r.MachineIOWaitPct, r.MachineStealPct)
	}
	fmt.Printf("  calibration   %10.0f ns/KB SHA-256  (%.1f ns a random read in 64 MB; one core, before the load)\n",
		r.CalibrationHashNsPerKB, r.CalibrationReadNs)
	if r.RawPerSecond > 0 {
		fmt.Printf("  raw produce   %10.0f records/s      (same records, same broker, idempotent acks=all)\n", r.RawPerSecond)
		fmt.Printf("  ratio         %10.2f               ingest acknowledged ÷ raw produce\n", r.Ratio)
	}
	if r.BareHTTPPerSecond > 0 {
		fmt.Printf("  bare HTTP     %10.0f observations/s (same bodies, same devices, a server that only reads them)\n", r.BareHTTPPerSecond)
		fmt.Printf("  ratio         %10.2f               ingest acknowledged ÷ bare HTTP\n", r.AcceptedToBareHTTPRatio)
	}
	if r.RawCopyPerSecond > 0 {
		fmt.Printf("  raw COPY      %10.0f rows/s         (same rows, same database, like observations without foreign keys)\n", r.RawCopyPerSecond)
		fmt.Printf("  ratio         %10.2f               stored ÷ raw COPY\n", r.StoredToCopyRatio)
	}
}

// finite replaces NaN (no samples) with 0 so that the report encodes as JSON.
func finite(r *loadtest.Report) *loadtest.Report {
	c := *r
	for _, f := range []*float64{&c.AcceptP50Ms, &c.AcceptP99Ms, &c.AcceptMaxMs, &c.AcceptToStoredP50, &c.AcceptToStoredP99,
		&c.AcceptedPerSecond, &c.StoredPerSecond, &c.RawPerSecond, &c.Ratio, &c.BareHTTPPerSecond, &c.AcceptedToBareHTTPRatio, &c.RawCopyPerSecond, &c.StoredToCopyRatio} {
		if math.IsNaN(*f) || math.IsInf(*f, 0) {
			*f = 0
		}
	}
	if c.Paced != nil {
		c.Paced = finite(c.Paced)
	}
	return &c
}

// writeAllocs writes the allocation profile (every allocation sampled since the process
// started) to path.
func writeAllocs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
