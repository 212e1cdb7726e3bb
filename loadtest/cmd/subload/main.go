// Command subload measures FHIR Subscriptions' rest-hook notifications under load (issue 57):
// observation accepted (POST /v1/observations answered 202) → its notification received, p50 and
// p99 at 80 % of the stored rate, with 1,000 active subscriptions. It creates -subs patients
// (POST /fhir/R4/Patient) and one rest-hook subscription per patient (topic observation-created,
// filtered to that patient, id-only), each to its own path of a receiver this command runs on
// loopback, which verifies every notification's signature (kernel/whsig) and matches each
// notification event's focus to the observation posted. It waits until the handshakes made every
// subscription active, then:
//
//   - phase A (the stored rate): -c workers post batch Bundles of -batch observations, spread over the
//     patients, as fast as the node takes them for -d, with at most -window observations
//     accepted and not yet notified (so that the phase measures the notification path's rate,
//     not how long a queue grows); the stored rate is the notifications received per second over
//     the phase's last 80 %;
//   - phase B: the same load paced at -paced (0.8) of that rate for -d, measuring per observation
//     accepted → notified.
//
// Each phase drains (at most -drain) before the next. See loadtest/README.md.
//
//	subload -self                                  # a node in this process, 1,000 subscriptions
//	subload -url http://127.0.0.1:8080 -key chk_live_A,chk_live_B -subs 200 -d 20s
//
// Without -self the node must allow plain-HTTP loopback endpoints (carehub serve
// --webhooks-allow-private; make run passes it) and the keys need read:patients, write:patients,
// read:observations and write:observations; the run deletes its subscriptions at the end (its
// patients stay). Load is bounded and loopback only.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"carehub/e2e/pipelinetest"
	"carehub/kernel/tick"
	"carehub/loadtest"
	"carehub/loadtest/loadcli"
	loadreport "carehub/loadtest/report"
)

// config is the command line.
type config struct {
	URL          string
	Keys         []string
	Self         bool
	Subs         int
	Clients      int
	Batch        int
	Duration     time.Duration
	Paced        float64
	Rate         float64 // phase B's rate in observations/s; skips phase A
	Window       int
	Drain        time.Duration
	MaxCount     int
	Listen       string
	SetupTimeout time.Duration
	Keep         bool
	Quiet        bool
	JSON         string
	Results      string
	CPUProfile   string
}

// Bounds.
const (
	maxSubs   = 10_000
	maxWindow = 1_000_000
)

func (c *config) validate() error {
	var errs []error
	if err := loadcli.LoopbackURL(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("-url: %w", err))
	}
	if len(c.Keys) == 0 {
		errs = append(errs, errors.New("-key: at least one API key (read:patients, write:patients, read:observations, write:observations) is required, or -self"))
	}
	if c.Subs < 1 || c.Subs > maxSubs {
		errs = append(errs, fmt.Errorf("-subs %d: must be 1..%d", c.Subs, maxSubs))
	}
	if err := (loadcli.Load{Clients: c.Clients, Duration: c.Duration, Rate: c.Rate, Batch: c.Batch, Drain: c.Drain}).Validate(); err != nil {
		errs = append(errs, err)
	}
	if !(c.Paced >= 0 && c.Paced <= 1) {
		errs = append(errs, fmt.Errorf("-paced %v: must be 0..1", c.Paced))
	}
	if c.Window != 0 && (c.Window < c.Batch || c.Window > maxWindow) {
		errs = append(errs, fmt.Errorf("-window %d: must be 0 (none) or -batch..%d", c.Window, maxWindow))
	}
	if c.MaxCount < 0 || c.MaxCount > 100 {
		errs = append(errs, fmt.Errorf("-max-count %d: must be 0 (the node's default) or 1..100", c.MaxCount))
	}
	if c.SetupTimeout <= 0 || c.SetupTimeout > loadcli.MaxDuration {
		errs = append(errs, fmt.Errorf("-setup-timeout %v: must be positive and at most %v", c.SetupTimeout, loadcli.MaxDuration))
	}
	if host, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("-listen %q: %w", c.Listen, err))
	} else if err := loadcli.LoopbackHost(host); err != nil {
		errs = append(errs, fmt.Errorf("-listen: %w", err))
	}
	return errors.Join(errs...)
}

func main() { os.Exit(subload()) }

