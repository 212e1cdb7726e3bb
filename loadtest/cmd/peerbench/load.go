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
	Requests     int64    `json:"requests"`     // transactions acknowledged whole (search: pages answered)
	Resources    int64    `json:"resources"`    // their entries (search: the Observations on the pages)
	Observations int64    `json:"observations"` // their Observations
	Errors       int64    `json:"errors"`       // answers that were not a whole transaction-response (or no answer; search: searches that failed)
	Refused      int64    `json:"refused"`      // 429/503 answers, retried after Retry-After (not errors, not counted)
	ErrorSamples []string `json:"errorSamples,omitempty"`

	P50Ms float64 `json:"p50Ms"`
	P99Ms float64 `json:"p99Ms"`
	MaxMs float64 `json:"maxMs"`

	ResourcesPerSec    float64 `json:"resourcesPerSec"`    // acknowledged (search: found)
	ObservationsPerSec float64 `json:"observationsPerSec"` // acknowledged

	// Searches (the search workload) are the searches read to their last page with every
	// Observation loaded for them found; latencies are of single pages.
	Searches       int64   `json:"searches,omitempty"`
	SearchesPerSec float64 `json:"searchesPerSec,omitempty"`

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

// call sends req as every workload does (FHIR JSON accepted, the key if any) and reads the whole
// answer; a 429 or 503 comes back as the wait it asked for, without its body.
func (r *runner) call(req *http.Request, key string) (data []byte, status int, wait time.Duration, err error) {
	req.Header.Set("Accept", "application/fhir+json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, 0, 0, err
	}
	data, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, 0, 0, fmt.Errorf("%s %s: reading the answer: %w", req.Method, req.URL, err)
	}
	if wait := refusal(resp); wait > 0 {
		return nil, resp.StatusCode, wait, nil
	}
	return data, resp.StatusCode, 0, nil
}

// post sends one Bundle and checks the answer: 200/201 with a Bundle of the response type
// wanted, one entry per entry sent, each 200 or 201. A 429 or 503 is returned as refused with
// the wait it asked for.
func (r *runner) post(ctx context.Context, s *server, key string, b body, wantType string) (refused time.Duration, err error) {
	_, refused, err = r.send(ctx, s, key, b, wantType)
	return refused, err
}

// send is post, returning the answer too (the search workload reads the Patients' ids from it).
func (r *runner) send(ctx context.Context, s *server, key string, b body, wantType string) (a bundleAnswer, refused time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base, bytes.NewReader(b.data))
	if err != nil {
		return a, 0, err
	}
	req.Header.Set("Content-Type", "application/fhir+json")
	data, status, wait, err := r.call(req, key)
	if err != nil || wait > 0 {
		return a, wait, err
	}
	if status != http.StatusOK && status != http.StatusCreated {
		return a, 0, fmt.Errorf("%s: %d %s", b.name, status, snippet(data))
	}
	if err := json.Unmarshal(data, &a); err != nil {
		return a, 0, fmt.Errorf("%s: %d, not JSON: %v", b.name, status, err)
	}
	if a.ResourceType != "Bundle" || a.Type != wantType || len(a.Entry) != b.entries {
		return a, 0, fmt.Errorf("%s: %d, a %s %s of %d entries for %d sent: %s", b.name, status, a.Type, a.ResourceType, len(a.Entry), b.entries, snippet(data))
	}
	for i, e := range a.Entry {
		if e.Response == nil || !(strings.HasPrefix(e.Response.Status, "201") || strings.HasPrefix(e.Response.Status, "200")) {
			st := "no response"
			if e.Response != nil {
				st = e.Response.Status
			}
			return a, 0, fmt.Errorf("%s: entry %d answered %q", b.name, i, st)
		}
	}
	return a, 0, nil
}

// refusal is the wait a 429 or 503 answer asks for (Retry-After, 1 s if it names none, at most
// 10 s), 0 for any other answer.
func refusal(resp *http.Response) time.Duration {
	if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
		return 0
	}
	wait := time.Second
	if secs, err := strconv.ParseFloat(resp.Header.Get("Retry-After"), 64); err == nil && secs > 0 {
		wait = time.Duration(min(secs, 10) * float64(time.Second))
	}
	return wait
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
		if _, err := r.sendOnce(ctx, s, b, "batch-response"); err != nil {
			return err
		}
	}
	return nil
}

// sendOnce sends a Bundle that is not part of a measured phase with s's first key, waiting out
// up to 20 refusals.
func (r *runner) sendOnce(ctx context.Context, s *server, b body, wantType string) (bundleAnswer, error) {
	for attempt := 0; ; attempt++ {
		a, wait, err := r.send(ctx, s, firstKey(s), b, wantType)
		if err != nil {
			return a, fmt.Errorf("%s: %w", s.name, err)
		}
		if wait == 0 {
			return a, nil
		}
		if attempt > 20 {
			return a, fmt.Errorf("%s: %s refused 20 times", s.name, b.name)
		}
		time.Sleep(wait)
	}
}

// firstKey is the key of s's requests outside the measured phases ("" for a server without keys).
func firstKey(s *server) string {
	if len(s.keys) == 0 {
		return ""
	}
	return s.keys[0]
}

// waitObservations polls s's Observation count every 50 ms until it reaches want or r.readable
// has passed, and returns the last count.
func (r *runner) waitObservations(ctx context.Context, s *server, want int64) (int64, error) {
	deadline := time.Now().Add(r.readable)
	for {
		got, err := r.observationCount(ctx, s)
		if err != nil || got >= want || time.Now().After(deadline) {
			return got, err
		}
		time.Sleep(50 * time.Millisecond)
	}
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
	if key := firstKey(s); key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
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
	mark := markCPU(s)
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
	got, err := r.waitObservations(ctx, s, want)
	if err != nil {
		return ph, err
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
	mark.spent(&ph, s)
	if got < want {
		ph.ReadableResourcesPerSec, ph.ReadableObservationsPerSec = 0, 0
	}
	return ph, err
}

// cpuMark is where the CPU counters a phase reports stood at its start.
type cpuMark struct{ proc, pg, machine, self, jit time.Duration }

func markCPU(s *server) cpuMark {
	proc, pg := s.CPU()
	return cpuMark{proc: proc, pg: pg, machine: machineBusy(), self: loadcli.ProcessCPU(), jit: jitCPU(s.pid)}
}

// spent sets ph's CPU figures: what s and its PostgreSQL cluster, s's JIT compilers and the rest
// of the machine used since m, and the first two per resource of ph's.
func (m cpuMark) spent(ph *phase, s *server) {
	proc, pg := s.CPU()
	ph.CPUServerSec, ph.CPUPostgresSec = (proc - m.proc).Seconds(), (pg - m.pg).Seconds()
	ph.JITCPUSec = (jitCPU(s.pid) - m.jit).Seconds()
	if busy := machineBusy(); busy > 0 && m.machine > 0 {
		ph.OtherCPUSec = max(0, (busy-m.machine).Seconds()-ph.CPUServerSec-ph.CPUPostgresSec-(loadcli.ProcessCPU()-m.self).Seconds())
	}
	if ph.Resources > 0 {
		ph.CPUMsPerRes = 1000 * (ph.CPUServerSec + ph.CPUPostgresSec) / float64(ph.Resources)
	}
}
