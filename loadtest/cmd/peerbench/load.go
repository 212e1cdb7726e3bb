package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"carehub/loadtest/loadcli"
	"carehub/loadtest/report"
)

// phase is one measured (or warm-up) run of a workload against a server at a concurrency.
type phase struct {
	Server   string `json:"server"`
	Workload string `json:"workload"`
	Clients  int    `json:"clients"`
	Warmup   bool   `json:"warmup,omitempty"`

	Seconds      float64  `json:"seconds"`      // first request sent → last answer
	Requests     int64    `json:"requests"`     // transactions acknowledged whole
	Resources    int64    `json:"resources"`    // their entries
	Observations int64    `json:"observations"` // their Observations
	Errors       int64    `json:"errors"`       // answers that were not a whole transaction-response (or no answer)
	Refused      int64    `json:"refused"`      // 429/503 answers, retried after Retry-After (not errors, not counted)
	ErrorSamples []string `json:"errorSamples,omitempty"`

	P50Ms float64 `json:"p50Ms"`
	P99Ms float64 `json:"p99Ms"`
	MaxMs float64 `json:"maxMs"`

	ResourcesPerSec    float64 `json:"resourcesPerSec"`    // acknowledged
	ObservationsPerSec float64 `json:"observationsPerSec"` // acknowledged

	// Readable: after the last answer, GET {base}/Observation?_summary=count is polled until it
	// counts every Observation acknowledged (the count before the phase plus the phase's). The
	// rates divide what was acknowledged by the time to that moment.
	ReadableAfterSec           float64 `json:"readableAfterSec"`
	ReadableResourcesPerSec    float64 `json:"readableResourcesPerSec"`
	ReadableObservationsPerSec float64 `json:"readableObservationsPerSec"`
	ObservationCount           int64   `json:"observationCount"`      // the search's total at the end
	NotReadable                int64   `json:"notReadable,omitempty"` // Observations acknowledged, still not counted at the timeout

	// CPU seconds the server's process and its PostgreSQL cluster used from the phase's start
	// to the moment everything was readable, per 1,000 resources.
	CPUServerSec   float64 `json:"cpuServerSec"`
	CPUPostgresSec float64 `json:"cpuPostgresSec"`
	CPUMsPerRes    float64 `json:"cpuMsPerResource"`
	// OtherCPUSec is the CPU the rest of the machine used in the same window: the whole machine's
	// busy time (/proc/stat) less the server's, its cluster's and this process's. The idle peer
	// and anything else running on the machine show here; both move a phase's figures.
	OtherCPUSec float64 `json:"otherCpuSec"`
	// JITCPUSec is the part of CPUServerSec the JVM's JIT compilers took (HAPI; 0 for carehub):
	// well above 0, the JVM was still compiling, not at its steady state.
	JITCPUSec float64 `json:"jitCpuSec,omitempty"`

	points []report.Point
}

type runner struct {
	client    *http.Client
	maxReq    int
	readable  time.Duration
	quiet     bool
	maxErrors int
}

// bundleAnswer is what is checked of a transaction's answer.
type bundleAnswer struct {
	ResourceType string `json:"resourceType"`
	Type         string `json:"type"`
	Entry        []struct {
		Response *struct {
			Status   string `json:"status"`
			Location string `json:"location"`
		} `json:"response"`
	} `json:"entry"`
}

// post sends one Bundle and checks the answer: 200/201 with a Bundle of the response type
// wanted, one entry per entry sent, each 200 or 201. A 429 or 503 is returned as refused with
// the wait it asked for.
func (r *runner) post(ctx context.Context, s *server, key string, b body, wantType string) (refused time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base, bytes.NewReader(b.data))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/fhir+json")
	req.Header.Set("Accept", "application/fhir+json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, fmt.Errorf("%s: reading the answer: %w", b.name, err)
	}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		wait := time.Second
		if secs, err := strconv.ParseFloat(resp.Header.Get("Retry-After"), 64); err == nil && secs > 0 {
			wait = time.Duration(min(secs, 10) * float64(time.Second))
		}
		return wait, nil
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return 0, fmt.Errorf("%s: %d %s", b.name, resp.StatusCode, snippet(data))
	}
	var a bundleAnswer
	if err := json.Unmarshal(data, &a); err != nil {
		return 0, fmt.Errorf("%s: %d, not JSON: %v", b.name, resp.StatusCode, err)
	}
	if a.ResourceType != "Bundle" || a.Type != wantType || len(a.Entry) != b.entries {
		return 0, fmt.Errorf("%s: %d, a %s %s of %d entries for %d sent: %s", b.name, resp.StatusCode, a.Type, a.ResourceType, len(a.Entry), b.entries, snippet(data))
	}
	for i, e := range a.Entry {
		if e.Response == nil || !(strings.HasPrefix(e.Response.Status, "201") || strings.HasPrefix(e.Response.Status, "200")) {
			st := "no response"
			if e.Response != nil {
				st = e.Response.Status
			}
			return 0, fmt.Errorf("%s: entry %d answered %q", b.name, i, st)
		}
	}
	return 0, nil
}