// subload runs the command and returns its exit code (after the -self node stopped).
func subload() int {
	var cfg config
	var keys string
	flag.StringVar(&cfg.URL, "url", "http://127.0.0.1:8080", "base URL of a carehub node with every role (loopback only)")
	flag.StringVar(&keys, "key", os.Getenv("CAREHUB_KEY"), "API key(s), comma-separated, with read:patients, write:patients, read:observations, write:observations (default $CAREHUB_KEY)")
	flag.BoolVar(&cfg.Self, "self", false, "start a carehub node in this process (embedded defaults, loopback webhooks allowed, rate limits lifted, data under a new directory in /tmp, removed after) with keys of its own, and load it (-url and -key are ignored)")
	flag.IntVar(&cfg.Subs, "subs", 1000, "patients created, each with one rest-hook subscription")
	flag.IntVar(&cfg.Clients, "c", 8, "concurrent posting workers (they take the keys in turn)")
	flag.IntVar(&cfg.Batch, "batch", 50, "observations per POST /v1/observations (a FHIR batch Bundle of consecutive patients' observations)")
	flag.DurationVar(&cfg.Duration, "d", 30*time.Second, "length of each phase")
	flag.Float64Var(&cfg.Paced, "paced", 0.8, "phase B's rate as a fraction of phase A's stored rate (0: no phase B)")
	flag.Float64Var(&cfg.Rate, "rate", 0, "skip phase A and pace phase B at this many observations/s")
	flag.IntVar(&cfg.Window, "window", 20_000, "at most this many observations accepted and not yet notified: workers wait for room (0: no bound)")
	flag.DurationVar(&cfg.Drain, "drain", time.Minute, "after each phase, how long to wait for its notifications")
	flag.IntVar(&cfg.MaxCount, "max-count", 0, "the subscriptions' backport-max-count, events per notification (0: the node's default, 20)")
	flag.StringVar(&cfg.Listen, "listen", "127.0.0.1:0", "address of the rest-hook receiver (loopback; port 0 picks one)")
	flag.DurationVar(&cfg.SetupTimeout, "setup-timeout", 3*time.Minute, "bound on creating the patients and subscriptions and waiting for them to be active")
	flag.BoolVar(&cfg.Keep, "keep", false, "without -self, leave the subscriptions behind (default: delete them at the end)")
	flag.BoolVar(&cfg.Quiet, "quiet", false, "no progress line on stderr")
	flag.StringVar(&cfg.JSON, "json", "", "also write the report as JSON to this file (- for stdout)")
	flag.StringVar(&cfg.Results, "results", "", "write the report's JSON under this directory (loadtest/charts draws its PNG chart and HTML page)")
	flag.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a CPU profile of the two phases to this file (with -self it covers the node too)")
	flag.Parse()
	cfg.Keys = loadcli.Keys(keys)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var self *loadtest.Node
	if cfg.Self {
		fmt.Fprintln(os.Stderr, "subload: starting a node in this process")
		n, err := startSelf(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, "subload:", err)
			return 1
		}
		defer n.Close()
		cfg.URL, cfg.Keys, self = n.URL, n.Keys, n
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "subload:", err)
		return 2
	}
	var pg *pgSampler
	if self != nil {
		pg = &pgSampler{pool: self.Pool()}
	}
	started := time.Now()
	rep, err := run(ctx, cfg, pg, os.Stderr)
	if rep != nil {
		r := loadreport.Report{Scenario: "subscriptions", Started: started, Unit: unit, LagName: lagName,
			EndToEnd: "accepted → notified", Series: rep.series}
		if ferr := loadcli.Finish(rep, cfg.JSON, cfg.Results, r); ferr != nil && err == nil {
			err = ferr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "subload:", err)
		return 1
	}
	return 0
}

// What the progress line and the report's series count.
const (
	unit    = "notifications/s"
	lagName = "observations accepted, not yet notified"
)

// Phases, as the tracker numbers them.
const (
	phaseA int8 = 1
	phaseB int8 = 2
)

