// Command webhookload measures webhook delivery end to end under load: it starts a receiver on
// loopback, subscribes it to an event type of its own with POST /v1/webhooks, and C clients
// publish events of that type with POST /v1/events for D seconds against a running carehub node
// (outbox → relay → carehub.events.v1 → webhook dispatcher → the receiver). The receiver verifies
// every delivery's signature (docs/WEBHOOKS.md) and counts each event once. It reports
// deliveries per second, publish → delivered latency, the lag (published, not yet delivered)
// and refusals and failures; see loadtest/README.md.
//
//	webhookload -url http://127.0.0.1:8080 -key chk_live_A,chk_live_B -c 4 -d 30s -rate 200
//
// The node must allow plain-HTTP loopback destinations: carehub serve --webhooks-allow-private
// (make run passes it). The first key needs admin:org (it creates and deletes the webhook), and
// every key exec:workflows (publish calls take them in turn). Load is bounded (duration,
// optional -max and -rate) and loopback only.
//
// With WEBHOOKLOAD_RAW_SENDER in its environment the binary is not the command but the raw
// baseline's sender, which the command starts as a process of its own (raw.go).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"carehub/e2e/pipelinetest"
	"carehub/kernel/tick"
	"carehub/loadtest/loadcli"
	loadreport "carehub/loadtest/report"
	"carehub/loadtest/wsfleet"
	"carehub/processors/webhooks"
)

// config is the command line.
type config struct {
	loadcli.Command
	Listen string // the receiver's address (loopback)
	// The subscription's delivery settings (docs/WEBHOOKS.md); zero values take the node's
	// defaults.
	Ordered     bool
	MaxInFlight int
	HookBatch   int
	RateLimit   int
	Raw         bool   // also POST the same signed bodies straight to a receiver: the baseline
	RawClient   string // the baseline's HTTP client: net/http, or fasthttp (plain http only)
	RawProcess  string // where the baseline's sender runs: rawOwn or rawShared
	// The fleet (fleet.go): Subs subscriptions to the same events (0: one), Slow of them answering
	// after a second and Failing answering 500.
	Subs, Slow, Failing int
	// TLSDir makes the receivers HTTPS with the certificate kept there (tls.go); H1 has them
	// offer HTTP/1.1 only.
	TLSDir string
	H1     bool
}

func (c *config) validate() error {
	errs := []error{c.Command.Validate("at least one API key (the first with admin:org, all with exec:workflows) is required")}
	if c.MaxInFlight < 0 || c.MaxInFlight > webhooks.MaxInFlightPerSubscription {
		errs = append(errs, fmt.Errorf("-max-in-flight %d: must be 0..%d", c.MaxInFlight, webhooks.MaxInFlightPerSubscription))
	}
	if c.HookBatch < 0 || c.HookBatch > webhooks.MaxBatchSize || c.HookBatch > 1 && !c.Ordered {
		errs = append(errs, fmt.Errorf("-hook-batch %d: must be 0..%d, and above 1 only with -ordered", c.HookBatch, webhooks.MaxBatchSize))
	}
	if c.RateLimit < 0 || c.RateLimit > webhooks.MaxRateLimit {
		errs = append(errs, fmt.Errorf("-rate-limit %d: must be 0..%d", c.RateLimit, webhooks.MaxRateLimit))
	}
	if subs := max(c.Subs, 1); c.Subs < 0 || subs > maxSubs || c.Slow < 0 || c.Failing < 0 || c.Slow+c.Failing >= subs {
		errs = append(errs, fmt.Errorf("-subs %d, -slow %d, -failing %d: want 1..%d subscriptions, of which the first stays healthy", c.Subs, c.Slow, c.Failing, maxSubs))
	}
	if c.H1 && c.TLSDir == "" {
		errs = append(errs, errors.New("-h1 needs -tls-dir (plain HTTP is HTTP/1.1 already)"))
	}
	if c.RawClient != rawNetHTTP && c.RawClient != rawFastHTTP || c.RawClient == rawFastHTTP && c.TLSDir != "" {
		errs = append(errs, fmt.Errorf("-raw-client %q: net/http, or fasthttp without -tls-dir", c.RawClient))
	}
	if c.RawProcess != rawOwn && c.RawProcess != rawShared {
		errs = append(errs, fmt.Errorf("-raw-process %q: own or shared", c.RawProcess))
	}
	if host, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("-listen %q: %w", c.Listen, err))
	} else if err := loadcli.LoopbackHost(host); err != nil {
		errs = append(errs, fmt.Errorf("-listen: %w", err))
	}
	return errors.Join(errs...)
}

