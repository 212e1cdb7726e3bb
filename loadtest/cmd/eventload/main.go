// Command eventload measures the event pipeline end to end under load: C clients publish events
// with the GraphQL mutation publishEvent for D seconds against a running carehub node, while a
// reader samples how long published events take to appear in GET /v1/events (outbox → relay →
// carehub.events.v1 → event log writer → event log). It reports publishes per second, the
// publish call's latency and the sampled publish → visible latency; see loadtest/README.md.
//
//	eventload -url http://127.0.0.1:8080 -key chk_live_A,chk_live_B,chk_live_C -c 8 -d 30s
//
// Load is bounded (duration, optional -max and -rate) and loopback only. Rate limits are per
// key (50/s, burst 100 by default), so pass several keys with exec:workflows: publish calls take
// them in turn (so n keys allow about n × 50 publishes/s), and with two keys or more the reader
// gets the last one to itself. A 429 is counted, honoured (Retry-After) and not reported as a
// publish; a run with 429s measured the limit, not the server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"carehub/e2e/pipelinetest"
	"carehub/kernel/access"
	"carehub/kernel/tick"
	"carehub/loadtest"
	"carehub/loadtest/loadcli"
	loadreport "carehub/loadtest/report"
)

// config is the command line.
type config struct {
	loadcli.Command
	Sample int // every Sample-th publish of each client is sampled for visibility
	Poll   time.Duration
	Export bool // after the run, download its events with GET /v1/events/export
}

func (c *config) validate() error {
	errs := []error{c.Command.Validate("at least one API key with exec:workflows is required")}
	if c.Sample < 1 {
		errs = append(errs, fmt.Errorf("-sample %d: must be at least 1", c.Sample))
	}
	if c.Poll < 5*time.Millisecond {
		errs = append(errs, fmt.Errorf("-poll %v: at least 5ms", c.Poll))
	}
	return errors.Join(errs...)
}

func main() { os.Exit(eventload()) }

// eventload runs the command and returns its exit code (after the -self node stopped).
func eventload() int {
	var cfg config
	cfg.Flags(flag.CommandLine, loadcli.Help{
		Key:   "API key(s) with exec:workflows, comma-separated",
		Rate:  "target publishes per second over all clients (0: as fast as they go)",
		Batch: "events per call: 1 uses GraphQL publishEvent, 2..1000 an array to POST /v1/events",
		Drain: "after publishing, how long to wait for the log to catch up",
	})
	flag.IntVar(&cfg.Sample, "sample", 20, "sample every n-th publish of each client for publish → visible latency")
	flag.BoolVar(&cfg.Export, "export", false, "after the run, download its events with GET /v1/events/export as NDJSON, CSV and gzipped NDJSON, and report each download's rate end to end")
	flag.DurationVar(&cfg.Poll, "poll", 25*time.Millisecond, "pause between two reads of GET /v1/events (the visibility measurement's resolution)")
	self := flag.Bool("self", false, "start a carehub node in this process (embedded defaults, data under a new directory in /tmp, removed after) with keys of its own, and load it (-url and -key are ignored)")
	suite := flag.Bool("suite", false, "run the event pipeline's figures one after another, each for -d: publish → log at 10/s, single publishEvent unpaced and at 80 %, arrays of 1,000 unpaced and at 80 % of the rate the log took in (-c, -rate, -sample, -batch are set per run)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file (with -self it covers the node too)")
	cfg.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *self {
		n, err := startSelf(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, "eventload:", err)
			return 1
		}
		defer n.Close()
		cfg.URL, cfg.Keys = n.URL, n.Keys
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "eventload:", err)
		return 2
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			defer f.Close()
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "eventload:", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	started := time.Now()
	var (
		rep    loadcli.Printer
		series []loadreport.Point
		err    error
	)
	scenario := "events"
	if *suite {
		scenario = "events-suite"
		var s *suiteReport
		s, err = runSuite(ctx, cfg, os.Stderr)
		rep, series = s, s.series
	} else {
		var r *report
		r, err = run(ctx, cfg, os.Stderr)
		if r != nil {
			rep, series = r, r.Series
		}
	}
	if rep != nil {
		if ferr := loadcli.Finish(rep, cfg.JSON, cfg.Results, loadreport.Report{Scenario: scenario, Started: started, Unit: "events/s",
			LagName: "samples not yet in the log", EndToEnd: "publish → log", Series: series}); ferr != nil && err == nil {
			err = ferr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "eventload:", err)
		return 1
	}
	return 0
}

