// Package loadtest drives carehub with bounded, loopback-only load and reports what it
// sustained. The observations scenario is N simulated devices posting FHIR batch Bundles and
// NDJSON streams of vital signs to POST /v1/observations, measuring acknowledged observations
// per second and the accept latency, then, from the processors' /metrics, how fast they were
// stored and the accept→stored latency; and, in the same run, a raw franz-go produce of the
// same records to the same broker for comparison.
package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/config"
	"carehub/kernel/ids"
	"carehub/loadtest/loadcli"
	"carehub/loadtest/report"
	obs "carehub/processors/observations"
	obswire "carehub/schemas/kafka/observation"
	"carehub/storage/kafka"
	"carehub/storage/postgres/pgcopy"
)

// Bounds every run stays within, whatever the flags say.
const (
	MaxDuration = 10 * time.Minute
	MaxDevices  = 1024
	MaxBatch    = 10_000
	// MaxRawPhase bounds each raw baseline: a raw part's rate is steady within seconds, and a
	// minute of raw produce at a million records a second would fill the disk.
	MaxRawPhase = 20 * time.Second
)

// Config is one run of the observations scenario.
type Config struct {
	URL         string            // base URL of a carehub node with the ingest and api roles (loopback)
	Keys        []string          // API keys with write:observations and read:patients; devices take them in turn
	MetricsURLs []string          // /metrics of the processors nodes; default URL + "/metrics"
	Brokers     []string          // the broker, for the raw-produce baseline; empty skips it
	Credentials kafka.Credentials // what a client of Brokers authenticates with
	// CopyPool is the node's database, for the raw COPY baseline; nil skips it.
	CopyPool *pgxpool.Pool
	Devices  int
	Batch    int           // observations per request
	Duration time.Duration // of the ingest phase, and of each raw phase up to MaxRawPhase
	// Rate is the observations per second offered over all devices (requests of Batch paced
	// evenly); 0 offers as fast as the devices go. A rate under the sustained one measures
	// accept → stored there (issue 20: p99 at 80 % of the sustained rate).
	Rate float64
	// EventLog is the kind of store the node's event log writer stores each observation's event
	// in during the run (postgres, clickhouse), for the report; empty when none runs.
	EventLog    string
	MaxRequests int           // 0: no bound but Duration
	Format      string        // bundle, ndjson or mixed
	Patients    int           // readings are spread over up to this many patients
	Drain       time.Duration // how long to wait for the writers to store what was accepted
	Logger      *slog.Logger
	// Progress prints the progress line (loadtest/report) on stderr during ingest and drain.
	Progress bool
	// NoBaselines skips the raw baselines (produce, bare HTTP, COPY) after the load.
	NoBaselines bool
	// PipelineDone, if set, is called once the accepted observations are stored (or the drain
	// gave up), before the raw baselines: a CPU profile stopped there covers the pipeline only.
	PipelineDone func()
	// LoadStarts, if set, is called as the load starts: after the bodies are built and the
	// machine calibrated, when the CPU figures' window opens (-cpuprofile starts there).
	LoadStarts func()
	// CPU, if set, reads the CPU time used so far by this process and by Postgres (a -self
	// run's Stack.CPU); the report then gives both per observation stored.
	CPU func() (process, postgres time.Duration, err error)
}

// Validate checks cfg and fills defaults.
func (c *Config) Validate() error {
	var errs []error
	if err := loopbackURL(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("-url: %w", err))
	}
	if len(c.Keys) == 0 {
		errs = append(errs, errors.New("-key: at least one API key is required"))
	}
	for _, b := range c.Brokers {
		if err := loopbackHost(b); err != nil {
			errs = append(errs, fmt.Errorf("-brokers %s: %w", b, err))
		}
	}
	if len(c.MetricsURLs) == 0 && c.URL != "" {
		c.MetricsURLs = []string{strings.TrimRight(c.URL, "/") + "/metrics"}
	}
	for _, u := range c.MetricsURLs {
		if err := loopbackURL(u); err != nil {
			errs = append(errs, fmt.Errorf("-metrics-url: %w", err))
		}
	}
	if c.Devices < 1 || c.Devices > MaxDevices {
		errs = append(errs, fmt.Errorf("-devices must be 1..%d", MaxDevices))
	}
	if c.Batch < 1 || c.Batch > MaxBatch {
		errs = append(errs, fmt.Errorf("-batch must be 1..%d", MaxBatch))
	}
	if c.Duration <= 0 || c.Duration > MaxDuration {
		errs = append(errs, fmt.Errorf("-duration must be positive and at most %s", MaxDuration))
	}
	if c.MaxRequests < 0 {
		errs = append(errs, errors.New("-max-requests must not be negative"))
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		errs = append(errs, errors.New("-rate must be a finite number, 0 or more"))
	}
	if !slices.Contains([]string{"bundle", "ndjson", "mixed"}, c.Format) {
		errs = append(errs, errors.New("-format must be bundle, ndjson or mixed"))
	}
	config.Default(&c.Patients, 200)
	config.Default(&c.Drain, 2*time.Minute)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return errors.Join(errs...)
}