func main() {
	if os.Getenv(rawSenderEnv) != "" {
		os.Exit(rawSender(os.Stdin, os.Stdout))
	}
	var cfg config
	cfg.Flags(flag.CommandLine, loadcli.Help{
		Key:   "API key(s), comma-separated: the first with admin:org, all with exec:workflows",
		Rate:  "target publish calls per second over all clients (0: as fast as they go)",
		Batch: "events per POST /v1/events call (1..1000)",
		Drain: "after publishing, how long to wait for the deliveries to catch up",
	})
	flag.StringVar(&cfg.Listen, "listen", "127.0.0.1:0", "address of the webhook receiver (loopback; port 0 picks one)")
	flag.BoolVar(&cfg.Ordered, "ordered", false, "subscribe in ordered mode (one POST at a time, in order); the receiver counts events out of order")
	flag.IntVar(&cfg.MaxInFlight, "max-in-flight", 0, "the subscription's maxInFlight, concurrent mode (0: the node's default)")
	flag.IntVar(&cfg.HookBatch, "hook-batch", 0, "the subscription's batchSize, ordered mode: events per POST (0: 1)")
	flag.IntVar(&cfg.RateLimit, "rate-limit", 0, "the subscription's rateLimit, deliveries/s (0: none)")
	flag.IntVar(&cfg.Subs, "subs", 1, "subscriptions to the events, each with the settings above and a receiver of its own")
	flag.IntVar(&cfg.Slow, "slow", 0, "of -subs, how many answer only after a second")
	flag.IntVar(&cfg.Failing, "failing", 0, "of -subs, how many answer 500")
	flag.StringVar(&cfg.TLSDir, "tls-dir", "", "serve the receivers over HTTPS with the certificate in this directory (made if missing); start the node with --webhooks-ca-file DIR/receiver.pem")
	flag.BoolVar(&cfg.H1, "h1", false, "with -tls-dir: the receivers offer HTTP/1.1 only (default: HTTP/2 and HTTP/1.1)")
	flag.BoolVar(&cfg.Raw, "raw", true, "after the run, POST as many signed bodies of the same shape straight to a receiver, at the subscription's concurrency (the baseline)")
	flag.StringVar(&cfg.RawClient, "raw-client", rawNetHTTP, "the baseline's HTTP client: net/http, or fasthttp (the client of carehub's plain http:// attempts; without -tls-dir)")
	flag.StringVar(&cfg.RawProcess, "raw-process", rawOwn, "where the baseline's sender runs: own (a process of its own, as carehub's node is) or shared (the receiver's process, which overstates it)")
	loadcli.Main(&cfg.Command, "webhookload", cfg.validate, func(ctx context.Context) (*report, error) { return run(ctx, cfg, os.Stderr) })
}

// maxSubs bounds -subs.
const maxSubs = 200

// What the progress line and the report's series count.
const (
	unit    = "deliveries/s"
	lagName = "events published, not yet delivered"
)

// webhook is what POST /v1/webhooks answers (the secret only there).
type webhook struct {
	ID          string `json:"id"`
	Secret      string `json:"secret"`
	Ordered     bool   `json:"ordered"`
	MaxInFlight int    `json:"maxInFlight"`
	BatchSize   int    `json:"batchSize"`
}