// run sets up the subscriptions, runs the phases and returns the report (also when it ends early
// with an error).
// With -self, pg samples the node's Postgres activity during each phase.
func run(ctx context.Context, cfg config, pg *pgSampler, logw io.Writer) (*report, error) {
	hc := loadcli.HTTPClient(cfg.Clients + setupWorkers)
	base := strings.TrimRight(cfg.URL, "/")
	cl := &client{}
	for _, k := range cfg.Keys {
		cl.byKey = append(cl.byKey, &pipelinetest.Client{BaseURL: base, Key: k, HTTP: hc})
	}
	rep := &report{URL: cfg.URL, Self: cfg.Self, Subscriptions: cfg.Subs, Clients: cfg.Clients, Keys: len(cfg.Keys), Batch: cfg.Batch,
		Duration: cfg.Duration.String(), Window: cfg.Window, MaxCount: cfg.MaxCount, Paced: cfg.Paced}

	var rec *loadreport.Recorder
	tr := newTracker(cfg.Subs, func(n int, d time.Duration) { rec.Observe(n, d) })
	rec = loadreport.NewRecorder(loadreport.Options{Unit: unit, LagName: lagName, Quiet: cfg.Quiet,
		Lag: func() float64 { return float64(tr.lag()) }})
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("receiver: %w", err)
	}
	srv := &http.Server{Handler: tr, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	receiver := "http://" + ln.Addr().String()
	rep.Receiver = receiver

	// Set-up: patients, subscriptions, handshakes.
	setupCtx, endSetup := context.WithTimeout(ctx, cfg.SetupTimeout)
	defer endSetup()
	runID := loadcli.RandomHex(4)
	t0 := time.Now()
	fmt.Fprintf(logw, "subload: creating %d patients and a rest-hook subscription for each (receiver %s)\n", cfg.Subs, receiver)
	patients, err := createPatients(setupCtx, cl, cfg.Subs, runID)
	if err != nil {
		return nil, err
	}
	t1 := time.Now()
	subIDs, err := createSubscriptions(setupCtx, cl, tr, patients, receiver, cfg.MaxCount)
	if !cfg.Self && !cfg.Keep {
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			if err := deleteSubscriptions(dctx, cl, subIDs); err != nil {
				fmt.Fprintln(logw, "subload: deleting the subscriptions:", err)
			}
		}()
	}
	if err != nil {
		return nil, err
	}
	t2 := time.Now()
	if err := awaitActive(setupCtx, cl, subIDs, cfg.SetupTimeout, logw); err != nil {
		return nil, err
	}
	t3 := time.Now()
	rep.Setup = setupReport{PatientsSeconds: t1.Sub(t0).Seconds(), SubscriptionsSeconds: t2.Sub(t1).Seconds(), ActiveSeconds: t3.Sub(t2).Seconds()}
	fmt.Fprintf(logw, "subload: %d patients in %.1fs, %d subscriptions in %.1fs, all active %.1fs later\n",
		cfg.Subs, rep.Setup.PatientsSeconds, cfg.Subs, rep.Setup.SubscriptionsSeconds, rep.Setup.ActiveSeconds)

	bodies, subsOf := buildBodies(patients, cfg.Batch)
	ld := &loader{cfg: cfg, hc: hc, base: base, tr: tr, rec: rec, bodies: bodies, subsOf: subsOf}
	metricsURL := base + "/metrics"
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err == nil {
			defer f.Close()
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			return rep, err
		}
		defer pprof.StopCPUProfile()
	}
	rec.Start()
	defer func() { rep.series = rec.Stop(); addEndToEnd(rep.series, rec.Started(), tr) }()

	rate := cfg.Rate
	if rate == 0 {
		fmt.Fprintf(logw, "subload: phase A: %d workers, %d keys, Bundles of %d, as fast as the node takes them (window %d) for %v\n",
			cfg.Clients, len(cfg.Keys), cfg.Batch, cfg.Window, cfg.Duration)
		m0, _ := scrape(ctx, hc, metricsURL)
		var a *phaseReport
		activity := pg.sample(ctx, func() { a = ld.phase(ctx, phaseA, 0) })
		a.Postgres = activity
		m1, _ := scrape(ctx, hc, metricsURL)
		a.Drain = ld.drain(ctx, logw).Seconds()
		a.finish(tr.phase(phaseA), figures(delta(m0, m1)))
		rep.PhaseA = a
		rep.StoredRate = a.NotifiedPerSec
		rate = cfg.Paced * rep.StoredRate
		fmt.Fprintf(logw, "subload: phase A: stored rate %.0f notifications/s (%d observations accepted, %d notified)\n",
			rep.StoredRate, a.Sent, a.Notified)
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	if rate > 0 {
		rep.TargetRate = rate
		fmt.Fprintf(logw, "subload: phase B: %.0f observations/s (%.1f POSTs/s of %d) for %v\n", rate, rate/float64(cfg.Batch), cfg.Batch, cfg.Duration)
		m2, _ := scrape(ctx, hc, metricsURL)
		var b *phaseReport
		activity := pg.sample(ctx, func() { b = ld.phase(ctx, phaseB, rate) })
		b.Postgres = activity
		b.Drain = ld.drain(ctx, logw).Seconds()
		m3, _ := scrape(ctx, hc, metricsURL)
		b.finish(tr.phase(phaseB), figures(delta(m2, m3)))
		rep.PhaseB = b
	}
	rep.Notes = tr.subsTally()
	st := rep.Notes
	switch {
	case ctx.Err() != nil:
		return rep, ctx.Err()
	case st.BadSignature+st.Stale > 0:
		return rep, fmt.Errorf("%d notifications with a bad or stale signature", st.BadSignature+st.Stale)
	case rep.PhaseA != nil && rep.PhaseA.Missing > 0, rep.PhaseB != nil && rep.PhaseB.Missing > 0:
		return rep, fmt.Errorf("observations accepted and never notified within -drain %v: phase A %d, phase B %d",
			cfg.Drain, rep.PhaseA.missing(), rep.PhaseB.missing())
	}
	return rep, nil
}