// loopbackURL refuses anything but http(s) on a loopback address: load is for local nodes.
func loopbackURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("must be an http(s) URL")
	}
	return loopbackHost(u.Host)
}

func loopbackHost(hostport string) error {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return errors.New("load is only sent to loopback addresses")
}

// Report is what a run measured. Latencies are milliseconds.
type Report struct {
	Scenario string  `json:"scenario"`
	Format   string  `json:"format"`
	Devices  int     `json:"devices"`
	Batch    int     `json:"batch"`
	Rate     float64 `json:"offeredPerSecond,omitempty"` // Config.Rate; 0: unpaced
	// EventLog is the store of the event log writer that ran too (loadtest -self -eventlog:
	// postgres or clickhouse), storing each observation's event in the log as a node does.
	EventLog string  `json:"eventLog,omitempty"`
	Seconds  float64 `json:"seconds"`

	Requests          int64   `json:"requests"`
	Accepted          int64   `json:"accepted"`
	Rejected          int64   `json:"rejected"`
	Refused           int64   `json:"refused"` // 429 and 503 answers (rate limit, backpressure)
	Failed            int64   `json:"failed"`  // other answers and transport errors
	FirstFailure      string  `json:"firstFailure,omitempty"`
	AcceptedPerSecond float64 `json:"acceptedPerSecond"`
	AcceptP50Ms       float64 `json:"acceptP50Ms"`
	AcceptP99Ms       float64 `json:"acceptP99Ms"`
	AcceptMaxMs       float64 `json:"acceptMaxMs"`

	StoredDuringIngest float64 `json:"storedDuringIngest"`
	Stored             float64 `json:"stored"`
	StoredPerSecond    float64 `json:"storedPerSecond"` // stored ÷ (ingest + drain time)
	DrainSeconds       float64 `json:"drainSeconds"`    // after ingest ended, until all was stored
	AcceptToStoredP50  float64 `json:"acceptToStoredP50Ms"`
	AcceptToStoredP99  float64 `json:"acceptToStoredP99Ms"`
	// AcceptToStoredP99Capped: the p99 lies past the histogram's last bucket, which it reports.
	AcceptToStoredP99Capped bool `json:"acceptToStoredP99Capped,omitempty"`

	RawRecords   int64   `json:"rawRecords,omitempty"`
	RawPerSecond float64 `json:"rawPerSecond,omitempty"`
	Ratio        float64 `json:"ingestToRawRatio,omitempty"` // acceptedPerSecond ÷ rawPerSecond

	// BareHTTP*: the same bodies posted by as many devices to a server that only reads them.
	BareHTTPObservations    int64   `json:"bareHttpObservations,omitempty"`
	BareHTTPPerSecond       float64 `json:"bareHttpPerSecond,omitempty"`       // observations/s
	AcceptedToBareHTTPRatio float64 `json:"acceptedToBareHttpRatio,omitempty"` // acceptedPerSecond ÷ bareHttpPerSecond

	// CPU per observation stored, from the start of ingest to the end of the drain (Config.CPU):
	// this process (with -self: the devices and the whole pipeline but Postgres) and Postgres.
	ProcessCPUPerStoredUs  float64 `json:"processCpuPerStoredUs,omitempty"`
	PostgresCPUPerStoredUs float64 `json:"postgresCpuPerStoredUs,omitempty"`
	// The machine in the same window (/proc/stat), as percentages of all its cores' time:
	// busy, busy in processes other than this one and Postgres (another job on the machine),
	// idle with a disk write or read outstanding (iowait: the cores had nothing to do but wait
	// for the disk), and stolen by the hypervisor for other guests. A run with other or
	// stolen time well above zero measured a shared machine, not carehub.
	MachineBusyPct   float64 `json:"machineBusyPct,omitempty"`
	MachineOtherPct  float64 `json:"machineOtherPct,omitempty"`
	MachineIOWaitPct float64 `json:"machineIoWaitPct,omitempty"`
	MachineStealPct  float64 `json:"machineStealPct,omitempty"`
	// Two fixed jobs timed on one core before the load (calibrate): how fast this machine
	// computes and answers a memory read in this hour, whatever carehub does.
	CalibrationHashNsPerKB float64 `json:"calibrationHashNsPerKb,omitempty"`
	CalibrationReadNs      float64 `json:"calibrationReadNs,omitempty"`

	RawCopyRows       int64   `json:"rawCopyRows,omitempty"`
	RawCopyPerSecond  float64 `json:"rawCopyPerSecond,omitempty"`
	StoredToCopyRatio float64 `json:"storedToCopyRatio,omitempty"` // storedPerSecond ÷ rawCopyPerSecond

	// Paced is a second run at a fraction of this one's stored rate (loadtest -paced), no
	// baselines: accept → stored at, say, 80 % of the sustained rate.
	Paced *Report `json:"paced,omitempty"`

	// Series is the ingest and drain phases second by second: observations acknowledged per
	// second, accept latency, and the records accepted but not yet stored (the report's series, which loadtest/charts draws).
	Series []report.Point `json:"-"`
}