// selfKeys is how many keys -self creates: the per-key limit (50/s) times this is the most a
// run can publish, far above what one node does on a small machine.
const selfKeys = 120

// startSelf starts the -self node under a new directory in /tmp, removed when it closes.
func startSelf(ctx context.Context) (*loadtest.Node, error) {
	return loadtest.StartTempNode(ctx, "carehub-eventload-", selfKeys, nil, access.ExecWorkflows)
}

// sample is one publish whose visibility is measured.
type sample struct {
	id   string
	sent time.Time
	seen time.Time
}

// run executes one load and returns its report (also when it ends early with an error).
func run(ctx context.Context, cfg config, logw io.Writer) (*report, error) {
	hc := loadcli.HTTPClient(cfg.Clients)
	readerKey, pubKeys := cfg.Keys[len(cfg.Keys)-1], cfg.Keys
	if len(cfg.Keys) > 1 {
		pubKeys = cfg.Keys[:len(cfg.Keys)-1]
	}
	reader := &pipelinetest.Client{BaseURL: strings.TrimRight(cfg.URL, "/"), Key: readerKey, HTTP: hc}
	project, err := loadcli.ProjectID(ctx, reader, cfg.Project)
	if err != nil {
		return nil, err
	}
	// Two types unique to this run: bulk events, and the sampled ones, which the reader can then
	// select without paging through the bulk.
	runID := loadcli.RandomHex(5)
	bulkType, sampleType := "eventload.r"+runID+".bulk", "eventload.r"+runID+".sample"
	filler := strings.Repeat("x", cfg.Payload)

	rep := &report{URL: cfg.URL, Project: project, Clients: cfg.Clients, Batch: cfg.Batch, Keys: len(pubKeys), ReaderKeyShared: len(cfg.Keys) == 1,
		Duration: cfg.Duration.String(), TargetRate: cfg.Rate, Types: []string{bulkType, sampleType}}
	fmt.Fprintf(logw, "eventload: %d clients on %d publishing keys for %v into %s (types %s, %s)\n",
		cfg.Clients, len(pubKeys), cfg.Duration, project, bulkType, sampleType)

	var (
		mu        sync.Mutex
		samples   []*sample
		callTimes []time.Duration // successful publish calls
		calls     atomic.Int64    // successful
		published atomic.Int64    // events of successful calls
		failed    atomic.Int64
		limited   atomic.Int64
		attempts  atomic.Int64
		firstErr  atomic.Value
	)
	pace, stopPace := loadcli.Pace(cfg.Rate)
	defer stopPace()
	rec := loadreport.NewRecorder(loadreport.Options{Unit: "events/s", LagName: "samples not yet in the log", Quiet: cfg.Quiet,
		Lag: func() float64 {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, s := range samples {
				if s.id != "" && s.seen.IsZero() {
					n++
				}
			}
			return float64(n)
		}})
	rec.Start()
	defer rec.Stop()
	loadCtx, endLoad := context.WithTimeout(ctx, cfg.Duration)
	defer endLoad()
	began := time.Now()
	// Each call takes the next key, so the load spreads over every key whatever the number of
	// clients, and the per-key limit caps the run only past len(pubKeys) × 50/s.
	byKey := make([]*pipelinetest.Client, len(pubKeys))
	for i, k := range pubKeys {
		byKey[i] = &pipelinetest.Client{BaseURL: reader.BaseURL, Key: k, HTTP: hc}
	}
	var nextKey atomic.Uint64
	var wg sync.WaitGroup
	for w := range cfg.Clients {
		wg.Go(func() {
			var local []time.Duration
			defer func() { mu.Lock(); callTimes = append(callTimes, local...); mu.Unlock() }()
			for seq := 0; loadCtx.Err() == nil; seq++ {
				if !loadcli.Wait(loadCtx, pace) {
					return
				}
				if cfg.Max > 0 && attempts.Add(1) > int64(cfg.Max) {
					return
				}
				typ, sm := bulkType, (*sample)(nil)
				if seq%cfg.Sample == 0 {
					typ, sm = sampleType, &sample{}
				}
				body := map[string]any{"client": w, "seq": seq}
				if filler != "" {
					body["filler"] = filler
				}
				// The call itself is not cut by the end of the phase: a publish in flight is
				// measured to its answer.
				callCtx, cancel := context.WithTimeout(context.WithoutCancel(loadCtx), 30*time.Second)
				sent := time.Now()
				if sm != nil {
					sm.sent = sent
					mu.Lock()
					samples = append(samples, sm)
					mu.Unlock()
				}
				c := byKey[nextKey.Add(1)%uint64(len(byKey))]
				p, err := publish(callCtx, c, project, typ, bulkType, body, cfg.Batch)
				took := time.Since(sent)
				cancel()
				if wait, ok := pipelinetest.RateLimited(err); ok {
					limited.Add(1)
					rec.Refuse(1)
					if sm != nil {
						mu.Lock()
						sm.sent = time.Time{} // not published: never to be seen
						mu.Unlock()
					}
					tick.Sleep(loadCtx, max(wait, 100*time.Millisecond))
					continue
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					if sm != nil {
						mu.Lock()
						sm.sent = time.Time{}
						mu.Unlock()
					}
					tick.Sleep(loadCtx, 50*time.Millisecond)
					continue
				}
				published.Add(int64(cfg.Batch))
				calls.Add(1)
				local = append(local, took)
				rec.Observe(cfg.Batch, took)
				if sm != nil {
					mu.Lock()
					sm.id = p.ID
					mu.Unlock()
				}
			}
		})
	}

	// The reader: the sampled events created since the oldest unseen sample, every Poll, until
	// every sample is seen or the drain ends.
	readerDone := make(chan error, 1)
	publishingDone := make(chan struct{})
	var readErrors int
	var readTimes []time.Duration // one per read; the reader's own goroutine only, read after readerDone
	go func() {
		var drainEnd <-chan time.Time
		for {
			mu.Lock()
			var oldest time.Time
			unseen := 0
			byID := map[string]*sample{}
			for _, s := range samples {
				if s.sent.IsZero() || !s.seen.IsZero() {
					continue
				}
				unseen++
				if oldest.IsZero() || s.sent.Before(oldest) {
					oldest = s.sent
				}
				if s.id != "" {
					byID[s.id] = s
				}
			}
			mu.Unlock()
			select {
			case <-publishingDone:
				if unseen == 0 {
					readerDone <- nil
					return
				}
				if drainEnd == nil {
					drainEnd = time.After(cfg.Drain)
				}
			default:
			}
			select {
			case <-drainEnd:
				readerDone <- fmt.Errorf("%d sampled events not visible %v after publishing ended", unseen, cfg.Drain)
				return
			case <-ctx.Done():
				readerDone <- ctx.Err()
				return
			default:
			}
			if unseen > 0 {
				rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				readAt := time.Now()
				evs, _, _, err := reader.AllEvents(rctx, pipelinetest.Query{ProjectID: project, Type: sampleType,
					Since: oldest.Add(-100 * time.Millisecond), Limit: 1000}, 50)
				cancel()
				now := time.Now()
				readTimes = append(readTimes, now.Sub(readAt))
				if err != nil {
					readErrors++
				}
				mu.Lock()
				for _, ev := range evs {
					if s := byID[ev.ID]; s != nil && s.seen.IsZero() {
						s.seen = now
					}
				}
				mu.Unlock()
			}
			tick.Sleep(ctx, cfg.Poll)
		}
	}()

	wg.Wait()
	elapsed := time.Since(began)
	close(publishingDone)
	fmt.Fprintf(logw, "eventload: publishing ended after %v; waiting up to %v for the log\n", elapsed.Round(time.Millisecond), cfg.Drain)
	readErr := <-readerDone
	rep.Series = rec.Stop()

	mu.Lock()
	var (
		visible []time.Duration
		sentAt  []float64 // seconds since the recorder's start, for the series' publish → log
	)
	unseen := 0
	var lastSeen time.Time
	sent, seenWhilePublishing := 0, 0
	for _, s := range samples {
		if !s.sent.IsZero() {
			sent++
		}
		switch {
		case s.sent.IsZero():
		case s.seen.IsZero():
			unseen++
		default:
			visible = append(visible, s.seen.Sub(s.sent))
			sentAt = append(sentAt, s.sent.Sub(rec.Started()).Seconds())
			if s.seen.After(lastSeen) {
				lastSeen = s.seen
			}
			if !s.seen.After(began.Add(elapsed)) {
				seenWhilePublishing++
			}
		}
	}
	loadreport.EndToEnd(rep.Series, sentAt, visible)
	callDist, visDist := loadcli.Ms(callTimes), loadcli.Ms(visible)
	mu.Unlock()

	rep.Elapsed = elapsed.Round(time.Millisecond).String()
	rep.Published, rep.Failed, rep.RateLimited = published.Load(), failed.Load(), limited.Load()
	rep.PublishesPerSec = float64(rep.Published) / elapsed.Seconds()
	rep.CallsPerSec = float64(calls.Load()) / elapsed.Seconds()
	if unseen == 0 && !lastSeen.IsZero() {
		rep.LoggedPerSec = float64(rep.Published) / lastSeen.Sub(began).Seconds()
	}
	if sent > 0 {
		rep.LoggedWhilePublishingPerSec = float64(rep.Published) * float64(seenWhilePublishing) / float64(sent) / elapsed.Seconds()
	}
	rep.Publish = callDist
	rep.Visible = visDist
	rep.Unseen, rep.Reads, rep.ReadErrors = unseen, len(readTimes), readErrors
	rep.Read = loadcli.Ms(readTimes)
	if v, ok := firstErr.Load().(string); ok {
		rep.FirstError = v
	}

	// Everything acknowledged, sampled or not, must reach the log: count both types.
	var inLog int64
	deadline := time.Now().Add(cfg.Drain)
	for {
		inLog = 0
		var err error
		for _, typ := range rep.Types {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			p, perr := reader.Events(cctx, pipelinetest.Query{ProjectID: project, Type: typ, Limit: 1})
			cancel()
			if perr != nil {
				err = perr
				break
			}
			inLog += p.Total
		}
		if err == nil && inLog >= rep.Published || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		tick.Sleep(ctx, 250*time.Millisecond)
	}
	rep.InLog = inLog
	switch {
	case readErr != nil:
		return rep, readErr
	case inLog < rep.Published:
		return rep, fmt.Errorf("only %d of %d acknowledged events in the log %v after publishing ended", inLog, rep.Published, cfg.Drain)
	}
	if cfg.Export {
		fmt.Fprintf(logw, "eventload: exporting the %d events\n", inLog)
		rep.Exports, err = measureExports(ctx, hc, reader.BaseURL, readerKey, project, rep.Types, inLog)
		return rep, err
	}
	return rep, nil
}

