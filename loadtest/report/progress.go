// Package report is what every load scenario (observations, events, subscriptions) shows while
// it runs and leaves behind: a progress line once a second on stderr (rate, latency p50/p99,
// lag, refusals; one updating line on a terminal, plain lines otherwise) and, at the end, one
// report format: JSON, written under a results directory, from which loadtest/charts (a module
// of its own) draws a PNG chart of throughput, latency percentiles and lag over time and a
// self-contained HTML page embedding both.
package report

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sync"
	"time"

	"carehub/kernel/config"
)

// Point is one interval of a run.
type Point struct {
	Seconds float64 `json:"t"`       // end of the interval, seconds since the start
	Rate    float64 `json:"rate"`    // items (observations, events, messages) per second in the interval
	P50Ms   float64 `json:"p50Ms"`   // latency percentiles of the interval's operations
	P99Ms   float64 `json:"p99Ms"`   // (0 when none completed)
	Lag     float64 `json:"lag"`     // the scenario's lag at the end of the interval (see Options.LagName)
	Refused int64   `json:"refused"` // refusals (429/503) in the interval
	// The end-to-end latency percentiles (Report.EndToEnd names what they measure) of the
	// sampled items sent in the interval, however late they arrived (EndToEnd; 0 when none).
	EndToEndP50Ms float64 `json:"endToEndP50Ms,omitempty"`
	EndToEndP99Ms float64 `json:"endToEndP99Ms,omitempty"`
}

// Options configure a Recorder.
type Options struct {
	Unit    string         // what Rate counts, e.g. "observations/s"
	LagName string         // what Lag measures, e.g. "records behind" ("" with Lag nil: no lag)
	Lag     func() float64 // read once per interval, outside any lock; nil: no lag
	Out     io.Writer      // progress lines; default os.Stderr, nil-safe with Quiet
	Quiet   bool           // no progress lines
	// Interval between points (default 1 s).
	Interval time.Duration
}

// Recorder collects a run's operations and turns them into Points.
type Recorder struct {
	opts  Options
	tty   bool
	start time.Time

	mu      sync.Mutex
	items   int64
	lat     []float64 // milliseconds, of the current interval
	refused int64
	last    time.Time
	points  []Point

	stop    chan struct{}
	done    chan struct{}
	stopped bool
}

// NewRecorder returns a recorder whose clock starts now; Start begins the progress line.
func NewRecorder(o Options) *Recorder {
	if o.Out == nil {
		o.Out = os.Stderr
	}
	config.Default(&o.Interval, time.Second)
	now := time.Now()
	return &Recorder{opts: o, tty: isTerminal(o.Out), start: now, last: now}
}

// isTerminal reports whether w is a character device (a terminal), where the progress line
// rewrites itself instead of scrolling.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Observe records one completed operation that moved items items and took latency.
func (r *Recorder) Observe(items int, latency time.Duration) {
	r.mu.Lock()
	r.items += int64(items)
	r.lat = append(r.lat, float64(latency.Microseconds())/1000)
	r.mu.Unlock()
}

// Refuse records n refusals (429/503).
func (r *Recorder) Refuse(n int) {
	r.mu.Lock()
	r.refused += int64(n)
	r.mu.Unlock()
}

// Start prints a progress line every Interval until Stop.
func (r *Recorder) Start() {
	r.stop, r.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(r.done)
		t := time.NewTicker(r.opts.Interval)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case now := <-t.C:
				r.print(r.Tick(now, r.lag()))
			}
		}
	}()
}

func (r *Recorder) lag() float64 {
	if r.opts.Lag == nil {
		return 0
	}
	return r.opts.Lag()
}

// Stop ends the progress line, closes the last (partial) interval and returns every point.
// A second Stop only returns the points.
func (r *Recorder) Stop() []Point {
	if r.stopped {
		return r.Points()
	}
	r.stopped = true
	if r.stop != nil {
		close(r.stop)
		<-r.done
		r.stop = nil
	}
	r.mu.Lock()
	pending := r.items > 0 || len(r.lat) > 0 || r.refused > 0
	r.mu.Unlock()
	if pending {
		r.print(r.Tick(time.Now(), r.lag()))
	}
	if r.tty && !r.opts.Quiet {
		fmt.Fprintln(r.opts.Out)
	}
	return r.Points()
}

// Started is when the recorder's clock started: a point's Seconds count from it.
func (r *Recorder) Started() time.Time { return r.start }

// EndToEnd sets each point's end-to-end percentiles from the items sent in its interval:
// sent[i] is when item i was sent, in seconds since the recorder's start, and latency[i] its
// end-to-end latency. An item belongs to the first point whose interval ends at or after it was
// sent; items sent after the last point are left out. It runs once the items have all arrived,
// after the run, so an interval's figures include what arrived during the drain.
func EndToEnd(points []Point, sent []float64, latency []time.Duration) {
	byPoint := make([][]float64, len(points))
	for i, at := range sent {
		j, _ := slices.BinarySearchFunc(points, at, func(p Point, at float64) int { return cmp.Compare(p.Seconds, at) })
		if j < len(points) {
			byPoint[j] = append(byPoint[j], float64(latency[i].Microseconds())/1000)
		}
	}
	for j, lat := range byPoint {
		if len(lat) == 0 {
			continue
		}
		points[j].EndToEndP50Ms, points[j].EndToEndP99Ms = p50p99(lat)
	}
}

// Points returns the points so far.
func (r *Recorder) Points() []Point {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.points)
}

// Tick closes the interval ending at now with the scenario's lag and returns its point. Start
// calls it every Interval; tests call it with a clock of their own.
func (r *Recorder) Tick(now time.Time, lag float64) Point {
	r.mu.Lock()
	defer r.mu.Unlock()
	secs := now.Sub(r.last).Seconds()
	p := Point{Seconds: now.Sub(r.start).Seconds(), Lag: lag, Refused: r.refused}
	if secs > 0 {
		p.Rate = float64(r.items) / secs
	}
	if len(r.lat) > 0 {
		p.P50Ms, p.P99Ms = p50p99(r.lat)
	}
	r.points = append(r.points, p)
	r.items, r.lat, r.refused, r.last = 0, r.lat[:0], 0, now
	return p
}

// Line is the progress line of p.
func (r *Recorder) Line(p Point) string {
	s := fmt.Sprintf("%6.0fs  %10.0f %s  p50 %7.1f ms  p99 %7.1f ms", p.Seconds, p.Rate, r.opts.Unit, p.P50Ms, p.P99Ms)
	if r.opts.Lag != nil {
		s += fmt.Sprintf("  %s %.0f", r.opts.LagName, p.Lag)
	}
	return s + fmt.Sprintf("  refused %d", p.Refused)
}

func (r *Recorder) print(p Point) {
	if r.opts.Quiet {
		return
	}
	if r.tty {
		// Carriage return and erase to the end of the line: one line that updates in place.
		fmt.Fprint(r.opts.Out, "\r"+r.Line(p)+"\x1b[K")
		return
	}
	fmt.Fprintln(r.opts.Out, r.Line(p))
}

// p50p99 sorts lat and returns its median and 99th percentile.
func p50p99(lat []float64) (p50, p99 float64) {
	slices.Sort(lat)
	return Percentile(lat, 0.50), Percentile(lat, 0.99)
}

// Percentile returns the q-quantile of sorted (nearest rank), NaN when it is empty.
func Percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