// RunObservations runs the scenario: ingest for Duration, wait for the writers to store what
// was accepted, then run the raw baselines (rawPhase each).
func RunObservations(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Devices + 4, DisableCompression: true},
		Timeout: 2 * time.Minute}
	defer client.CloseIdleConnections()
	orgID, patients, err := listPatients(ctx, client, cfg.URL, cfg.Keys[0], cfg.Patients)
	if err != nil {
		return nil, err
	}
	cfg.Logger.Info("patients found", "count", len(patients))

	bodies := buildBodies(cfg, orgID, patients)
	rep := &Report{Scenario: "observations", Format: cfg.Format, Devices: cfg.Devices, Batch: cfg.Batch, Rate: cfg.Rate,
		EventLog: cfg.EventLog}
	rep.CalibrationHashNsPerKB, rep.CalibrationReadNs = calibrate()
	before, err := scrape(ctx, client, cfg.MetricsURLs)
	if err != nil {
		return nil, err
	}

	var acceptedSoFar atomic.Int64
	rec := report.NewRecorder(report.Options{Unit: "observations/s", LagName: "records behind", Quiet: !cfg.Progress,
		Lag: func() float64 {
			s, err := scrape(ctx, client, cfg.MetricsURLs)
			if err != nil {
				return 0
			}
			return max(0, float64(acceptedSoFar.Load())-(s.stored-before.stored))
		}})
	var cpu0, pgCPU0 time.Duration
	var machine0 machineCPU
	var machineErr error
	if cfg.CPU != nil {
		if cpu0, pgCPU0, err = cfg.CPU(); err != nil {
			cfg.Logger.Warn("no CPU figures", "err", err)
			cfg.CPU = nil
		}
		machine0, machineErr = readMachineCPU()
	}
	if cfg.LoadStarts != nil {
		cfg.LoadStarts()
	}
	rec.Start()
	defer rec.Stop()
	start := time.Now()
	lat := postLoad(ctx, cfg, client, bodies, rep, rec, &acceptedSoFar)
	elapsed := time.Since(start)
	rep.Seconds = elapsed.Seconds()
	rep.AcceptedPerSecond = float64(rep.Accepted) / elapsed.Seconds()
	slices.Sort(lat)
	rep.AcceptP50Ms, rep.AcceptP99Ms = report.Percentile(lat, 0.50), report.Percentile(lat, 0.99)
	if len(lat) > 0 {
		rep.AcceptMaxMs = lat[len(lat)-1]
	}

	end, err := scrape(ctx, client, cfg.MetricsURLs)
	if err != nil {
		return nil, err
	}
	rep.StoredDuringIngest = end.stored - before.stored
	drainStart := time.Now()
	for end.stored-before.stored < float64(rep.Accepted) && time.Since(drainStart) < cfg.Drain {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if end, err = scrape(ctx, client, cfg.MetricsURLs); err != nil {
			return nil, err
		}
	}
	rep.DrainSeconds = time.Since(drainStart).Seconds()
	if cfg.CPU != nil && end.stored > before.stored {
		if cpu1, pgCPU1, err := cfg.CPU(); err == nil {
			n := end.stored - before.stored
			rep.ProcessCPUPerStoredUs = float64((cpu1 - cpu0).Microseconds()) / n
			rep.PostgresCPUPerStoredUs = float64((pgCPU1 - pgCPU0).Microseconds()) / n
			if machine1, err := readMachineCPU(); err == nil && machineErr == nil {
				m := machine1.sub(machine0)
				rep.MachineBusyPct, rep.MachineStealPct, rep.MachineIOWaitPct = m.pctOf(m.busy), m.pctOf(m.steal), m.pctOf(m.iowait)
				rep.MachineOtherPct = max(0, m.pctOf(m.busy-(cpu1-cpu0)-(pgCPU1-pgCPU0)))
			}
		}
	}
	rep.Series = rec.Stop()
	if cfg.PipelineDone != nil {
		cfg.PipelineDone()
	}
	rep.Stored = end.stored - before.stored
	rep.StoredPerSecond = rep.Stored / time.Since(start).Seconds()
	p50, _ := quantile(0.50, before.buckets, end.buckets)
	p99, capped := quantile(0.99, before.buckets, end.buckets)
	rep.AcceptToStoredP50, rep.AcceptToStoredP99, rep.AcceptToStoredP99Capped = p50*1000, p99*1000, capped
	if rep.Stored < float64(rep.Accepted) {
		cfg.Logger.Warn("not everything accepted was stored within the drain time", "accepted", rep.Accepted, "stored", rep.Stored)
	}

	if cfg.NoBaselines {
		return rep, nil
	}
	if len(cfg.Brokers) > 0 {
		if err := rawProduce(ctx, cfg, bodies, rep); err != nil {
			return nil, fmt.Errorf("raw produce: %w", err)
		}
		if rep.RawPerSecond > 0 {
			rep.Ratio = rep.AcceptedPerSecond / rep.RawPerSecond
		}
	}
	if err := bareHTTP(ctx, cfg, client, bodies, rep); err != nil {
		return nil, fmt.Errorf("bare HTTP: %w", err)
	}
	if cfg.CopyPool != nil {
		if err := rawCopy(ctx, cfg, bodies, rep); err != nil {
			return nil, fmt.Errorf("raw COPY: %w", err)
		}
		if rep.RawCopyPerSecond > 0 {
			rep.StoredToCopyRatio = rep.StoredPerSecond / rep.RawCopyPerSecond
		}
	}
	return rep, nil
}

