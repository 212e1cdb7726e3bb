package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"carehub/e2e/pipelinetest"
	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/kernel/clinical"
	"carehub/loadtest"
	"carehub/loadtest/loadcli"
	"carehub/models"
	"carehub/storage/demo"
	"carehub/storage/postgres"
)

// Phase e, stream scoring (issue 54): how long an observation carehub accepted takes to reach
// the event log as the deployment.prediction of a deployment scoring the observation stream
// (createDeployment scoreStream), and to come back to a client, at a fraction (80 %) of the
// rate the node sustains with that deployment running (observations stored, their events and
// predictions logged); and the rates.
//
// The subscriber's latency is accept → received, per observation: from the 202 of POST /v1/observations
// (whose answer lists the accepted observation ids) to the arrival, on a GraphQL eventStream
// subscription over WebSocket filtered to deployment.prediction, of the prediction naming that
// observation. It includes everything in between: intake's commit to Kafka (done by the 202),
// the observation writer storing the batch and producing its device.observation_received
// events, the scorer's consumer group reading them, the latest-vitals query, the model run and
// the predictions' produce (acks=all), the node's fan-out reading the events topic, the
// subscription's tenancy check and PHI serving (a key with read:patients and read:observations,
// a client that reads the probability) and the socket write. The log's is accept → the
// prediction's logged_at, read from the event log after the window. "accept → emitted" splits
// both at the
// prediction's timestamp, which the scorer sets after the model ran (the same clock: one
// process).

// streamConfig is phase e's shape (flags -stream-*).
type streamConfig struct {
	Devices    int           // concurrent posters
	Batch      int           // observations per request
	Patients   int           // of the demo organization, readings spread over them
	Replicas   int           // of the scoring deployment
	Fraction   float64       // of the stored rate, for the paced window
	RateWindow time.Duration // unpaced: the stored rate
	Window     time.Duration // paced: the latency
	Drain      time.Duration // wait for stores and predictions after a window
}

func (c *streamConfig) flags(fs *flag.FlagSet) {
	fs.IntVar(&c.Devices, "stream-devices", 16, "phase e: devices posting observations concurrently")
	fs.IntVar(&c.Batch, "stream-batch", 100, "phase e: observations per request (a FHIR batch Bundle)")
	fs.IntVar(&c.Patients, "stream-patients", 200, "phase e: demo patients the readings are spread over")
	fs.IntVar(&c.Replicas, "stream-replicas", 2, "phase e: replicas of the scoring deployment")
	fs.Float64Var(&c.Fraction, "stream-fraction", 0.8, "phase e: the paced window's rate, as a fraction of the stored rate")
	fs.DurationVar(&c.RateWindow, "stream-rate-window", 20*time.Second, "phase e: the unpaced window that measures the stored rate")
	fs.DurationVar(&c.Window, "stream-window", 30*time.Second, "phase e: the paced window that measures accept → prediction")
	fs.DurationVar(&c.Drain, "stream-drain", 30*time.Second, "phase e: after a window, how long to wait for its observations to be stored and scored")
}

func (c *streamConfig) validate() error {
	var errs []error
	check := func(ok bool, f string, a ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(f, a...))
		}
	}
	check(c.Devices >= 1 && c.Devices <= loadtest.MaxDevices, "-stream-devices %d: must be 1..%d", c.Devices, loadtest.MaxDevices)
	check(c.Batch >= 1 && c.Batch <= 1000, "-stream-batch %d: must be 1..1000", c.Batch)
	check(c.Patients >= 1 && c.Patients <= 10_000, "-stream-patients %d: must be 1..10000", c.Patients)
	check(c.Replicas >= 1 && c.Replicas <= 16, "-stream-replicas %d: must be 1..16", c.Replicas)
	check(c.Fraction > 0 && c.Fraction <= 1, "-stream-fraction %v: must be in (0, 1]", c.Fraction)
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"-stream-rate-window", c.RateWindow}, {"-stream-window", c.Window}, {"-stream-drain", c.Drain}} {
		check(d.d >= time.Second && d.d <= maxDuration, "%s %v: must be 1s..%v", d.name, d.d, maxDuration)
	}
	return errors.Join(errs...)
}

// streamBench is phase e's figures. Latencies in milliseconds.
type streamBench struct {
	Deployment string  `json:"deployment,omitempty"`
	Replicas   int     `json:"replicas"`
	Devices    int     `json:"devices"`
	Batch      int     `json:"batch"`
	Patients   int     `json:"patients"`
	Fraction   float64 `json:"fraction"`
	// StoredPerSecond is the rate the node stored observations at, devices unpaced, with the
	// scoring deployment running: stored ÷ (window + the drain until all was stored).
	StoredPerSecond float64 `json:"storedPerSecond"`
	// LoggedPerSecond is the rate the whole pipeline sustained: the rate window's stored
	// observations ÷ (window + the drain until their observation and prediction events were all
	// in the event log). The paced window runs at Fraction of it.
	LoggedPerSecond float64       `json:"loggedPerSecond"`
	Rate            *streamWindow `json:"rateWindow,omitempty"`
	Paced           *streamWindow `json:"paced,omitempty"`
	Duplicates      int64         `json:"duplicatePredictions,omitempty"` // a prediction of an observation already seen
	Error           string        `json:"error,omitempty"`
}

