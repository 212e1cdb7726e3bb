// Package loadcli holds what the load commands against a running node (eventload, webhookload)
// share: their common flags and main (Command, Main), the loopback guard on their URLs, key
// lists, project lookup, the bounds of a publishing run, pacing, latency summaries in
// milliseconds, their own CPU time and the writing of their reports. loadclitest runs their
// validation tables.
package loadcli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"carehub/e2e/pipelinetest"
	loadreport "carehub/loadtest/report"
)

// LoopbackURL checks that raw is an http(s) URL of a loopback host: the load tools only load a
// local node.
func LoopbackURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s) URL", raw)
	}
	return LoopbackHost(u.Hostname())
}

// LoopbackHost checks that host is localhost or a loopback address.
func LoopbackHost(host string) error {
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback address: the load tools only load a local node", host)
	}
	return nil
}

// Keys splits a comma-separated list of API keys, dropping blanks.
func Keys(list string) []string {
	var keys []string
	for k := range strings.SplitSeq(list, ",") {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	return keys
}

// ProjectID returns project when it is an id (prj_…), else the id of the project of that name
// among those c's key sees.
func ProjectID(ctx context.Context, c *pipelinetest.Client, project string) (string, error) {
	if strings.HasPrefix(project, "prj_") {
		return project, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return c.ProjectID(ctx, project)
}

// RandomHex returns 2n random hex digits (a run's own event types).
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// MsDist is a latency distribution in milliseconds, as the reports print it.
type MsDist struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Ms summarizes ds in milliseconds.
func Ms(ds []time.Duration) MsDist {
	d := pipelinetest.Distribute(ds)
	f := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	return MsDist{N: d.N, P50: f(d.P50), P90: f(d.P90), P99: f(d.P99), Max: f(d.Max)}
}

// String is "n=… p50=…ms p90=…ms p99=…ms max=…ms".
func (d MsDist) String() string {
	return fmt.Sprintf("n=%d p50=%.1fms p90=%.1fms p99=%.1fms max=%.1fms", d.N, d.P50, d.P90, d.P99, d.Max)
}

// Bounds of a publishing run: a tool must not be able to run away.
const (
	MaxClients  = 256
	MaxDuration = 10 * time.Minute
	MaxDrain    = 5 * time.Minute
	MaxBatch    = 1000
	MaxPayload  = 200 << 10
)

// Load is the shape of a publishing run, as eventload and webhookload take it on their command
// lines.
type Load struct {
	Clients  int
	Duration time.Duration
	Rate     float64 // total calls per second; 0 = as fast as the clients go
	Max      int     // total calls; 0 = only Duration bounds the run
	Batch    int     // events per call
	Drain    time.Duration
	Payload  int // bytes of filler in each payload
}

// Validate checks l against the bounds, naming the flags (-c, -d, -rate, -max, -batch, -drain,
// -payload).
func (l Load) Validate() error {
	var errs []error
	if l.Clients < 1 || l.Clients > MaxClients {
		errs = append(errs, fmt.Errorf("-c %d: must be 1..%d", l.Clients, MaxClients))
	}
	if l.Duration <= 0 || l.Duration > MaxDuration {
		errs = append(errs, fmt.Errorf("-d %v: must be positive and at most %v", l.Duration, MaxDuration))
	}
	if l.Rate < 0 || l.Max < 0 || l.Payload < 0 || l.Payload > MaxPayload {
		errs = append(errs, fmt.Errorf("-rate, -max must not be negative; -payload must be 0..%d", MaxPayload))
	}
	if l.Batch < 1 || l.Batch > MaxBatch {
		errs = append(errs, fmt.Errorf("-batch %d: must be 1..%d", l.Batch, MaxBatch))
	}
	if l.Drain < 0 || l.Drain > MaxDrain {
		errs = append(errs, fmt.Errorf("-drain %v: must be 0..%v", l.Drain, MaxDrain))
	}
	return errors.Join(errs...)
}

// HTTPClient is a client keeping a connection per concurrent caller (and a few more) to the node.
func HTTPClient(callers int) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: callers + 4, MaxIdleConnsPerHost: callers + 4, IdleConnTimeout: 30 * time.Second,
	}}
}

// Pace returns a channel ticking rate times a second (nil, which never ticks and so must not be
// waited on, for rate 0 or NaN) and the function that stops it. Each tick is due at start + n /
// rate and carries that time; one no client was ready for, or that the timer fired late for, is
// sent late rather than dropped, so what is offered is the rate asked for, a late stretch
// caught up at once. (A time.Ticker drops those ticks: at 3,000 calls a second on two busy
// cores, 32 clients were offered 1,800.) The interval is kept within a microsecond and an hour.
func Pace(rate float64) (<-chan time.Time, func()) {
	if !(rate > 0) {
		return nil, func() {}
	}
	interval := time.Duration(min(max(float64(time.Second)/rate, float64(time.Microsecond)), float64(time.Hour)))
	ticks, stop := make(chan time.Time), make(chan struct{})
	go func() {
		timer := time.NewTimer(0)
		defer timer.Stop()
		start := time.Now()
		for n := time.Duration(1); ; n++ {
			due := start.Add(n * interval)
			if wait := time.Until(due); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-stop:
					return
				}
			}
			select {
			case ticks <- due:
			case <-stop:
				return
			}
		}
	}()
	var once sync.Once
	return ticks, func() { once.Do(func() { close(stop) }) }
}

// Wait waits for pace's next tick (none when pace is nil: unpaced) and reports whether the load
// goes on, false once ctx has ended.
func Wait(ctx context.Context, pace <-chan time.Time) bool {
	if pace == nil {
		return ctx.Err() == nil
	}
	select {
	case <-ctx.Done():
		return false
	case <-pace:
		return true
	}
}

// Printer is a run's report: its text for stdout.
type Printer interface{ Print(io.Writer) }

// Finish prints rep on stdout, writes it as JSON to jsonPath ("" none, "-" stdout) and, with a
// results directory, as loadtest/report's JSON (r with rep as its summary; loadtest/charts
// draws its chart and page).
// It returns the first error.
func Finish(rep Printer, jsonPath, results string, r loadreport.Report) error {
	rep.Print(os.Stdout)
	var errs []error
	if jsonPath != "" {
		errs = append(errs, writeJSON(jsonPath, rep))
	}
	if results != "" {
		r.Summary = rep
		path, err := loadreport.Write(results, r)
		errs = append(errs, err)
		if err == nil {
			fmt.Printf("report: %s (charts: %s)\n", path, loadreport.ChartsCommand(path))
		}
	}
	return errors.Join(errs...)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
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

// ProcessCPU is this process's user and system CPU time (0 where getrusage fails).
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