// rawPhase is how long each raw baseline runs: Duration, up to MaxRawPhase.
func (c Config) rawPhase() time.Duration { return min(c.Duration, MaxRawPhase) }

// listPatients pages GET /v1/patients for up to max patients the key may write for.
func listPatients(ctx context.Context, client *http.Client, base, key string, max int) (string, []string, error) {
	var out []string
	orgID := ""
	cursor := ""
	for len(out) < max {
		u := strings.TrimRight(base, "/") + "/v1/patients?limit=100"
		if cursor != "" {
			u += "&cursor=" + url.QueryEscape(cursor)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return "", nil, err
		}
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil {
			return "", nil, fmt.Errorf("list patients: %w", err)
		}
		var page struct {
			Data []struct {
				ID                   string `json:"id"`
				ManagingOrganization struct {
					Reference string `json:"reference"`
				} `json:"managingOrganization"`
			} `json:"data"`
			Meta struct {
				Cursor *string `json:"cursor"`
			} `json:"meta"`
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return "", nil, fmt.Errorf("list patients: HTTP %d: %.300s", resp.StatusCode, b)
		}
		if err := json.Unmarshal(b, &page); err != nil {
			return "", nil, fmt.Errorf("list patients: %w", err)
		}
		for _, p := range page.Data {
			out = append(out, p.ID)
			if orgID == "" {
				orgID = strings.TrimPrefix(p.ManagingOrganization.Reference, "Organization/")
			}
		}
		if page.Meta.Cursor == nil {
			break
		}
		cursor = *page.Meta.Cursor
	}
	if len(out) == 0 {
		return "", nil, errors.New("the key sees no patients: seed demo data, and use a key of its organization with read:patients")
	}
	return orgID, out[:min(len(out), max)], nil
}