// streamWindow is one window of phase e.
type streamWindow struct {
	OfferedPerSecond  float64 `json:"offeredPerSecond,omitempty"` // 0: unpaced
	Seconds           float64 `json:"seconds"`
	Requests          int64   `json:"requests"`
	Accepted          int64   `json:"accepted"` // observations
	Refused           int64   `json:"refused"`  // 429 and 503 answers
	Failed            int64   `json:"failed"`   // other answers and transport errors
	FirstFailure      string  `json:"firstFailure,omitempty"`
	AcceptedPerSecond float64 `json:"acceptedPerSecond"`
	Stored            float64 `json:"stored"`                    // carehub_observations_stored_total, window and drain
	StoredDrain       float64 `json:"storedDrainSeconds"`        // after the posting, until all accepted was stored
	LogDrain          float64 `json:"logDrainSeconds,omitempty"` // after the posting, until the event log held every prediction
	// Emitted is what the scorer emitted (carehub_deployments_stream_predictions_total) from the
	// window's start until all was emitted or the drain ended; EmitDrain how long after the
	// posting that took: the backlog of the writer and the scorer.
	Emitted          float64 `json:"emitted"`
	EmitDrain        float64 `json:"emitDrainSeconds"`
	EmittedPerSecond float64 `json:"emittedPerSecond"` // emitted ÷ (window + EmitDrain): the scorer's pace
	// The subscriber's figures (the paced window only): the accepted observations whose
	// prediction reached it, those whose had not when the drain ended, and how often the
	// server dropped the subscription (fell behind: fan-out buffer or socket), which it then
	// opened again, as a graphql-ws client does on 4008.
	Predictions int64           `json:"predictions,omitempty"`
	Missing     int64           `json:"missing,omitempty"`
	Drops       int64           `json:"subscriptionDrops,omitempty"`
	DropReason  string          `json:"subscriptionDropReason,omitempty"`
	SlowDropped float64         `json:"fanoutSlowDropped,omitempty"` // carehub_fanout_slow_subscribers_dropped_total
	Latency     *loadcli.MsDist `json:"acceptToPredictionMs,omitempty"`
	ToEmitted   *loadcli.MsDist `json:"acceptToEmittedMs,omitempty"`
	// ToLogged is accept → the prediction event in the event log (its logged_at, which is the
	// log writer's transaction start, a little before its commit), for every accepted
	// observation of the window whose prediction the log held when the drain ended
	// (LoggedPredictions of them): the figure, independent of the subscriber.
	ToLogged          *loadcli.MsDist `json:"acceptToLoggedMs,omitempty"`
	LoggedPredictions int64           `json:"loggedPredictions,omitempty"`
	ProcessCores      float64         `json:"processCores"` // this process (node and clients) in the window
	MachineBusyPct    float64         `json:"machineBusyPct,omitempty"`
	MachineStealPct   float64         `json:"machineStealPct,omitempty"`
	end               time.Time       // of the posting
}

// Windows of the tracker.
const (
	windowPrime = iota // every patient's five vitals, before the measurement
	windowRate
	windowPaced
	windows
)

// streamRun is what phase e's steps share.
type streamRun struct {
	cfg      streamConfig
	n        *selfNode
	hc       *http.Client
	logw     io.Writer
	writeKey string
	readKey  string
	project  string
	patients []string
	tr       *tracker
}

// runStream runs phase e on node n; its error is in the figures.
func runStream(ctx context.Context, n *selfNode, cfg streamConfig, logw io.Writer) *streamBench {
	b := &streamBench{Replicas: cfg.Replicas, Devices: cfg.Devices, Batch: cfg.Batch, Patients: cfg.Patients, Fraction: cfg.Fraction}
	hc := loadcli.HTTPClient(cfg.Devices)
	defer hc.CloseIdleConnections()
	s := &streamRun{cfg: cfg, n: n, hc: hc, logw: logw}
	err := s.run(ctx, b)
	if s.tr != nil {
		b.Duplicates = s.tr.duplicates()
	}
	if err != nil {
		b.Error = err.Error()
	}
	return b
}

