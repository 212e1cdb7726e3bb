package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"carehub/e2e/pipelinetest"
	"carehub/loadtest/loadcli"
)

// The fleet (-subs N): N subscriptions to the same events instead of one, of which -slow answer
// after slowAnswer and -failing answer 500, so that a run shows whether the healthy ones are held
// back by them. Subscription 0 is the main one (the tracker the progress line and the raw
// baseline follow); the healthy ones each have a tracker of their own.

// slowAnswer is how long a slow subscription's receiver takes to answer.
const slowAnswer = time.Second

// fleet is the subscriptions of a run and their receivers, served under /hook/{i}.
type fleet struct {
	hooks   []webhook
	healthy []*tracker // by subscription; nil for a slow or failing one
	slow    []int      // the indexes of the slow subscriptions
	failing []int

	slowAnswered, failingAnswered atomic.Int64
	overHTTP2, requests           atomic.Int64 // POSTs to the subscriptions' receivers, and those over HTTP/2
}

// role of subscription i: the first -slow after the main one are slow, the next -failing fail.
func (c config) role(i int) string {
	switch {
	case i >= 1 && i <= c.Slow:
		return "slow"
	case i > c.Slow && i <= c.Slow+c.Failing:
		return "failing"
	}
	return "healthy"
}

// subscribe creates the run's subscriptions to typ, each with the same settings, at base/hook/{i}.
func subscribe(ctx context.Context, admin *pipelinetest.Client, cfg config, project, typ, base string) (*fleet, error) {
	f := &fleet{}
	for i := range max(cfg.Subs, 1) {
		create := map[string]any{"projectId": project, "url": base + "/hook/" + strconv.Itoa(i), "events": []string{typ}, "ordered": cfg.Ordered}
		for name, v := range map[string]int{"maxInFlight": cfg.MaxInFlight, "batchSize": cfg.HookBatch, "rateLimit": cfg.RateLimit} {
			if v > 0 {
				create[name] = v
			}
		}
		var hook webhook
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := admin.REST(cctx, http.MethodPost, "/v1/webhooks", create, &hook)
		cancel()
		if err != nil {
			return f, fmt.Errorf("create webhook %d (the node needs --webhooks-allow-private for %s): %w", i, base, err)
		}
		f.hooks = append(f.hooks, hook)
		switch cfg.role(i) {
		case "slow":
			f.slow, f.healthy = append(f.slow, i), append(f.healthy, nil)
		case "failing":
			f.failing, f.healthy = append(f.failing, i), append(f.healthy, nil)
		default:
			f.healthy = append(f.healthy, nil) // set by track
		}
	}
	return f, nil
}

// track gives every healthy subscription its tracker: the main one's is main.
func (f *fleet) track(main *tracker) {
	for i, h := range f.hooks {
		if f.healthy[i] != nil || slices.Contains(f.slow, i) || slices.Contains(f.failing, i) {
			continue
		}
		if i == 0 {
			f.healthy[i] = main
		} else {
			f.healthy[i] = newTracker(h.Secret, time.Now, nil)
		}
	}
}

// delete removes every subscription of the run.
func (f *fleet) delete(ctx context.Context, admin *pipelinetest.Client, logw io.Writer) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, h := range f.hooks {
		if err := admin.REST(dctx, http.MethodDelete, "/v1/webhooks/"+h.ID, nil, nil); err != nil {
			fmt.Fprintf(logw, "webhookload: delete webhook %s: %v\n", h.ID, err)
		}
	}
}

// ServeHTTP routes /hook/{i} to subscription i's receiver, and answers the probe.
func (f *fleet) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == probePath {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	f.requests.Add(1)
	if r.ProtoMajor == 2 {
		f.overHTTP2.Add(1)
	}
	n, ok := strings.CutPrefix(r.URL.Path, "/hook/")
	i, err := strconv.Atoi(n)
	if !ok || err != nil || i < 0 || i >= len(f.hooks) {
		w.WriteHeader(http.StatusNotFound)
		return
	}
	switch {
	case f.healthy[i] != nil:
		f.healthy[i].ServeHTTP(w, r)
	case slices.Contains(f.slow, i):
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-time.After(slowAnswer):
		case <-r.Context().Done():
		}
		f.slowAnswered.Add(1)
		w.WriteHeader(http.StatusNoContent)
	default:
		_, _ = io.Copy(io.Discard, r.Body)
		f.failingAnswered.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	}
}

// published records n events acknowledged: each healthy subscription is owed them.
func (f *fleet) published(n int) {
	for _, t := range f.healthy {
		if t != nil {
			t.publishedN(n)
		}
	}
}

// lag is what the healthy subscriptions are owed and have not received.
func (f *fleet) lag() int64 {
	var n int64
	for _, t := range f.healthy {
		if t != nil {
			n += t.lag()
		}
	}
	return n
}

// fleetReport is what the healthy subscriptions received, beside the main one's figures, and
// what the slow and failing ones answered.
type fleetReport struct {
	Subscriptions   int            `json:"subscriptions"`
	Healthy         int            `json:"healthy"`
	Slow            int            `json:"slow"`
	Failing         int            `json:"failing"`
	Delivered       int64          `json:"healthyDelivered"`
	DeliveredPerSec float64        `json:"healthyDeliveredPerSec"`
	Undelivered     int64          `json:"healthyUndelivered"`
	Duplicates      int64          `json:"healthyDuplicates"`
	BadSignature    int64          `json:"healthyBadSignature"`
	Latency         loadcli.MsDist `json:"healthyPublishToDeliveredMs"`
	SlowAnswered    int64          `json:"slowAnswered"`
	FailingAnswered int64          `json:"failingAnswered"`
}

func (f *fleet) report(over time.Duration) *fleetReport {
	r := &fleetReport{Subscriptions: len(f.hooks), Slow: len(f.slow), Failing: len(f.failing),
		SlowAnswered: f.slowAnswered.Load(), FailingAnswered: f.failingAnswered.Load()}
	var latencies []time.Duration
	for _, t := range f.healthy {
		if t == nil {
			continue
		}
		r.Healthy++
		tl := t.tally()
		r.Delivered += tl.Delivered
		r.Undelivered += max(tl.Published-tl.Delivered, 0)
		r.Duplicates += tl.Duplicates
		r.BadSignature += tl.BadSignature + tl.Stale
		latencies = append(latencies, tl.Latencies...)
	}
	r.DeliveredPerSec = float64(r.Delivered) / over.Seconds()
	r.Latency = loadcli.Ms(latencies)
	return r
}

func (r *fleetReport) Print(w io.Writer) {
	fmt.Fprintf(w, "fleet          %d subscriptions: %d healthy, %d slow (%v answers), %d failing (500)\n",
		r.Subscriptions, r.Healthy, r.Slow, slowAnswer, r.Failing)
	fmt.Fprintf(w, "healthy        %d delivered (%.1f/s in all), %d undelivered, %d duplicates, %d bad signatures; publish→hook %v\n",
		r.Delivered, r.DeliveredPerSec, r.Undelivered, r.Duplicates, r.BadSignature, r.Latency)
	fmt.Fprintf(w, "slow, failing  %d answered slowly, %d failed attempts\n", r.SlowAnswered, r.FailingAnswered)
}