// buildBodies pre-builds the request bodies, so that generating JSON does not compete with the
// server for the CPU during the timed phase. Bodies repeat; each POST is new observations all
// the same (carehub assigns ids; the bodies carry no client ids).
func buildBodies(cfg Config, orgID string, patients []string) []body {
	n := min(max(2*cfg.Devices, 8), 48)
	if cfg.Batch*n > 200_000 {
		n = max(2, 200_000/cfg.Batch)
	}
	at := time.Now().Add(-time.Minute)
	out := make([]body, n)
	for i := range out {
		g := newGenerator(uint64(i+1), orgID, patients)
		format := cfg.Format
		if format == "mixed" {
			format = []string{"bundle", "ndjson"}[i%2]
		}
		if format == "bundle" {
			out[i] = g.bundleBody(cfg.Batch, at)
		} else {
			out[i] = g.ndjsonBody(cfg.Batch, at)
		}
	}
	return out
}

// postLoad runs the devices until Duration or MaxRequests and returns the accept latencies of
// the 202 answers, in milliseconds.
func postLoad(ctx context.Context, cfg Config, client *http.Client, bodies []body, rep *Report, rec *report.Recorder, accepted *atomic.Int64) []float64 {
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var requests, rejected, refused, failed atomic.Int64
	var firstFailure atomic.Value
	var mu sync.Mutex
	var all []float64
	var wg sync.WaitGroup
	target := strings.TrimRight(cfg.URL, "/") + "/v1/observations"
	pace, stopPace := loadcli.Pace(cfg.Rate / float64(cfg.Batch))
	defer stopPace()
	for d := range cfg.Devices {
		wg.Go(func() {
			key := cfg.Keys[d%len(cfg.Keys)]
			var lat []float64
			defer func() { mu.Lock(); all = append(all, lat...); mu.Unlock() }()
			for i := 0; loadcli.Wait(ctx, pace); i++ {
				if n := requests.Add(1); cfg.MaxRequests > 0 && n > int64(cfg.MaxRequests) {
					requests.Add(-1)
					return
				}
				b := bodies[(d+i*cfg.Devices)%len(bodies)]
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(b.data))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Content-Type", b.contentType)
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
						firstFailure.CompareAndSwap(nil, err.Error())
					} else {
						requests.Add(-1) // cut off by the end of the phase
					}
					continue
				}
				respBody, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				took := time.Since(t0)
				switch resp.StatusCode {
				case http.StatusAccepted:
					var a struct {
						Accepted int               `json:"accepted"`
						Rejected []json.RawMessage `json:"rejected"`
					}
					_ = json.Unmarshal(respBody, &a)
					accepted.Add(int64(a.Accepted))
					rejected.Add(int64(len(a.Rejected)))
					lat = append(lat, float64(took.Microseconds())/1000)
					rec.Observe(a.Accepted, took)
				case http.StatusTooManyRequests, http.StatusServiceUnavailable:
					refused.Add(1)
					rec.Refuse(1)
					wait := time.Second
					if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
						wait = time.Duration(s) * time.Second
					}
					select {
					case <-ctx.Done():
					case <-time.After(wait):
					}
				default:
					failed.Add(1)
					firstFailure.CompareAndSwap(nil, fmt.Sprintf("HTTP %d: %.300s", resp.StatusCode, respBody))
				}
			}
		})
	}
	wg.Wait()
	rep.Requests, rep.Accepted, rep.Rejected, rep.Refused, rep.Failed = requests.Load(), accepted.Load(), rejected.Load(), refused.Load(), failed.Load()
	if f, ok := firstFailure.Load().(string); ok {
		rep.FirstFailure = f
	}
	return all
}