func (s *streamRun) run(ctx context.Context, b *streamBench) error {
	if err := s.setup(ctx, b); err != nil {
		return err
	}
	if err := s.prime(ctx); err != nil {
		return err
	}
	bodies := s.bodies(s.primeBodies(), min(max(2*s.cfg.Devices, 8), 48))
	fmt.Fprintf(s.logw, "inferload: phase e: %d devices unpaced for %v (stored rate with scoring)\n", s.cfg.Devices, s.cfg.RateWindow)
	var err error
	if b.Rate, err = s.rateWindow(ctx, bodies); err != nil {
		return err
	}
	b.StoredPerSecond = b.Rate.Stored / (b.Rate.Seconds + b.Rate.StoredDrain)
	// The window's events (observations' and predictions') may still be on their way to the
	// log: the rate the whole pipeline sustains is the lower one, and the paced window must not
	// start on a backlog.
	if err := s.logCaughtUp(ctx); err != nil {
		return err
	}
	b.Rate.LogDrain = time.Since(b.Rate.end).Seconds()
	b.LoggedPerSecond = b.Rate.Stored / (b.Rate.Seconds + max(b.Rate.StoredDrain, b.Rate.LogDrain))
	offered := s.cfg.Fraction * b.LoggedPerSecond
	if !(offered > 0) {
		return errors.New("nothing was stored in the rate window")
	}
	fmt.Fprintf(s.logw, "inferload: phase e: stored %.0f/s, in the log %.0f/s; subscribing, then pacing %.0f observations/s for %v\n",
		b.StoredPerSecond, b.LoggedPerSecond, offered, s.cfg.Window)
	b.Paced, err = s.pacedWindow(ctx, bodies, offered)
	return err
}

// setup creates the keys and the scoring deployment, waits for it to run, and finds the project
// the observations' events are filed under and the patients.
func (s *streamRun) setup(ctx context.Context, b *streamBench) error {
	pool := s.n.n.Pool()
	var orgID string
	if err := pool.QueryRow(ctx, `select id from organizations where slug = $1`, demo.DemoOrgSlug).Scan(&orgID); err != nil {
		return fmt.Errorf("organization %s: %w", demo.DemoOrgSlug, err)
	}
	keys := postgres.NewAPIKeys(pool)
	for _, k := range []struct {
		dst    *string
		name   string
		scopes []string
	}{{&s.writeKey, "inferload devices", []string{access.WriteObservations, access.ReadPatients}},
		{&s.readKey, "inferload subscriber", []string{access.ReadPatients, access.ReadObservations}}} {
		key, err := keys.Create(ctx, apikeys.NewKey{OrgID: orgID, Mode: access.Live, Name: k.name, Scopes: k.scopes})
		if err != nil {
			return fmt.Errorf("create key: %w", err)
		}
		*k.dst = key.Secret
	}
	// Device events are filed under the organization's oldest project (processors/observations).
	if err := pool.QueryRow(ctx, `select id from projects where org_id = $1 order by created_at, id limit 1`, orgID).Scan(&s.project); err != nil {
		return fmt.Errorf("project of %s: %w", demo.DemoOrgSlug, err)
	}
	rows, err := pool.Query(ctx, `select id from patients where org_id = $1 order by id limit $2`, orgID, s.cfg.Patients)
	if err == nil {
		s.patients, err = collectStrings(rows)
	}
	if err != nil || len(s.patients) == 0 {
		return fmt.Errorf("patients of %s: %d, %v", demo.DemoOrgSlug, len(s.patients), err)
	}
	b.Patients = len(s.patients)
	dep, err := createScoring(ctx, s.n, s.hc, s.cfg.Replicas)
	if err != nil {
		return err
	}
	b.Deployment, s.tr = dep, newTracker(dep)
	return nil
}