// addEndToEnd sets the series' accepted → notified percentiles by the second each observation
// was accepted.
func addEndToEnd(points []loadreport.Point, start time.Time, tr *tracker) {
	var sent []float64
	var lat []time.Duration
	for _, ph := range []int8{phaseA, phaseB} {
		t := tr.phase(ph)
		for i, at := range t.SentAt {
			sent = append(sent, at.Sub(start).Seconds())
			lat = append(lat, t.AcceptToNotified[i])
		}
	}
	loadreport.EndToEnd(points, sent, lat)
}

// buildBodies builds the request bodies before the clock starts: body g is a FHIR batch Bundle
// (intake takes an Observation, a Bundle or NDJSON, not a bare JSON array) of -batch heart-rate
// observations of consecutive patients from g×batch (wrapping), so the bodies taken in turn
// spread the load evenly; subsOf[g] are their subscriptions, in order.
func buildBodies(patients []string, batch int) ([][]byte, [][]int32) {
	n := len(patients)
	groups := n / gcd(n, batch)
	bodies, subsOf := make([][]byte, groups), make([][]int32, groups)
	now := time.Now().UTC().Format(time.RFC3339)
	for g := range groups {
		entries := make([]any, batch)
		subs := make([]int32, batch)
		for k := range batch {
			i := (g*batch + k) % n
			subs[k] = int32(i)
			o := map[string]any{"resourceType": "Observation", "status": "final",
				"category":          []any{map[string]any{"coding": []any{map[string]any{"system": "http://terminology.hl7.org/CodeSystem/observation-category", "code": "vital-signs"}}}},
				"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4", "display": "Heart rate"}}},
				"subject":           map[string]any{"reference": "Patient/" + patients[i]},
				"effectiveDateTime": now,
				"valueQuantity":     map[string]any{"value": 60 + (g+k)%40, "unit": "beats/minute", "system": "http://unitsofmeasure.org", "code": "/min"}}
			entries[k] = map[string]any{"resource": o, "request": map[string]any{"method": "POST", "url": "Observation"}}
		}
		bodies[g], _ = json.Marshal(map[string]any{"resourceType": "Bundle", "type": "batch", "entry": entries})
		subsOf[g] = subs
	}
	return bodies, subsOf
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// loader posts the observations of a phase.
type loader struct {
	cfg    config
	hc     *http.Client
	base   string
	tr     *tracker
	rec    *loadreport.Recorder
	bodies [][]byte
	subsOf [][]int32
	next   atomic.Uint64 // body and key taken in turn
}