// rawProduce produces the same records (the messages intake would have produced for the
// bodies) with one idempotent acks=all client, Devices goroutines each producing a batch and
// waiting for its acknowledgement, for the raw phase, to a topic of its own on the same broker.
func rawProduce(ctx context.Context, cfg Config, bodies []body, rep *Report) error {
	cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: cfg.Brokers, Credentials: cfg.Credentials, ClientID: "carehub-loadtest-raw"})
	if err != nil {
		return err
	}
	defer cl.Close()
	topic := fmt.Sprintf("carehub.loadtest.raw.%d", time.Now().UnixNano())
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := kafka.EnsureTopics(tctx, cl, kafka.Layout{Partitions: 6}, topic); err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = kadm.NewClient(cl).DeleteTopics(dctx, topic)
	}()
	n, perSecond, err := everyDevice(ctx, cfg, func(ctx context.Context, d, i int) (int64, error) {
		b := bodies[(d+i*cfg.Devices)%len(bodies)]
		recs := make([]*kgo.Record, len(b.records))
		for j := range recs {
			recs[j] = &kgo.Record{Topic: topic, Key: b.keys[j], Value: b.records[j]}
		}
		return int64(len(recs)), cl.ProduceSync(ctx, recs...).FirstErr()
	})
	rep.RawRecords, rep.RawPerSecond = n, perSecond
	return err
}

// everyDevice runs step for every device in turn (i counts the device's steps) for the raw
// phase or until the first error, and returns what the steps counted, per second too. An error
// after the phase ended is not one.
func everyDevice(ctx context.Context, cfg Config, step func(ctx context.Context, device, i int) (int64, error)) (int64, float64, error) {
	pctx, cancel := context.WithTimeout(ctx, cfg.rawPhase())
	defer cancel()
	var count atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	var wg sync.WaitGroup
	for d := range cfg.Devices {
		wg.Go(func() {
			for i := 0; pctx.Err() == nil; i++ {
				n, err := step(pctx, d, i)
				if err != nil {
					if pctx.Err() == nil {
						firstErr.CompareAndSwap(nil, err)
					}
					return
				}
				count.Add(n)
			}
		})
	}
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok {
		return 0, 0, err
	}
	return count.Load(), float64(count.Load()) / time.Since(start).Seconds(), nil
}

// rawCopy copies the same rows (the columns the writer stores, from the same messages, with
// fresh ids) into a table like observations (its indexes; no foreign keys, no staging, no
// conflict handling) for the raw phase, in the writer's transaction size and as many at once as
// its members store (processors/observations DefaultChunkSize, DefaultMembers ×
// DefaultConcurrency), written as the writer writes
// its COPY (storage/postgres/pgcopy): what Postgres itself does with these rows on this
// machine.
func rawCopy(ctx context.Context, cfg Config, bodies []body, rep *Report) error {
	const table = "loadtest_raw_copy"
	if _, err := cfg.CopyPool.Exec(ctx, `drop table if exists `+table+`; create table `+table+` (like observations including all)`); err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = cfg.CopyPool.Exec(dctx, `drop table if exists `+table)
	}()
	var msgs []obswire.Message
	for _, b := range bodies {
		for _, r := range b.records {
			m, err := obswire.DecodeMessage(r)
			if err != nil {
				return err
			}
			msgs = append(msgs, m)
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	cols := []string{"id", "org_id", "patient_id", "status", "loinc", "value", "unit", "effective_at",
		"device_type", "resource", "received_at"}
	pctx, cancel := context.WithTimeout(ctx, cfg.rawPhase())
	defer cancel()
	var copied atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	var wg sync.WaitGroup
	const streams = obs.DefaultMembers * obs.DefaultConcurrency
	for w := range streams {
		wg.Go(func() {
			const chunk = obs.DefaultChunkSize
			rows := pgcopy.New(len(cols), chunk*1024)
			for i := w * chunk; pctx.Err() == nil; i += streams * chunk {
				rows.Reset()
				for j := range chunk {
					m := &msgs[(i+j)%len(msgs)]
					rows.Row()
					rows.Texts(ids.New(ids.Observation), m.OrgID, m.PatientID, m.Status, m.LOINC)
					rows.Float8(m.Value)
					rows.Text(m.Unit)
					rows.Timestamptz(m.EffectiveAt)
					rows.Text(m.DeviceType)
					rows.Bytes(m.Observation)
					rows.Timestamptz(m.ReceivedAt)
				}
				err := cfg.CopyPool.AcquireFunc(pctx, func(c *pgxpool.Conn) error {
					_, err := rows.Copy(pctx, c.Conn().PgConn(), table, cols)
					return err
				})
				if err != nil {
					if pctx.Err() == nil {
						firstErr.CompareAndSwap(nil, err)
					}
					return
				}
				copied.Add(chunk)
			}
		})
	}
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok {
		return err
	}
	rep.RawCopyRows = copied.Load()
	rep.RawCopyPerSecond = float64(rep.RawCopyRows) / time.Since(start).Seconds()
	return nil
}