func collectStrings(rows interface {
	Next() bool
	Scan(...any) error
	Err() error
	Close()
}) ([]string, error) {
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// createScoring deploys the demo model with scoreStream and waits until it is RUNNING.
func createScoring(ctx context.Context, n *selfNode, hc *http.Client, replicas int) (string, error) {
	admin := &pipelinetest.Client{BaseURL: n.URL, Key: n.Admin, HTTP: hc}
	installation, err := demoInstallation(ctx, n, admin)
	if err != nil {
		return "", err
	}
	var out struct{ CreateDeployment struct{ ID string } }
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err = admin.GraphQL(cctx, `mutation($i: ID!, $r: Int) {
  createDeployment(installationId: $i, environment: "inferload-stream", replicas: $r, scoreStream: true) { id } }`,
		map[string]any{"i": installation, "r": replicas}, &out)
	if err != nil {
		return "", fmt.Errorf("createDeployment (scoreStream): %w", err)
	}
	return out.CreateDeployment.ID, waitRunning(ctx, admin, out.CreateDeployment.ID)
}

// demoInstallation is the demo catalogue's installation of the deterioration model.
func demoInstallation(ctx context.Context, n *selfNode, admin *pipelinetest.Client) (string, error) {
	project, err := loadcli.ProjectID(ctx, admin, demo.SepsisProjectName)
	if err != nil {
		return "", err
	}
	var id string
	if err := n.n.Pool().QueryRow(ctx, `select i.id from installations i join assets a on a.id = i.asset_id where i.project_id = $1 and a.name = $2`,
		project, demo.DeteriorationModelName).Scan(&id); err != nil {
		return "", fmt.Errorf("installation of %q in %q: %w", demo.DeteriorationModelName, demo.SepsisProjectName, err)
	}
	return id, nil
}

// prime posts every patient's model features once, so that every later observation's patient
// has each and is scored, and waits for their predictions: the scorer has loaded the model.
func (s *streamRun) prime(ctx context.Context) error {
	bodies := s.bodies(0, s.primeBodies())
	fmt.Fprintf(s.logw, "inferload: phase e: priming %d patients' vitals (%d requests), waiting for their predictions\n", len(s.patients), len(bodies))
	before, err := s.scrape(ctx)
	if err != nil {
		return err
	}
	var w streamWindow
	var first atomic.Value
	for _, body := range bodies {
		s.postOne(ctx, body, windowPrime, &w, &first)
	}
	if w.Accepted == 0 {
		return fmt.Errorf("priming: nothing accepted: %v", first.Load())
	}
	emitted := 0.0
	waitUntil(ctx, s.cfg.Drain+time.Minute, func() bool {
		if m, err := s.scrape(ctx); err == nil {
			emitted = m[metricPredictions] - before[metricPredictions]
		}
		return emitted >= float64(w.Accepted)
	})
	if emitted == 0 {
		return fmt.Errorf("priming: the scorer emitted no prediction of %d observations", w.Accepted)
	}
	return ctx.Err()
}

func (s *streamRun) primeBodies() int {
	return (len(s.patients)*len(streamFeatures()) + s.cfg.Batch - 1) / s.cfg.Batch
}

// Metrics phase e reads from the node's /metrics.
const (
	metricStored      = "carehub_observations_stored_total"
	metricPredictions = "carehub_deployments_stream_predictions_total"
	metricSlowDropped = "carehub_fanout_slow_subscribers_dropped_total"
)

func (s *streamRun) scrape(ctx context.Context) (map[string]float64, error) {
	return scrapeMetrics(ctx, s.hc, s.n.URL+"/metrics", metricStored, metricPredictions, metricSlowDropped)
}

// rateWindow posts unpaced for RateWindow, no subscriber connected, and counts what the node
// stored (carehub_observations_stored_total, as loadtest does) until all was stored or the
// drain ended, then what the scorer emitted.
func (s *streamRun) rateWindow(ctx context.Context, bodies [][]byte) (*streamWindow, error) {
	before, err := s.scrape(ctx)
	if err != nil {
		return nil, err
	}
	w := s.postWindow(ctx, bodies, windowRate, s.cfg.RateWindow, 0)
	s.drain(ctx, w, before)
	return w, ctx.Err()
}

// drain waits up to Drain for the window's observations to be stored, then up to Drain more
// for their predictions to be emitted, reading the counters from before the window.
func (s *streamRun) drain(ctx context.Context, w *streamWindow, before map[string]float64) {
	var now map[string]float64
	upTo := func(name string) func() bool {
		return func() bool {
			if m, err := s.scrape(ctx); err == nil {
				now = m
			}
			return now != nil && now[name]-before[name] >= float64(w.Accepted)
		}
	}
	waitUntil(ctx, s.cfg.Drain, upTo(metricStored))
	w.StoredDrain = time.Since(w.end).Seconds()
	waitUntil(ctx, s.cfg.Drain, upTo(metricPredictions))
	w.EmitDrain = time.Since(w.end).Seconds()
	if now != nil {
		w.Stored, w.Emitted = now[metricStored]-before[metricStored], now[metricPredictions]-before[metricPredictions]
		w.SlowDropped = now[metricSlowDropped] - before[metricSlowDropped]
		w.EmittedPerSecond = w.Emitted / (w.Seconds + w.EmitDrain)
	}
}

// pacedWindow subscribes, checks that the subscription delivers, posts at rate observations a
// second for Window and measures accept → prediction received.
func (s *streamRun) pacedWindow(ctx context.Context, bodies [][]byte, rate float64) (*streamWindow, error) {
	stop := s.listen(ctx)
	defer stop()
	if err := s.probe(ctx, bodies[0]); err != nil {
		return nil, err
	}
	before, err := s.scrape(ctx)
	if err != nil {
		return nil, err
	}
	drops0, _ := s.tr.ends()
	w := s.postWindow(ctx, bodies, windowPaced, s.cfg.Window, rate)
	s.drain(ctx, w, before)
	waitUntil(ctx, s.cfg.Drain, func() bool { acc, seen := s.tr.count(windowPaced); return seen >= acc })
	var recv, emit loadcli.MsDist
	w.Predictions, w.Missing, recv, emit = s.tr.latencies(windowPaced)
	w.Latency, w.ToEmitted = &recv, &emit
	logged, err := s.logged(ctx, w)
	if err != nil {
		return w, err
	}
	dist := s.tr.toLogged(windowPaced, logged)
	// The log's rows since just before the window include predictions of observations posted
	// before it (the probe's, the last of the unpaced window's): only the window's count.
	w.ToLogged, w.LoggedPredictions = &dist, int64(dist.N)
	drops1, why := s.tr.ends()
	w.Drops, w.DropReason = drops1-drops0, why
	return w, ctx.Err()
}

// logCaughtUp waits up to twice Drain for the event log to hold every prediction the scorer
// emitted: the log writer has no backlog of the phase's events (the observations' events come
// before their predictions on the events topic's partitions; the writer takes them in order).
func (s *streamRun) logCaughtUp(ctx context.Context) error {
	var emitted float64
	var logged int64
	start := time.Now()
	_, ok := waitUntil(ctx, 2*s.cfg.Drain, func() bool {
		m, err := s.scrape(ctx)
		if err != nil {
			return false
		}
		emitted = m[metricPredictions]
		err = s.n.n.Pool().QueryRow(ctx, `select count(*) from event_log where type = 'deployment.prediction' and payload->>'deploymentId' = $1`,
			s.tr.dep).Scan(&logged)
		return err == nil && float64(logged) >= emitted
	})
	if !ok {
		return fmt.Errorf("the event log held %d of the %.0f predictions emitted after %v", logged, emitted, 2*s.cfg.Drain)
	}
	fmt.Fprintf(s.logw, "inferload: phase e: the event log caught up in %.1f s more\n", time.Since(start).Seconds())
	return nil
}

// logged waits up to Drain for the event log to hold a prediction of each of the window's
// accepted observations, then reads when each was logged, by observation id. The embedded
// event log is in the node's Postgres.
func (s *streamRun) logged(ctx context.Context, w *streamWindow) (map[string]time.Time, error) {
	pool := s.n.n.Pool()
	const where = `from event_log where project_id = $1 and type = 'deployment.prediction'
  and payload->>'deploymentId' = $2 and logged_at >= $3`
	since := w.end.Add(-time.Duration(w.Seconds*float64(time.Second)) - time.Second)
	waitUntil(ctx, s.cfg.Drain, func() bool {
		var n int64
		err := pool.QueryRow(ctx, `select count(*) `+where, s.project, s.tr.dep, since).Scan(&n)
		return err == nil && n >= w.Accepted
	})
	rows, err := pool.Query(ctx, `select payload->>'observationId', logged_at `+where, s.project, s.tr.dep, since)
	if err != nil {
		return nil, fmt.Errorf("read the event log's predictions: %w", err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			return nil, err
		}
		out[id] = at
	}
	return out, rows.Err()
}

// probe posts body until a prediction of it reaches the subscriber: the subscription, which the
// server registers after the subscribe message, is live.
func (s *streamRun) probe(ctx context.Context, body []byte) error {
	var w streamWindow
	var first atomic.Value
	for range 5 {
		_, seen := s.tr.count(windowPrime)
		s.postOne(ctx, body, windowPrime, &w, &first)
		if _, ok := waitUntil(ctx, 10*time.Second, func() bool { _, now := s.tr.count(windowPrime); return now > seen }); ok {
			return nil
		}
	}
	drops, why := s.tr.ends()
	return fmt.Errorf("no prediction reached the subscriber in 5 tries (%d accepted; %d subscription ends, the last: %s; first failure: %v)",
		w.Accepted, drops, why, first.Load())
}

// listen keeps a subscription open until the returned stop is called: when the server ends it
// (a subscriber that fell behind is dropped) it subscribes again, as a graphql-ws client does
// on 4008, and the tracker counts the end.
func (s *streamRun) listen(ctx context.Context) (stop func()) {
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for lctx.Err() == nil {
			conn, err := subscribe(lctx, s.n.URL, s.readKey, s.project)
			if err != nil {
				s.tr.end(lctx, "subscribe: "+err.Error())
				sleepCtx(lctx, time.Second)
				continue
			}
			s.tr.read(lctx, conn)
			_ = conn.CloseNow()
		}
	}()
	return func() { cancel(); <-done }
}