// report is what a run measured. Latencies are in milliseconds.
type report struct {
	URL             string   `json:"url"`
	Project         string   `json:"project"`
	Types           []string `json:"types"`
	Clients         int      `json:"clients"`
	Keys            int      `json:"publishingKeys"`
	ReaderKeyShared bool     `json:"readerKeyShared"`
	Duration        string   `json:"duration"`
	TargetRate      float64  `json:"targetRate,omitempty"`
	Elapsed         string   `json:"elapsed"`
	Published       int64    `json:"published"`
	Failed          int64    `json:"failed"`
	RateLimited     int64    `json:"rateLimited"`
	FirstError      string   `json:"firstError,omitempty"`
	Batch           int      `json:"batch"`
	PublishesPerSec float64  `json:"publishesPerSec"` // events
	CallsPerSec     float64  `json:"callsPerSec"`
	// LoggedPerSec is the events published ÷ the time from the start until the last sample
	// was visible in the log: the rate into the log, drain included (0 when a sample was not
	// seen). It is the log's rate when the samples include the last calls (-sample 1).
	LoggedPerSec float64 `json:"loggedPerSec,omitempty"`
	// LoggedWhilePublishingPerSec is the log's rate while the load ran: the events published,
	// times the share of samples visible by the time publishing ended, ÷ the run's length. With
	// -sample 1 it is the rate the log keeps up with while intake takes the load too, which an
	// unpaced run's LoggedPerSec overstates when intake outruns the log: its drain has the
	// machine to itself.
	LoggedWhilePublishingPerSec float64        `json:"loggedWhilePublishingPerSec,omitempty"`
	Publish                     loadcli.MsDist `json:"publishMs"`
	Visible                     loadcli.MsDist `json:"publishToVisibleMs"`
	Unseen                      int            `json:"sampledUnseen"`
	Reads                       int            `json:"logReads"`
	ReadErrors                  int            `json:"logReadErrors"`
	// Read is how long the reader's reads took: a sample is seen when the read that returns it
	// ends, so a slow read adds to publish→log.
	Read    loadcli.MsDist `json:"logReadMs"`
	InLog   int64          `json:"inLog"`
	Exports []exportFigure `json:"exports,omitempty"` // with -export
	// Series is the run second by second (events/s acknowledged, publish call latency, sampled
	// events not yet visible in the log), the series loadtest/charts draws.
	Series []loadreport.Point `json:"-"`
}