func snippet(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// providers posts the Synthea hospital and practitioner batches once (their conditional creates
// are what the patients' conditional references resolve to).
func (r *runner) providers(ctx context.Context, s *server, w workload) error {
	for _, b := range w.providers {
		key := ""
		if len(s.keys) > 0 {
			key = s.keys[0]
		}
		for attempt := 0; ; attempt++ {
			wait, err := r.post(ctx, s, key, b, "batch-response")
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			if wait == 0 {
				break
			}
			if attempt > 20 {
				return fmt.Errorf("%s: %s refused 20 times", s.name, b.name)
			}
			time.Sleep(wait)
		}
	}
	return nil
}

// observationCount is GET {base}/Observation?_summary=count's total.
func (r *runner) observationCount(ctx context.Context, s *server) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/Observation?_summary=count", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "application/fhir+json")
	// HAPI answers a search repeated within a minute from its cache unless told not to.
	req.Header.Set("Cache-Control", "no-cache")
	if len(s.keys) > 0 {
		req.Header.Set("Authorization", "Bearer "+s.keys[0])
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s Observation count: %d %s", s.name, resp.StatusCode, snippet(data))
	}
	var b struct {
		Total *int64 `json:"total"`
	}
	if err := json.Unmarshal(data, &b); err != nil || b.Total == nil {
		return 0, fmt.Errorf("%s Observation count: no total in %s", s.name, snippet(data))
	}
	return *b.Total, nil
}

// run posts w's Bundles with clients concurrent clients for d (or r.maxReq requests), each
// client taking the next Bundle in order, then waits until every acknowledged Observation is
// counted by a search.
func (r *runner) run(ctx context.Context, s *server, w workload, clients int, d time.Duration, warmup bool) (phase, error) {
	ph := phase{Server: s.name, Workload: w.name, Clients: clients, Warmup: warmup}
	before, err := r.observationCount(ctx, s)
	if err != nil {
		return ph, err
	}
	unit := "resources/s"
	rec := report.NewRecorder(report.Options{Unit: unit, Quiet: r.quiet})
	var (
		next, requests, resources, observations, errs, refused atomic.Int64
		mu                                                     sync.Mutex
		lat                                                    []float64
		samples                                                []string
	)
	cpu0p, cpu0g := s.CPU()
	machine0, self0, jit0 := machineBusy(), loadcli.ProcessCPU(), jitCPU(s.pid)
	start := time.Now()
	deadline := start.Add(d)
	rec.Start()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keyAt := c
			for ctx.Err() == nil && time.Now().Before(deadline) {
				i := next.Add(1) - 1
				if r.maxReq > 0 && i >= int64(r.maxReq) {
					return
				}
				b := w.bodies[int(i)%len(w.bodies)]
				for ctx.Err() == nil {
					key := ""
					if len(s.keys) > 0 {
						// Each client takes the keys in turn (carehub's rate limits are per key).
						key = s.keys[keyAt%len(s.keys)]
						keyAt += clients
					}
					t0 := time.Now()
					wait, err := r.post(ctx, s, key, b, "transaction-response")
					took := time.Since(t0)
					if err != nil {
						if ctx.Err() != nil {
							return
						}
						errs.Add(1)
						mu.Lock()
						if len(samples) < r.maxErrors {
							samples = append(samples, err.Error())
						}
						mu.Unlock()
						break
					}
					if wait > 0 {
						refused.Add(1)
						rec.Refuse(1)
						if time.Now().Add(wait).After(deadline) {
							return // the phase is over; the Bundle was never accepted
						}
						time.Sleep(wait)
						continue
					}
					requests.Add(1)
					resources.Add(int64(b.entries))
					observations.Add(int64(b.obs))
					rec.Observe(b.entries, took)
					mu.Lock()
					lat = append(lat, float64(took.Microseconds())/1000)
					mu.Unlock()
					break
				}
			}
		}()
	}
	wg.Wait()
	ph.points = rec.Stop()
	end := time.Now()
	ph.Seconds = end.Sub(start).Seconds()
	ph.Requests, ph.Resources, ph.Observations = requests.Load(), resources.Load(), observations.Load()
	ph.Errors, ph.Refused, ph.ErrorSamples = errs.Load(), refused.Load(), samples
	slices.Sort(lat)
	if len(lat) > 0 {
		ph.P50Ms, ph.P99Ms, ph.MaxMs = report.Percentile(lat, 0.5), report.Percentile(lat, 0.99), lat[len(lat)-1]
	}
	ph.ResourcesPerSec = float64(ph.Resources) / ph.Seconds
	ph.ObservationsPerSec = float64(ph.Observations) / ph.Seconds

	// Readable: poll the search count until it has every acknowledged Observation.
	want := before + ph.Observations
	var got int64
	for {
		got, err = r.observationCount(ctx, s)
		if err != nil {
			return ph, err
		}
		if got >= want || time.Since(end) > r.readable {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	readyAt := time.Now()
	if got < want {
		ph.NotReadable = want - got
		err = fmt.Errorf("%s %s c=%d: %d acknowledged Observations not counted by a search %s after the run", s.name, w.name, clients, want-got, r.readable)
	}
	ph.ObservationCount = got
	ph.ReadableAfterSec = readyAt.Sub(end).Seconds()
	if got < want {
		ph.ReadableAfterSec = -1 // never, within the timeout
	}
	total := readyAt.Sub(start).Seconds()
	ph.ReadableResourcesPerSec = float64(ph.Resources) / total
	ph.ReadableObservationsPerSec = float64(ph.Observations) / total
	cpu1p, cpu1g := s.CPU()
	ph.CPUServerSec, ph.CPUPostgresSec = (cpu1p - cpu0p).Seconds(), (cpu1g - cpu0g).Seconds()
	ph.JITCPUSec = (jitCPU(s.pid) - jit0).Seconds()
	if m := machineBusy(); m > 0 && machine0 > 0 {
		ph.OtherCPUSec = max(0, (m-machine0).Seconds()-ph.CPUServerSec-ph.CPUPostgresSec-(loadcli.ProcessCPU()-self0).Seconds())
	}
	if ph.Resources > 0 {
		ph.CPUMsPerRes = 1000 * (ph.CPUServerSec + ph.CPUPostgresSec) / float64(ph.Resources)
	}
	if got < want {
		ph.ReadableResourcesPerSec, ph.ReadableObservationsPerSec = 0, 0
	}
	return ph, err
}