// postWindow posts bodies for d (rate observations a second, 0 unpaced) and returns what was
// accepted, with the CPU and the machine in the window.
func (s *streamRun) postWindow(ctx context.Context, bodies [][]byte, win int, d time.Duration, rate float64) *streamWindow {
	w := &streamWindow{OfferedPerSecond: rate}
	cpu0, machine := loadcli.ProcessCPU(), loadtest.StartMachineWindow()
	start := time.Now()
	s.post(ctx, bodies, win, d, rate, w)
	w.end = time.Now()
	w.Seconds = w.end.Sub(start).Seconds()
	w.AcceptedPerSecond = float64(w.Accepted) / w.Seconds
	w.ProcessCores = (loadcli.ProcessCPU() - cpu0).Seconds() / w.Seconds
	if busy, steal, ok := machine.End(); ok {
		w.MachineBusyPct, w.MachineStealPct = busy, steal
	}
	return w
}

// post runs the devices for d, taking bodies in turn, paced at rate observations a second (0:
// as fast as they go). A request in flight at the end is waited for: its observations count.
func (s *streamRun) post(ctx context.Context, bodies [][]byte, win int, d time.Duration, rate float64, w *streamWindow) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	pace, stop := loadcli.Pace(rate / float64(s.cfg.Batch))
	defer stop()
	results := make([]streamWindow, s.cfg.Devices)
	var first atomic.Value
	var wg sync.WaitGroup
	for dev := range s.cfg.Devices {
		wg.Go(func() {
			for i := dev; loadcli.Wait(wctx, pace); i += s.cfg.Devices {
				retry := s.postOne(context.WithoutCancel(wctx), bodies[i%len(bodies)], win, &results[dev], &first)
				if retry > 0 {
					sleepCtx(wctx, retry)
				}
			}
		})
	}
	wg.Wait()
	for _, r := range results {
		w.Requests, w.Accepted, w.Refused, w.Failed = w.Requests+r.Requests, w.Accepted+r.Accepted, w.Refused+r.Refused, w.Failed+r.Failed
	}
	if f, ok := first.Load().(string); ok {
		w.FirstFailure = f
	}
}