func (r *report) Print(w io.Writer) {
	fmt.Fprintf(w, "clients %d on %d publishing keys (reader key %s), %s (elapsed %s)\n", r.Clients, r.Keys,
		map[bool]string{true: "shared", false: "own"}[r.ReaderKeyShared], r.Duration, r.Elapsed)
	fmt.Fprintf(w, "published      %d events ok, %d calls failed, %d rate limited  →  %.1f events/s in %.1f calls/s of %d\n",
		r.Published, r.Failed, r.RateLimited, r.PublishesPerSec, r.CallsPerSec, r.Batch)
	if r.FirstError != "" {
		fmt.Fprintf(w, "first error    %s\n", r.FirstError)
	}
	fmt.Fprintf(w, "publish call   %v\n", r.Publish)
	fmt.Fprintf(w, "publish→log    %v (sampled; %d unseen; %d reads, %d failed)\n", r.Visible, r.Unseen, r.Reads, r.ReadErrors)
	fmt.Fprintf(w, "log reads      %v\n", r.Read)
	if r.LoggedPerSec > 0 {
		fmt.Fprintf(w, "into the log   %.1f events/s (published ÷ start to the last sample visible); %.1f events/s while publishing\n",
			r.LoggedPerSec, r.LoggedWhilePublishingPerSec)
	}
	fmt.Fprintf(w, "in the log     %d of %d acknowledged\n", r.InLog, r.Published)
	for _, e := range r.Exports {
		fmt.Fprintf(w, "export %-11s %d events, %.1f MB in %.2fs: %.0f events/s, %.1f MB/s (first byte %.1f ms)\n",
			e.Format, e.Events, float64(e.Bytes)/1e6, e.Seconds, e.EventsPerSec, e.MBytesPerSec, e.FirstByteMs)
	}
}

// publish makes one call: publishEvent for batch 1, else POST /v1/events with an array whose
// first event is of typ (the sample type when sampled) and the others of bulk. It returns what
// was answered for the first event.
func publish(ctx context.Context, c *pipelinetest.Client, project, typ, bulk string, payload map[string]any, batch int) (pipelinetest.Published, error) {
	if batch == 1 {
		return c.Publish(ctx, project, typ, payload)
	}
	drafts := make([]pipelinetest.Draft, batch)
	for i := range drafts {
		drafts[i] = pipelinetest.Draft{Type: bulk, Payload: payload}
	}
	drafts[0].Type = typ
	ps, err := c.PublishBatch(ctx, project, drafts)
	if err != nil {
		return pipelinetest.Published{}, err
	}
	return ps[0], nil
}