// run executes one load and returns its report (also when it ends early with an error).
func run(ctx context.Context, cfg config, logw io.Writer) (*report, error) {
	var rtls *receiverTLS
	if cfg.TLSDir != "" { // before anything else: the first run makes the certificate the node needs
		var err error
		if rtls, err = loadReceiverTLS(cfg.TLSDir, cfg.H1); err != nil {
			return nil, err
		}
	}
	hc := loadcli.HTTPClient(cfg.Clients)
	base := strings.TrimRight(cfg.URL, "/")
	admin := &pipelinetest.Client{BaseURL: base, Key: cfg.Keys[0], HTTP: hc}
	project, err := loadcli.ProjectID(ctx, admin, cfg.Project)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("receiver: %w", err)
	}
	defer ln.Close()
	typ := "webhookload.r" + loadcli.RandomHex(5) + ".load"
	receiver := rtls.scheme() + "://" + ln.Addr().String()
	fl, err := subscribe(ctx, admin, cfg, project, typ, receiver)
	defer fl.delete(ctx, admin, logw)
	if err != nil {
		return nil, err
	}
	hook, hookURL := fl.hooks[0], receiver+"/hook/0"

	var rec *loadreport.Recorder
	tr := newTracker(hook.Secret, time.Now, func(d time.Duration) { rec.Observe(1, d) })
	fl.track(tr)
	rec = loadreport.NewRecorder(loadreport.Options{Unit: unit, LagName: lagName, Quiet: cfg.Quiet,
		Lag: func() float64 { return float64(tr.lag()) }})
	srv := &http.Server{Handler: fl, ReadHeaderTimeout: 10 * time.Second}
	go rtls.serve(srv, ln)
	defer srv.Close()
	if err := rtls.checkTrusted(ctx, admin, receiver); err != nil {
		return nil, err
	}

	rep := &report{URL: cfg.URL, Project: project, Type: typ, Webhook: hook.ID, Receiver: hookURL, Clients: cfg.Clients,
		Batch: cfg.Batch, Keys: len(cfg.Keys), Duration: cfg.Duration.String(), TargetRate: cfg.Rate, Protocol: rtls.protocol()}
	fmt.Fprintf(logw, "webhookload: %d clients on %d keys for %v into %s (type %s) → webhook %s at %s\n",
		cfg.Clients, len(cfg.Keys), cfg.Duration, project, typ, hook.ID, hookURL)

	var (
		calls, failed, refused, attempts atomic.Int64
		firstErr                         atomic.Value
	)
	pace, stopPace := loadcli.Pace(cfg.Rate)
	defer stopPace()
	filler := strings.Repeat("x", cfg.Payload)
	batch := newBatchBody(project, typ, filler, cfg.Batch)
	byKey := make([]*pipelinetest.Client, len(cfg.Keys))
	for i, k := range cfg.Keys {
		byKey[i] = &pipelinetest.Client{BaseURL: base, Key: k, HTTP: hc}
	}
	metrics, metricsURL := wsfleet.NewNode(base, 1), base+"/metrics"
	cpu0, cpuOK := sampleCPU(ctx, metrics, metricsURL)
	rec.Start()
	defer rec.Stop()
	loadCtx, endLoad := context.WithTimeout(ctx, cfg.Duration)
	defer endLoad()
	began := time.Now()
	var nextKey atomic.Uint64
	var wg sync.WaitGroup
	for w := range cfg.Clients {
		wg.Go(func() {
			for seq := 0; loadCtx.Err() == nil; seq++ {
				if !loadcli.Wait(loadCtx, pace) {
					return
				}
				if cfg.Max > 0 && attempts.Add(1) > int64(cfg.Max) {
					return
				}
				body := batch.encode(w, seq, time.Now())
				// A call in flight is measured to its answer, not cut by the end of the phase.
				callCtx, cancel := context.WithTimeout(context.WithoutCancel(loadCtx), 30*time.Second)
				n, err := byKey[nextKey.Add(1)%uint64(len(byKey))].PublishEncoded(callCtx, body)
				cancel()
				if err == nil && n != cfg.Batch {
					err = fmt.Errorf("POST /v1/events answered %d events for %d", n, cfg.Batch)
				}
				if wait, ok := refusal(err); ok {
					refused.Add(1)
					rec.Refuse(1)
					tick.Sleep(loadCtx, max(wait, 100*time.Millisecond))
					continue
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					tick.Sleep(loadCtx, 50*time.Millisecond)
					continue
				}
				calls.Add(1)
				fl.published(cfg.Batch)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(began)
	ended := began.Add(elapsed)
	whilePublishing := tr.deliveredSoFar()
	fmt.Fprintf(logw, "webhookload: publishing ended after %v; waiting up to %v for the deliveries\n", elapsed.Round(time.Millisecond), cfg.Drain)
	drainEnd := time.Now().Add(cfg.Drain)
	for fl.lag() > 0 && time.Now().Before(drainEnd) && ctx.Err() == nil {
		tick.Sleep(ctx, 50*time.Millisecond)
	}
	delivering := time.Since(began)
	cpu1, cpuOK1 := sampleCPU(ctx, metrics, metricsURL)
	rep.Series = rec.Stop()
	for _, p := range rep.Series {
		if p.Seconds <= elapsed.Seconds() {
			rep.MostBehind = max(rep.MostBehind, int64(p.Lag))
		}
	}

	t := tr.tally()
	rep.Elapsed = elapsed.Round(time.Millisecond).String()
	rep.Published, rep.Calls, rep.Failed, rep.Refused = t.Published, calls.Load(), failed.Load(), refused.Load()
	rep.PublishedPerSec = float64(t.Published) / elapsed.Seconds()
	rep.Delivered, rep.Duplicates, rep.BadSignature, rep.Stale, rep.Malformed = t.Delivered, t.Duplicates, t.BadSignature, t.Stale, t.Malformed
	rep.OutOfOrder, rep.Ordered, rep.MaxInFlight, rep.HookBatch, rep.RateLimit = t.OutOfOrder, hook.Ordered, hook.MaxInFlight, hook.BatchSize, cfg.RateLimit
	rep.DeliveredPerSec = float64(t.Delivered) / delivering.Seconds()
	rep.DeliveredLive = float64(whilePublishing) / elapsed.Seconds()
	rep.DeliveredAfter = max(t.Delivered-whilePublishing, 0)
	if rep.DeliveredAfter > 0 && t.Last.After(ended) {
		rep.DeliveredDrain = float64(rep.DeliveredAfter) / t.Last.Sub(ended).Seconds()
	}
	if cpuOK && cpuOK1 {
		rep.CPU = cpuBetween(cpu0, cpu1, t.Delivered)
	}
	rep.Latency = loadcli.Ms(t.Latencies)
	rep.Requests, rep.OverHTTP2 = fl.requests.Load(), fl.overHTTP2.Load()
	rep.Undelivered = max(t.Published-t.Delivered, 0)
	if len(fl.hooks) > 1 {
		rep.Fleet = fl.report(delivering)
	}
	if cfg.Raw && t.Delivered > 0 && ctx.Err() == nil {
		conc, size := max(hook.MaxInFlight, 1), 1
		if hook.Ordered {
			conc, size = 1, max(hook.BatchSize, 1)
		}
		fmt.Fprintf(logw, "webhookload: raw baseline: %d signed bodies straight to a receiver, %d at a time, %d a POST, sender process %s\n", t.Delivered, conc, size, cfg.RawProcess)
		job := rawJob{Client: cfg.RawClient, Secret: hook.Secret, Type: typ, N: int(t.Delivered), Conc: conc, Size: size, Filler: filler}
		raw, err := rawBaseline(ctx, rtls, cfg.RawProcess, job, logw)
		if err != nil {
			return rep, fmt.Errorf("raw baseline: %w", err)
		}
		rep.Raw = raw
		rep.RawRatio = rep.DeliveredPerSec / raw.PerSec
		rep.DrainRatio = rep.DeliveredDrain / raw.PerSec
	}
	if v, ok := firstErr.Load().(string); ok {
		rep.FirstError = v
	}
	switch {
	case ctx.Err() != nil:
		return rep, ctx.Err()
	case rep.Undelivered > 0:
		return rep, fmt.Errorf("%d of %d acknowledged events not delivered %v after publishing ended", rep.Undelivered, t.Published, cfg.Drain)
	case rep.Fleet != nil && rep.Fleet.Undelivered > 0:
		return rep, fmt.Errorf("%d deliveries owed to the healthy subscriptions not made %v after publishing ended", rep.Fleet.Undelivered, cfg.Drain)
	case t.BadSignature+t.Stale > 0:
		return rep, fmt.Errorf("%d deliveries with a bad or stale signature", t.BadSignature+t.Stale)
	}
	return rep, nil
}

// refusal reports whether err is the node refusing load (429, or 503 with Retry-After).
func refusal(err error) (time.Duration, bool) {
	if wait, ok := pipelinetest.RateLimited(err); ok {
		return wait, true
	}
	var se *pipelinetest.StatusError
	if errors.As(err, &se) && se.Status == http.StatusServiceUnavailable {
		return se.RetryAfter, true
	}
	return 0, false
}

// report is what a run measured. Latencies are in milliseconds.
type report struct {
	URL             string         `json:"url"`
	Project         string         `json:"project"`
	Type            string         `json:"type"`
	Webhook         string         `json:"webhook"`
	Receiver        string         `json:"receiver"`
	Protocol        string         `json:"protocol"`  // what the receivers offer
	Requests        int64          `json:"requests"`  // POSTs the receivers got
	OverHTTP2       int64          `json:"overHttp2"` // of them, over HTTP/2
	Clients         int            `json:"clients"`
	Keys            int            `json:"keys"`
	Batch           int            `json:"batch"`
	Duration        string         `json:"duration"`
	TargetRate      float64        `json:"targetRate,omitempty"`
	Elapsed         string         `json:"elapsed"`
	Calls           int64          `json:"calls"`
	Published       int64          `json:"published"`
	Failed          int64          `json:"failedCalls"`
	Refused         int64          `json:"refusedCalls"`
	FirstError      string         `json:"firstError,omitempty"`
	PublishedPerSec float64        `json:"publishedPerSec"`
	Delivered       int64          `json:"delivered"`
	DeliveredPerSec float64        `json:"deliveredPerSec"`                // over publishing and drain
	DeliveredLive   float64        `json:"deliveredWhilePublishingPerSec"` // deliveries/s before publishing ended
	DeliveredAfter  int64          `json:"deliveredAfterPublishing"`       // the drain: events delivered after publishing ended
	DeliveredDrain  float64        `json:"deliveredAfterPublishingPerSec"` // their deliveries/s, from the end of publishing to the last delivery
	MostBehind      int64          `json:"mostBehindWhilePublishing"`      // the most events undelivered at a second's sample
	CPU             *cpuReport     `json:"cpuPerEvent,omitempty"`          // the run's CPU by process (cpu.go); absent when unreadable
	Latency         loadcli.MsDist `json:"publishToDeliveredMs"`
	Undelivered     int64          `json:"undelivered"`
	Duplicates      int64          `json:"duplicates"`
	BadSignature    int64          `json:"badSignature"`
	Stale           int64          `json:"staleTimestamp"`
	Malformed       int64          `json:"malformed"`
	OutOfOrder      int64          `json:"outOfOrder"` // first deliveries of a client's event after a later one of it
	Ordered         bool           `json:"ordered"`
	MaxInFlight     int            `json:"maxInFlight"`
	HookBatch       int            `json:"batchSize"`
	RateLimit       int            `json:"rateLimit,omitempty"`
	Raw             *rawReport     `json:"raw,omitempty"`
	RawRatio        float64        `json:"deliveredOverRaw,omitempty"` // deliveries/s ÷ the raw baseline's
	DrainRatio      float64        `json:"drainOverRaw,omitempty"`     // deliveries/s after publishing ÷ the raw baseline's
	Fleet           *fleetReport   `json:"fleet,omitempty"`            // -subs above 1
	// Series is the run second by second (deliveries/s, publish → delivered latency, events
	// published and not yet delivered, refused calls), the series loadtest/charts draws.
	Series []loadreport.Point `json:"-"`
}

// Chart is the report of the run whose series loadtest/charts draws.
func (r *report) Chart() loadreport.Report {
	return loadreport.Report{Scenario: "webhooks", Unit: unit, LagName: lagName, Series: r.Series}
}

func (r *report) Print(w io.Writer) {
	fmt.Fprintf(w, "clients %d on %d keys, batch %d, %s (elapsed %s), webhook %s → %s, %s\n", r.Clients, r.Keys, r.Batch, r.Duration, r.Elapsed, r.Webhook, r.Receiver, r.Protocol)
	fmt.Fprintf(w, "published      %d events in %d calls (%.1f events/s), %d calls failed, %d refused\n",
		r.Published, r.Calls, r.PublishedPerSec, r.Failed, r.Refused)
	if r.FirstError != "" {
		fmt.Fprintf(w, "first error    %s\n", r.FirstError)
	}
	fmt.Fprintf(w, "delivered      %d (%.1f/s), %d undelivered, %d duplicates, %d bad signatures, %d stale, %d malformed\n",
		r.Delivered, r.DeliveredPerSec, r.Undelivered, r.Duplicates, r.BadSignature, r.Stale, r.Malformed)
	fmt.Fprintf(w, "while publishing %.1f delivered/s, at most %d events behind (%.2f s of publishing)\n",
		r.DeliveredLive, r.MostBehind, float64(r.MostBehind)/max(r.PublishedPerSec, 1))
	fmt.Fprintf(w, "after publishing %.1f delivered/s (the drain: %d events)\n", r.DeliveredDrain, r.DeliveredAfter)
	if c := r.CPU; c != nil {
		fmt.Fprintf(w, "cpu an event   node %.1f µs, webhookload %.1f µs (publishing and receiving), the rest of the machine %.1f µs (Postgres, …); %.2f cores idle\n",
			c.NodeUs, c.Webhookload, c.RestUs, c.IdleCores)
	}
	fmt.Fprintf(w, "publish→hook   %v\n", r.Latency)
	fmt.Fprintf(w, "requests       %d to the receivers, %d of them over HTTP/2\n", r.Requests, r.OverHTTP2)
	mode := fmt.Sprintf("concurrent, maxInFlight %d", r.MaxInFlight)
	if r.Ordered {
		mode = fmt.Sprintf("ordered, batchSize %d", r.HookBatch)
	}
	if r.RateLimit > 0 {
		mode += fmt.Sprintf(", rateLimit %d/s", r.RateLimit)
	}
	fmt.Fprintf(w, "subscription   %s; %d events out of order\n", mode, r.OutOfOrder)
	if r.Raw != nil {
		where := "in its own process"
		if r.Raw.Process == rawShared {
			where = "in the receiver's process"
		}
		drain := ""
		if r.DrainRatio > 0 {
			drain = fmt.Sprintf(", drain ÷ raw %.3f", r.DrainRatio)
		}
		cpu := ""
		if r.Raw.CPUUs > 0 {
			cpu = fmt.Sprintf(" (%.1f µs of CPU an event, sender and receiver)", r.Raw.CPUUs)
		}
		fmt.Fprintf(w, "raw baseline   %d events in %d POSTs, %d at a time through %s, sender %s: %.1f events/s%s, POST %v; carehub ÷ raw %.3f%s\n",
			r.Raw.Events, r.Raw.Posts, r.Raw.Concurrency, r.Raw.Client, where, r.Raw.PerSec, cpu, r.Raw.Latency, r.RawRatio, drain)
	}
	if r.Fleet != nil {
		r.Fleet.Print(w)
	}
}