// postOne posts one body, records its accepted observations' accept time in the tracker, and
// returns how long to back off (a refusal's Retry-After; a failure's 10 ms).
func (s *streamRun) postOne(ctx context.Context, body []byte, win int, w *streamWindow, first *atomic.Value) time.Duration {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	w.Requests++
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.n.URL+"/v1/observations", bytes.NewReader(body))
	if err != nil {
		panic(err) // a constant URL
	}
	req.Header.Set("Authorization", "Bearer "+s.writeKey)
	req.Header.Set("Content-Type", "application/fhir+json")
	resp, err := s.hc.Do(req)
	if err != nil {
		w.Failed++
		first.CompareAndSwap(nil, err.Error())
		return 10 * time.Millisecond
	}
	at := time.Now() // the answer's head: the accept
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	resp.Body.Close()
	switch {
	case err == nil && resp.StatusCode == http.StatusAccepted:
		var a struct{ IDs []string }
		if err := json.Unmarshal(b, &a); err != nil || len(a.IDs) == 0 {
			w.Failed++
			first.CompareAndSwap(nil, fmt.Sprintf("202 without ids: %.200s", b))
			return 0
		}
		w.Accepted += int64(len(a.IDs))
		s.tr.accept(a.IDs, at, win)
		return 0
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		w.Refused++
		first.CompareAndSwap(nil, fmt.Sprintf("refused: HTTP %d", resp.StatusCode))
		if sec, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && sec > 0 {
			return time.Duration(sec) * time.Second
		}
		return time.Second
	default:
		w.Failed++
		first.CompareAndSwap(nil, fmt.Sprintf("HTTP %d: %.200s", resp.StatusCode, b))
		return 10 * time.Millisecond
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// waitUntil polls cond every 50 ms for up to d and returns how long it waited and whether
// cond held.
func waitUntil(ctx context.Context, d time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for !cond() {
		if ctx.Err() != nil || time.Since(start) > d {
			return time.Since(start), false
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
	return time.Since(start), true
}

// scrapeMetrics reads the counters names from the node's /metrics (Prometheus text format),
// each summed over its label sets; a counter not exported yet is 0.
func scrapeMetrics(ctx context.Context, hc *http.Client, url string, names ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: HTTP %d", url, resp.StatusCode)
	}
	out := make(map[string]float64, len(names))
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, name := range names {
			rest, ok := strings.CutPrefix(line, name)
			if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
				continue
			}
			if fields := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:]); len(fields) > 0 {
				v, err := strconv.ParseFloat(fields[0], 64)
				if err != nil {
					return nil, fmt.Errorf("scrape %s: %s: %w", url, name, err)
				}
				out[name] += v
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	return out, nil
}

// feature is one of the model's inputs as a device codes it.
type feature struct{ code, display, unit string }

// streamFeatures are the demo model's features (its carehub.features metadata, in its columns'
// order) as LOINC vital signs in their canonical units, which the model's cases are in.
func streamFeatures() []feature {
	var sig struct{ Metadata map[string]string }
	var names []string
	if err := json.Unmarshal([]byte(models.DeteriorationSignature), &sig); err != nil {
		panic("inferload: DeteriorationSignature: " + err.Error()) // a constant
	}
	if err := json.Unmarshal([]byte(sig.Metadata["carehub.features"]), &names); err != nil {
		panic("inferload: carehub.features: " + err.Error())
	}
	vitals := clinical.VitalSigns()
	out := make([]feature, len(names))
	for i, name := range names {
		for _, v := range vitals {
			if v.Name == name {
				out[i] = feature{v.Code, v.Display, v.Unit}
			}
		}
		if out[i].code == "" {
			panic("inferload: the demo model's feature " + name + " is no vital sign")
		}
	}
	return out
}

// bodies builds n FHIR batch Bundles of Batch observations each, from the start-th on, of the
// sequence that walks every patient's every feature in turn (the first primeBodies cover each
// pair once). Values are the model's test cases' rows, one a patient; effective a minute ago.
// Bodies repeat; carehub gives each observation of each POST an id of its own.
func (s *streamRun) bodies(start, n int) [][]byte {
	feats := streamFeatures()
	cases, _ := models.DeteriorationCases()
	at := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	out := make([][]byte, n)
	for i := range out {
		b := []byte(`{"resourceType":"Bundle","type":"batch","entry":[`)
		for j := range s.cfg.Batch {
			k := (start+i)*s.cfg.Batch + j
			p := (k / len(feats)) % len(s.patients)
			f := k % len(feats)
			if j > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"resource":`...)
			b = appendObservation(b, feats[f], s.patients[p], cases[p%len(cases)].Input[f], at)
			b = append(b, `,"request":{"method":"POST","url":"Observation"}}`...)
		}
		out[i] = append(b, "]}"...)
	}
	return out
}

// appendObservation appends a vital-signs Observation as loadtest's devices send it.
func appendObservation(b []byte, f feature, patient string, value float64, at string) []byte {
	return fmt.Appendf(b, `{"resourceType":"Observation","status":"final",`+
		`"category":[{"coding":[{"system":"http://terminology.hl7.org/CodeSystem/observation-category","code":"vital-signs","display":"Vital Signs"}]}],`+
		`"code":{"coding":[{"system":"http://loinc.org","code":"%s","display":"%s"}],"text":"%s"},`+
		`"subject":{"reference":"Patient/%s"},"effectiveDateTime":"%s",`+
		`"valueQuantity":{"value":%s,"unit":"%s","system":"http://unitsofmeasure.org","code":"%s"}}`,
		f.code, f.display, f.display, patient, at, strconv.FormatFloat(value, 'f', -1, 64), f.unit, f.unit)
}

// subscribe opens a graphql-transport-ws connection to the node, authenticates with key and
// subscribes to the project's deployment.prediction events, as a client would.
func subscribe(ctx context.Context, base, key, project string) (*websocket.Conn, error) {
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/graphql",
		&websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	if err != nil {
		return nil, err
	}
	conn.SetReadLimit(4 << 20)
	init, _ := json.Marshal(map[string]string{"Authorization": "Bearer " + key})
	sub, _ := json.Marshal(map[string]any{"query": `subscription($p: ID!) {
  eventStream(projectId: $p, types: ["deployment.prediction"]) { type timestamp payload } }`, "variables": map[string]any{"p": project}})
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = wsWrite(hctx, conn, wsMessage{Type: "connection_init", Payload: init})
	var ack wsMessage
	if err == nil {
		err = wsRead(hctx, conn, &ack)
	}
	if err == nil && ack.Type != "connection_ack" {
		err = fmt.Errorf("connection_init answered %q", ack.Type)
	}
	if err == nil {
		err = wsWrite(hctx, conn, wsMessage{ID: "1", Type: "subscribe", Payload: sub})
	}
	if err != nil {
		_ = conn.CloseNow()
		return nil, err
	}
	return conn, nil
}

type wsMessage struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

func wsWrite(ctx context.Context, conn *websocket.Conn, m wsMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return conn.Write(ctx, websocket.MessageText, b)
}

func wsRead(ctx context.Context, conn *websocket.Conn, m *wsMessage) error {
	_, b, err := conn.Read(ctx)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, m)
}

// tracker joins accepted observations with their predictions, in whichever order they come.
type tracker struct {
	dep string // the scoring deployment: predictions of another are not counted

	mu       sync.Mutex
	accepted map[string]accepted // observation id →
	seen     map[string]sighting // observation id →
	nAcc     [windows]int64
	nSeen    [windows]int64 // accepted observations of the window with a prediction
	dups     int64
	nEnds    int64  // subscriptions the server ended
	endedWhy string // the last one's reason
}

type accepted struct {
	at     time.Time
	window int
}

type sighting struct{ at, emitted time.Time }

func newTracker(dep string) *tracker {
	return &tracker{dep: dep, accepted: map[string]accepted{}, seen: map[string]sighting{}}
}

func (t *tracker) accept(ids []string, at time.Time, win int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		t.accepted[id] = accepted{at, win}
		t.nAcc[win]++
		if _, ok := t.seen[id]; ok { // the prediction outran the answer's parsing
			t.nSeen[win]++
		}
	}
}

func (t *tracker) see(obs string, at, emitted time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, dup := t.seen[obs]; dup {
		t.dups++
		return
	}
	t.seen[obs] = sighting{at, emitted}
	if a, ok := t.accepted[obs]; ok {
		t.nSeen[a.window]++
	}
}

// count is how many observations of win were accepted, and how many of those were scored.
func (t *tracker) count(win int) (acc, seen int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nAcc[win], t.nSeen[win]
}

// latencies summarizes win's accept → received and accept → emitted.
func (t *tracker) latencies(win int) (seen, missing int64, recv, emitted loadcli.MsDist) {
	t.mu.Lock()
	var rs, es []time.Duration
	for id, a := range t.accepted {
		if a.window != win {
			continue
		}
		s, ok := t.seen[id]
		if !ok {
			missing++
			continue
		}
		rs = append(rs, s.at.Sub(a.at))
		if !s.emitted.IsZero() {
			es = append(es, s.emitted.Sub(a.at))
		}
	}
	t.mu.Unlock()
	return int64(len(rs)), missing, loadcli.Ms(rs), loadcli.Ms(es)
}

// toLogged is win's accept → logged, of the observations in logged (observation id → when
// the log stored its prediction).
func (t *tracker) toLogged(win int, logged map[string]time.Time) loadcli.MsDist {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ds []time.Duration
	for id, a := range t.accepted {
		if at, ok := logged[id]; ok && a.window == win {
			ds = append(ds, at.Sub(a.at))
		}
	}
	return loadcli.Ms(ds)
}

// ends is how many subscriptions the server ended, and the last one's reason.
func (t *tracker) ends() (int64, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nEnds, t.endedWhy
}

func (t *tracker) duplicates() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dups
}

// read reads the subscription until ctx ends, noting each prediction of the tracker's
// deployment by observation, with its arrival time.
func (t *tracker) read(ctx context.Context, conn *websocket.Conn) {
	for {
		_, b, err := conn.Read(ctx)
		at := time.Now()
		if err != nil {
			t.end(ctx, err.Error())
			return
		}
		var m wsMessage
		if err := json.Unmarshal(b, &m); err != nil {
			continue
		}
		switch m.Type {
		case "next":
			t.next(m.Payload, at)
		case "error", "complete":
			t.end(ctx, fmt.Sprintf("%s: %.300s", m.Type, m.Payload))
			return
		}
	}
}

func (t *tracker) next(payload json.RawMessage, at time.Time) {
	var r struct {
		Data struct {
			EventStream struct {
				Timestamp time.Time
				Payload   struct {
					DeploymentID  string `json:"deploymentId"`
					ObservationID string `json:"observationId"`
				}
			} `json:"eventStream"`
		}
	}
	if json.Unmarshal(payload, &r) != nil {
		return
	}
	ev := r.Data.EventStream
	if ev.Payload.DeploymentID == t.dep && ev.Payload.ObservationID != "" {
		t.see(ev.Payload.ObservationID, at, ev.Timestamp)
	}
}

// end notes why the subscription ended, unless the phase ended it.
func (t *tracker) end(ctx context.Context, why string) {
	if ctx.Err() != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nEnds++
	t.endedWhy = why
}

// print writes phase e's figures.
func (b *streamBench) print(w io.Writer) {
	fmt.Fprintf(w, "e  stream scoring: deployment %s (%d replicas, scoreStream), %d devices, batch %d, %d patients\n",
		b.Deployment, b.Replicas, b.Devices, b.Batch, b.Patients)
	if r := b.Rate; r != nil {
		fmt.Fprintf(w, "   stored with scoring     %8.0f observations/s  (no subscriber; %.0f accepted/s over %.1f s, %.0f stored by %.1f s after; %d refused, %d failed)\n",
			b.StoredPerSecond, r.AcceptedPerSecond, r.Seconds, r.Stored, r.StoredDrain, r.Refused, r.Failed)
		fmt.Fprintf(w, "   through the event log   %8.0f observations/s  (their events and predictions all logged by %.1f s after the window)\n",
			b.LoggedPerSecond, r.LogDrain)
		fmt.Fprintf(w, "   scored                  %8.0f predictions/s  (%.0f emitted of %d accepted by %.1f s after the window; %.2f cores, busy %.0f %%, steal %.1f %%)\n",
			r.EmittedPerSecond, r.Emitted, r.Accepted, r.EmitDrain, r.ProcessCores, r.MachineBusyPct, r.MachineStealPct)
	}
	if p := b.Paced; p != nil {
		fmt.Fprintf(w, "   paced at %3.0f %% of that %8.0f offered/s, %.0f accepted/s over %.1f s (%d refused, %d failed; %.2f cores, busy %.0f %%, steal %.1f %%)\n",
			100*b.Fraction, p.OfferedPerSecond, p.AcceptedPerSecond, p.Seconds, p.Refused, p.Failed, p.ProcessCores, p.MachineBusyPct, p.MachineStealPct)
		if p.ToLogged != nil {
			fmt.Fprintf(w, "   accept → in the log     %s   (%d of %d accepted; goal p99 ≤ 1 s: %s)\n",
				p.ToLogged, p.LoggedPredictions, p.Accepted, met(p.ToLogged.N > 0 && p.ToLogged.P99 <= 1000 && p.LoggedPredictions >= p.Accepted))
		}
		if p.Latency != nil {
			fmt.Fprintf(w, "   accept → subscriber     %s   (received on a GraphQL eventStream)\n", p.Latency)
			fmt.Fprintf(w, "   accept → emitted        %s   (the prediction's timestamp)\n", p.ToEmitted)
		}
		fmt.Fprintf(w, "   predictions             %d received of %d accepted, %d missing; scorer emitted %.0f (all by %.1f s after the window)\n",
			p.Predictions, p.Accepted, p.Missing, p.Emitted, p.EmitDrain)
		if p.Drops > 0 || p.SlowDropped > 0 {
			fmt.Fprintf(w, "   subscription dropped    %d times (fan-out slow-subscriber drops %.0f); the last: %s\n", p.Drops, p.SlowDropped, p.DropReason)
		}
	}
	for _, f := range []struct{ what, v string }{{"first failure (rate)", firstFailure(b.Rate)}, {"first failure (paced)", firstFailure(b.Paced)},
		{"not measured", b.Error}} {
		if f.v != "" {
			fmt.Fprintf(w, "   %s: %s\n", f.what, f.v)
		}
	}
	if b.Duplicates > 0 {
		fmt.Fprintf(w, "   duplicate predictions   %d\n", b.Duplicates)
	}
}

func firstFailure(w *streamWindow) string {
	if w == nil {
		return ""
	}
	return w.FirstFailure
}
