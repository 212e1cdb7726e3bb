package main

import (
	"context"
	"fmt"
	"io"
	"time"

	loadreport "carehub/loadtest/report"
)

// suiteRun is one load of the suite.
type suiteRun struct {
	Name   string  `json:"name"`
	Report *report `json:"report"`
}

// suiteReport holds the figures issue 20 asks of the event pipeline, from one node in one
// process run: publish → log at 10/s, single publishEvent calls at their maximum and the
// publish → log p99 at 80 % of it, and the same for POST /v1/events arrays of 1,000.
type suiteReport struct {
	LowRateVisibleP50Ms  float64 `json:"lowRateVisibleP50Ms"`    // publish → log p50 at 10/s
	SinglePerSec         float64 `json:"singlePerSec"`           // single publishEvent calls, unpaced
	SingleAt80VisibleP99 float64 `json:"singleAt80VisibleP99Ms"` // publish → log p99 at 80 % of SinglePerSec
	BatchPerSec          float64 `json:"batchPerSec"`            // events/s accepted in arrays of 1,000, unpaced
	BatchLoggedPerSec    float64 `json:"batchLoggedPerSec"`      // events/s into the log in that run, drain included
	// BatchSustainedPerSec is the most the pipeline carried end to end in that run: events/s
	// into the log while publishing (else BatchLoggedPerSec), at most BatchPerSec.
	BatchSustainedPerSec float64    `json:"batchSustainedPerSec"`
	BatchAt80VisibleP99  float64    `json:"batchAt80VisibleP99Ms"` // publish → log p99 at 80 % of BatchSustainedPerSec
	Runs                 []suiteRun `json:"runs"`

	series []loadreport.Point
}

func (s *suiteReport) Print(w io.Writer) {
	for _, r := range s.Runs {
		fmt.Fprintf(w, "--- %s\n", r.Name)
		r.Report.Print(w)
	}
	fmt.Fprintf(w, "--- suite\npublish→log p50 at 10/s %.1f ms; single %.0f/s, publish→log p99 at 80 %% %.1f ms; batched %.0f events/s (%.0f/s into the log, %.0f/s while publishing), publish→log p99 at 80 %% of that %.1f ms\n",
		s.LowRateVisibleP50Ms, s.SinglePerSec, s.SingleAt80VisibleP99, s.BatchPerSec, s.BatchLoggedPerSec, s.BatchSustainedPerSec, s.BatchAt80VisibleP99)
}

// runSuite runs the suite's loads one after another, each for base's duration, and returns
// their reports (what ran, when one fails).
func runSuite(ctx context.Context, base config, logw io.Writer) (*suiteReport, error) {
	s := &suiteReport{}
	load := func(name string, edit func(*config)) (*report, error) {
		c := base
		c.Drain = max(c.Drain, 2*time.Minute) // an unpaced batch run leaves the log far behind
		c.Export = false                      // -export: the unpaced arrays' events alone (the most)
		edit(&c)
		fmt.Fprintf(logw, "eventload suite: %s\n", name)
		rep, err := run(ctx, c, logw)
		if rep != nil {
			offset := 0.0
			if len(s.series) > 0 {
				offset = s.series[len(s.series)-1].Seconds
			}
			for _, p := range rep.Series {
				p.Seconds += offset
				s.series = append(s.series, p)
			}
			s.Runs = append(s.Runs, suiteRun{Name: name, Report: rep})
		}
		return rep, err
	}
	low, err := load("publish → log at 10/s", func(c *config) { c.Clients, c.Rate, c.Sample, c.Batch = 1, 10, 1, 1 })
	if err != nil {
		return s, err
	}
	s.LowRateVisibleP50Ms = low.Visible.P50
	single, err := load("single publishEvent, unpaced", func(c *config) { c.Clients, c.Rate, c.Sample, c.Batch = 32, 0, 20, 1 })
	if err != nil {
		return s, err
	}
	s.SinglePerSec = single.PublishesPerSec
	at80, err := load("single publishEvent at 80 % of unpaced", func(c *config) { c.Clients, c.Rate, c.Sample, c.Batch = 32, 0.8*single.CallsPerSec, 5, 1 })
	if err != nil {
		return s, err
	}
	s.SingleAt80VisibleP99 = at80.Visible.P99
	batch, err := load("POST /v1/events arrays of 1,000, unpaced", func(c *config) { c.Clients, c.Rate, c.Sample, c.Batch, c.Export = 4, 0, 1, 1000, base.Export })
	if err != nil {
		return s, err
	}
	s.BatchPerSec, s.BatchLoggedPerSec = batch.PublishesPerSec, batch.LoggedPerSec
	// The maximum an array producer can sustain is what the log takes in while it publishes,
	// not what intake accepts (unpaced, intake accepts more than the log stores and a queue
	// builds) nor the log's rate drain included: after the publishing ends, the drain has the
	// machine to itself, and runs offered 80 % of that rate fell behind it, logging less than
	// they published (docs/PERFORMANCE.md).
	logged := batch.LoggedWhilePublishingPerSec
	if logged <= 0 {
		logged = batch.LoggedPerSec
	}
	sustained := batch.CallsPerSec
	if logged > 0 {
		sustained = min(sustained, logged/1000)
	}
	s.BatchSustainedPerSec = 1000 * sustained
	batch80, err := load("POST /v1/events arrays of 1,000 at 80 % of the log's rate", func(c *config) { c.Clients, c.Rate, c.Sample, c.Batch = 4, 0.8*sustained, 1, 1000 })
	if err != nil {
		return s, err
	}
	s.BatchAt80VisibleP99 = batch80.Visible.P99
	return s, nil
}