// phase posts for cfg.Duration, as fast as the window lets (rate 0) or at rate observations/s.
func (l *loader) phase(ctx context.Context, ph int8, rate float64) *phaseReport {
	out := &phaseReport{Duration: l.cfg.Duration.String(), TargetRate: rate}
	pace, stopPace := loadcli.Pace(rate / float64(l.cfg.Batch))
	defer stopPace()
	loadCtx, endLoad := context.WithTimeout(ctx, l.cfg.Duration)
	defer endLoad()
	var (
		requests, failed, refused, rejected, heldNs atomic.Int64
		inflight                                    atomic.Int64 // observations in requests not yet answered
		firstErr                                    atomic.Value
		mu                                          sync.Mutex
		postLat                                     []time.Duration
	)
	began := time.Now()
	// The stored rate: notifications received over the phase's last 80 % (the first 20 % is the
	// pipeline filling up).
	var warm int64
	warmAt := time.AfterFunc(l.cfg.Duration/5, func() { atomic.StoreInt64(&warm, l.tr.notifiedIn(ph)) })
	defer warmAt.Stop()
	var wg sync.WaitGroup
	for range l.cfg.Clients {
		wg.Go(func() {
			var local []time.Duration
			defer func() { mu.Lock(); postLat = append(postLat, local...); mu.Unlock() }()
			for loadCtx.Err() == nil {
				if !loadcli.Wait(loadCtx, pace) {
					return
				}
				if l.cfg.Window > 0 {
					held := time.Now()
					for l.tr.lag()+inflight.Load()+int64(l.cfg.Batch) > int64(l.cfg.Window) && loadCtx.Err() == nil {
						tick.Sleep(loadCtx, 2*time.Millisecond)
					}
					heldNs.Add(int64(time.Since(held)))
					if loadCtx.Err() != nil {
						return
					}
				}
				n := l.next.Add(1)
				g := n % uint64(len(l.bodies))
				key := l.cfg.Keys[n%uint64(len(l.cfg.Keys))]
				inflight.Add(int64(l.cfg.Batch))
				sent := time.Now()
				// A call in flight is measured to its answer, not cut by the end of the phase.
				callCtx, cancel := context.WithTimeout(context.WithoutCancel(loadCtx), 30*time.Second)
				ids, err := l.post(callCtx, key, l.bodies[g])
				cancel()
				at := time.Now()
				if err == nil {
					subs := l.subsOf[g]
					if len(ids) != len(subs) { // some refused: the ids no longer line up with the patients
						rejected.Add(int64(len(subs) - len(ids)))
						subs = make([]int32, len(ids))
						for i := range subs {
							subs[i] = -1
						}
					}
					l.tr.accepted(ph, at, ids, subs)
				}
				inflight.Add(-int64(l.cfg.Batch))
				if wait, ok := refusal(err); ok {
					refused.Add(1)
					l.rec.Refuse(1)
					tick.Sleep(loadCtx, max(wait, 100*time.Millisecond))
					continue
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					tick.Sleep(loadCtx, 50*time.Millisecond)
					continue
				}
				requests.Add(1)
				local = append(local, at.Sub(sent))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(began)
	out.Elapsed = elapsed.Round(time.Millisecond).String()
	window := elapsed - l.cfg.Duration/5
	out.NotifiedPerSec = float64(l.tr.notifiedIn(ph)-atomic.LoadInt64(&warm)) / window.Seconds()
	out.Requests, out.Failed, out.Refused, out.Rejected = requests.Load(), failed.Load(), refused.Load(), rejected.Load()
	out.HeldSeconds = time.Duration(heldNs.Load()).Seconds() / float64(l.cfg.Clients)
	out.PostLatency = loadcli.Ms(postLat)
	out.elapsed = elapsed
	if v, ok := firstErr.Load().(string); ok {
		out.FirstError = v
	}
	return out
}

// post sends one array to POST /v1/observations and returns the accepted ids.
func (l *loader) post(ctx context.Context, key string, body []byte) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.base+"/v1/observations", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/fhir+json")
	resp, err := l.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusAccepted {
		se := &pipelinetest.StatusError{Status: resp.StatusCode, Body: strings.TrimSpace(string(b[:min(len(b), 512)]))}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			se.RetryAfter = time.Duration(s) * time.Second
		}
		return nil, se
	}
	var a struct {
		IDs []string `json:"ids"`
	}
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("decode the 202: %w", err)
	}
	return a.IDs, nil
}

// drain waits (at most -drain) until every accepted observation was notified and returns how
// long it waited.
func (l *loader) drain(ctx context.Context, logw io.Writer) time.Duration {
	began := time.Now()
	end := began.Add(l.cfg.Drain)
	for l.tr.lag() > 0 && time.Now().Before(end) && ctx.Err() == nil {
		tick.Sleep(ctx, 20*time.Millisecond)
	}
	if lag := l.tr.lag(); lag > 0 {
		fmt.Fprintf(logw, "subload: %d observations still not notified %v after the phase\n", lag, l.cfg.Drain)
	}
	return time.Since(began)
}

// report is what a run measured. Latencies are in milliseconds.
type report struct {
	URL           string       `json:"url"`
	Self          bool         `json:"self"`
	Receiver      string       `json:"receiver"`
	Subscriptions int          `json:"subscriptions"` // = patients
	Clients       int          `json:"clients"`
	Keys          int          `json:"keys"`
	Batch         int          `json:"batch"`
	Duration      string       `json:"duration"` // of each phase
	Window        int          `json:"window"`
	MaxCount      int          `json:"maxCount,omitempty"`
	Setup         setupReport  `json:"setup"`
	PhaseA        *phaseReport `json:"phaseA,omitempty"`
	StoredRate    float64      `json:"storedRate"` // notifications/s, phase A's last 80 %
	Paced         float64      `json:"paced"`
	TargetRate    float64      `json:"targetRate"` // phase B's observations/s
	PhaseB        *phaseReport `json:"phaseB,omitempty"`
	Notes         subsTally    `json:"notifications"`
	// series is the run second by second (notifications/s, accepted → notified latency,
	// observations waiting, refused calls), the series loadtest/charts draws.
	series []loadreport.Point
}

type setupReport struct {
	PatientsSeconds      float64 `json:"patientsSeconds"`
	SubscriptionsSeconds float64 `json:"subscriptionsSeconds"`
	ActiveSeconds        float64 `json:"activeSeconds"` // last create → every handshake done
}

// phaseReport is one phase.
type phaseReport struct {
	Duration       string         `json:"duration"`
	TargetRate     float64        `json:"targetRate,omitempty"` // observations/s (0: unpaced)
	Elapsed        string         `json:"elapsed"`
	Requests       int64          `json:"requests"`
	Failed         int64          `json:"failedRequests"`
	Refused        int64          `json:"refusedRequests"`
	Rejected       int64          `json:"rejectedObservations"`
	FirstError     string         `json:"firstError,omitempty"`
	HeldSeconds    float64        `json:"windowHeldSeconds"` // per worker: time waiting for -window's room
	PostLatency    loadcli.MsDist `json:"postMs"`
	Sent           int64          `json:"sent"` // observations accepted (202)
	AcceptedPerSec float64        `json:"acceptedPerSec"`
	Notified       int64          `json:"notified"`
	NotifiedPerSec float64        `json:"notifiedPerSec"` // notifications received over the phase's last 80 %
	Missing        int64          `json:"missing"`        // accepted, never notified within -drain
	Repeated       int64          `json:"notifiedTwice"`  // observations named by more than one notification event
	WrongSub       int64          `json:"wrongSubscription"`
	Drain          float64        `json:"drainSeconds"`
	// Accepted → notified: the 202's receipt to the receipt of the notification naming it; split
	// at the notification event's timestamp (the platform event's creation, when the writer
	// stored the observation) into accepted → event and event → notified.
	AcceptToNotified loadcli.MsDist `json:"acceptToNotifiedMs"`
	AcceptToEvent    loadcli.MsDist `json:"acceptToEventMs"`
	EventToNotified  loadcli.MsDist `json:"eventToNotifiedMs"`
	Node             *nodeFigures   `json:"node,omitempty"` // the node's /metrics over the phase
	// Postgres is -self's sampling of the node's active backends while the phase posted: the
	// statements most often running, with what they waited on.
	Postgres []pgActivity `json:"postgres,omitempty"`

	elapsed time.Duration
}

func (p *phaseReport) finish(t tally, node *nodeFigures) {
	p.Sent, p.Notified, p.Missing, p.Repeated, p.WrongSub = t.Sent, t.Notified, t.Missing, t.Repeated, t.WrongSub
	p.AcceptedPerSec = float64(t.Sent) / p.elapsed.Seconds()
	p.AcceptToNotified, p.AcceptToEvent, p.EventToNotified = loadcli.Ms(t.AcceptToNotified), loadcli.Ms(t.AcceptToEvent), loadcli.Ms(t.EventToNotified)
	p.Node = node
}

func (p *phaseReport) missing() int64 {
	if p == nil {
		return 0
	}
	return p.Missing
}

// Print writes the human summary.
func (r *report) Print(w io.Writer) {
	fmt.Fprintf(w, "subscriptions  %d active rest-hook (observation-created, one patient each, id-only), receiver %s\n", r.Subscriptions, r.Receiver)
	fmt.Fprintf(w, "set-up         patients %.1fs, subscriptions %.1fs, all active %.1fs later\n", r.Setup.PatientsSeconds, r.Setup.SubscriptionsSeconds, r.Setup.ActiveSeconds)
	fmt.Fprintf(w, "load           %d workers on %d keys, Bundles of %d observations, %s a phase, window %d\n", r.Clients, r.Keys, r.Batch, r.Duration, r.Window)
	if r.PhaseA != nil {
		fmt.Fprintf(w, "phase A        unpaced: stored rate %.0f notifications/s\n", r.StoredRate)
		r.PhaseA.print(w)
	}
	if r.PhaseB != nil {
		fmt.Fprintf(w, "phase B        paced at %.0f observations/s (%.0f %% of the stored rate)\n", r.TargetRate, 100*r.Paced)
		r.PhaseB.print(w)
		verdict := "met"
		if r.PhaseB.AcceptToNotified.P99 > 1000 || r.PhaseB.Missing > 0 {
			verdict = "NOT met"
		}
		fmt.Fprintf(w, "issue 57       accepted → notified at %.0f/s: p50 %.1f ms, p99 %.1f ms (goal p99 ≤ 1 s: %s)\n",
			r.TargetRate, r.PhaseB.AcceptToNotified.P50, r.PhaseB.AcceptToNotified.P99, verdict)
	}
	n := r.Notes
	fmt.Fprintf(w, "notifications  %d event notifications carrying %d events (%.1f a POST), %d handshakes, %d heartbeats\n",
		n.Posts, n.Events, n.EventsPerPostMean, n.Handshakes, n.Heartbeats)
	fmt.Fprintf(w, "checks         duplicates %d (event number) / %d (focus), out of order %d, gaps %d, bad signatures %d, stale %d, malformed %d, unknown observations %d\n",
		n.DupNumbers, n.DupFocus, n.OutOfOrder, n.Gaps, n.BadSignature, n.Stale, n.Malformed, n.UnknownObs)
}

func (p *phaseReport) print(w io.Writer) {
	fmt.Fprintf(w, "  posted       %d observations in %d requests over %s (%.0f/s accepted), %d failed, %d refused, %d rejected, window held %.1fs a worker\n",
		p.Sent, p.Requests, p.Elapsed, p.AcceptedPerSec, p.Failed, p.Refused, p.Rejected, p.HeldSeconds)
	if p.FirstError != "" {
		fmt.Fprintf(w, "  first error  %s\n", p.FirstError)
	}
	fmt.Fprintf(w, "  POST 202     %v\n", p.PostLatency)
	fmt.Fprintf(w, "  notified     %d (%.0f/s over the last 80 %%), missing %d, notified twice %d, to the wrong subscription %d; drained in %.1fs\n",
		p.Notified, p.NotifiedPerSec, p.Missing, p.Repeated, p.WrongSub, p.Drain)
	fmt.Fprintf(w, "  accepted→notified  %v\n", p.AcceptToNotified)
	fmt.Fprintf(w, "    accepted→event   %v\n", p.AcceptToEvent)
	fmt.Fprintf(w, "    event→notified   %v\n", p.EventToNotified)
	if f := p.Node; f != nil {
		perBatch := math.NaN()
		if f.NotifierBatches > 0 {
			perBatch = f.NotifierRecords / f.NotifierBatches
		}
		fmt.Fprintf(w, "  node         stored %.0f observations, numbered %.0f events, %.0f notifications sent (%.0f failed); notifier %.0f batches of %.0f records, %.1f ms each\n",
			f.ObservationsStored, f.EventsNumbered, f.NotificationsOK, f.NotificationsFailed, f.NotifierBatches, perBatch, f.NotifierBatchMeanMs)
	}
	for i, a := range p.Postgres {
		if i == 6 {
			break
		}
		fmt.Fprintf(w, "  postgres     %4.2f backends  %-28s %s\n", a.Backends, a.Wait, a.Statement)
	}
}
