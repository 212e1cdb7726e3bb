package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"carehub/loadtest/report"
)

// The search workload (issue 59): a patient's vitals by code and date, paged, read as a client
// reads them, from the vitals Bundles loaded into each server first.

// searchCase is one search: the patient of vitals Bundle bundle, one of its vitals, a lower
// bound on the date, and how many of the Bundle's Observations match.
type searchCase struct {
	bundle int
	code   string // a LOINC code of vitals
	since  time.Time
	want   int
}

// searchCases are the searches of n loaded vitals Bundles of obs Observations each: for every
// patient and vital, from half a minute after the patient's first reading and from half a
// minute after its middle one. Readings are on the minute, so the bounds fall between them and
// no server's reading of a date's precision changes what matches. The order is shuffled with a
// fixed seed: consecutive searches are of different patients, and every server and phase is
// sent the same sequence.
func searchCases(n, obs int) []searchCase {
	var cs []searchCase
	for i := range n {
		for j, v := range vitals {
			for _, after := range []int{0, obs / 2} {
				c := searchCase{bundle: i, code: v.loinc, since: vitalTaken(i, after).Add(30 * time.Second)}
				for k := j; k < obs; k += len(vitals) {
					if vitalTaken(i, k).After(c.since) {
						c.want++
					}
				}
				cs = append(cs, c)
			}
		}
	}
	r := rand.New(rand.NewPCG(59, 20261202))
	r.Shuffle(len(cs), func(a, b int) { cs[a], cs[b] = cs[b], cs[a] })
	return cs
}

// searchURL is c's first page on the server at base, which gave its patient the id patient.
func searchURL(base, patient string, c searchCase, count int) string {
	return base + "/Observation?patient=" + url.QueryEscape(patient) +
		"&code=" + url.QueryEscape("http://loinc.org|"+c.code) +
		"&date=" + url.QueryEscape("ge"+c.since.Format(time.RFC3339)) +
		"&_count=" + strconv.Itoa(count)
}

// patientID is the id a server gave the Patient of a transaction, from its answer's entry whose
// location is Patient/<id>[/_history/<version>], relative or absolute.
func patientID(a bundleAnswer) (string, error) {
	for _, e := range a.Entry {
		if e.Response == nil {
			continue
		}
		parts := strings.Split(e.Response.Location, "/")
		for i := len(parts) - 2; i >= 0; i-- {
			if parts[i] == "Patient" && parts[i+1] != "" {
				return parts[i+1], nil
			}
		}
	}
	return "", errors.New("no entry's location is a Patient's")
}

// searchPage is what is checked of a page of a search's answer.
type searchPage struct {
	ResourceType string `json:"resourceType"`
	Type         string `json:"type"`
	Link         []struct {
		Relation string `json:"relation"`
		URL      string `json:"url"`
	} `json:"link"`
	Entry []struct {
		Resource struct {
			ResourceType string `json:"resourceType"`
		} `json:"resource"`
		Search *struct {
			Mode string `json:"mode"`
		} `json:"search"`
	} `json:"entry"`
}

// parsePage reads a page: it must be a searchset Bundle whose entries are all Observations the
// search matched. It returns how many, and the next page's URL resolved against from, the
// page's own ("" on the last page).
func parsePage(data []byte, from string) (found int, next string, err error) {
	var p searchPage
	if err := json.Unmarshal(data, &p); err != nil {
		return 0, "", fmt.Errorf("not JSON: %v", err)
	}
	if p.ResourceType != "Bundle" || p.Type != "searchset" {
		return 0, "", fmt.Errorf("a %s %s, not a searchset Bundle: %s", p.Type, p.ResourceType, snippet(data))
	}
	for i, e := range p.Entry {
		if e.Resource.ResourceType != "Observation" || (e.Search != nil && e.Search.Mode != "match") {
			mode := ""
			if e.Search != nil {
				mode = e.Search.Mode
			}
			return 0, "", fmt.Errorf("entry %d is a %q (search mode %q), not an Observation matched", i, e.Resource.ResourceType, mode)
		}
	}
	for _, l := range p.Link {
		if l.Relation != "next" {
			continue
		}
		base, err := url.Parse(from)
		if err != nil {
			return 0, "", err
		}
		u, err := base.Parse(l.URL)
		if err != nil || l.URL == "" {
			return 0, "", fmt.Errorf("next link %q: not a URL", l.URL)
		}
		next = u.String()
	}
	return len(p.Entry), next, nil
}

// searchPlan is the search workload on one server: its ids of the loaded patients and the
// searches made of them.
type searchPlan struct {
	ids   []string
	cases []searchCase
	count int // _count
}

// loadSearch posts w's Bundles to s one at a time (not measured), waits until s counts every
// Observation in them, and checks that the plan's searches find them, paging by 5 (with 100
// Observations per Bundle the measured searches often fit one page of 20: this reads several).
func (r *runner) loadSearch(ctx context.Context, s *server, w workload, cases []searchCase, count int) (searchPlan, error) {
	plan := searchPlan{cases: cases, count: count}
	before, err := r.observationCount(ctx, s)
	if err != nil {
		return plan, err
	}
	_, obs := w.resources()
	for _, b := range w.bodies {
		a, err := r.sendOnce(ctx, s, b, "transaction-response")
		if err != nil {
			return plan, err
		}
		id, err := patientID(a)
		if err != nil {
			return plan, fmt.Errorf("%s %s: %w", s.name, b.name, err)
		}
		plan.ids = append(plan.ids, id)
	}
	if got, err := r.waitObservations(ctx, s, before+int64(obs)); err != nil {
		return plan, err
	} else if got < before+int64(obs) {
		return plan, fmt.Errorf("%s: %d of the %d Observations loaded not counted by a search %s after", s.name, before+int64(obs)-got, obs, r.readable)
	}
	return plan, r.checkSearch(ctx, s, plan)
}

// checkSearch reads a dozen of plan's searches on s to their end, 5 Observations a page, and
// fails on the first that does not find what it must.
func (r *runner) checkSearch(ctx context.Context, s *server, plan searchPlan) error {
	r = &runner{client: r.client} // -max-requests bounds the measured phases alone
	t := &searchTally{rec: report.NewRecorder(report.Options{Quiet: true})}
	key := func() string { return firstKey(s) }
	for _, c := range plan.cases[:min(len(plan.cases), 2*len(vitals))] {
		done, err := r.search(ctx, s, key, searchURL(s.base, plan.ids[c.bundle], c, 5), c.want, time.Now().Add(time.Minute), t)
		if err == nil && !done {
			err = fmt.Errorf("%s: a search refused for a minute", s.name)
		}
		if err != nil {
			return fmt.Errorf("checking the search: %w", err)
		}
	}
	return nil
}

// searchTally is what a search phase's clients count together.
type searchTally struct {
	rec                                         *report.Recorder
	sent, pages, found, searches, errs, refused atomic.Int64
	mu                                          sync.Mutex
	lat                                         []float64
	samples                                     []string
}

// runSearch makes plan's searches on s with clients concurrent clients for d (or r.maxReq page
// requests): each client takes the next search, reads its first page and follows the next
// links to the last, then takes the next. Each page is a latency; a search is counted once read
// to its end with the Observations it must find, an error otherwise.
func (r *runner) runSearch(ctx context.Context, s *server, plan searchPlan, clients int, d time.Duration, warmup bool) phase {
	ph := phase{Server: s.name, Workload: "search", Clients: clients, Warmup: warmup}
	t := &searchTally{rec: report.NewRecorder(report.Options{Unit: "resources/s", Quiet: r.quiet})}
	var next atomic.Int64
	mark := markCPU(s)
	start := time.Now()
	deadline := start.Add(d)
	t.rec.Start()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keyAt := c
			key := func() string {
				if len(s.keys) == 0 {
					return ""
				}
				// Each client takes the keys in turn (carehub's rate limits are per key).
				k := s.keys[keyAt%len(s.keys)]
				keyAt += clients
				return k
			}
			for ctx.Err() == nil && time.Now().Before(deadline) {
				if r.maxReq > 0 && t.sent.Load() >= int64(r.maxReq) {
					return
				}
				sc := plan.cases[int(next.Add(1)-1)%len(plan.cases)]
				done, err := r.search(ctx, s, key, searchURL(s.base, plan.ids[sc.bundle], sc, plan.count), sc.want, deadline, t)
				switch {
				case err != nil && ctx.Err() == nil:
					t.fail(err, r.maxErrors)
				case done:
					t.searches.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	ph.points = t.rec.Stop()
	ph.Seconds = time.Since(start).Seconds()
	ph.Requests, ph.Resources, ph.Searches = t.pages.Load(), t.found.Load(), t.searches.Load()
	ph.Errors, ph.Refused, ph.ErrorSamples = t.errs.Load(), t.refused.Load(), t.samples
	ph.ResourcesPerSec, ph.SearchesPerSec = float64(ph.Resources)/ph.Seconds, float64(ph.Searches)/ph.Seconds
	ph.P50Ms, ph.P99Ms, ph.MaxMs = t.percentiles()
	mark.spent(&ph, s)
	return ph
}

// search reads a search from its first page, u, to its last, and checks that the pages hold
// want Observations in all. It stops unfinished (false, nil) when the phase's deadline passes
// while it waits out a refusal, or when the phase's requests (-max-requests) run out.
func (r *runner) search(ctx context.Context, s *server, key func() string, u string, want int, deadline time.Time, t *searchTally) (bool, error) {
	got, pages := 0, 0
	for u != "" {
		if r.maxReq > 0 && t.sent.Add(1) > int64(r.maxReq) {
			return false, nil
		}
		if pages > want+1 { // a page holds at least one Observation, but for an empty last page
			return false, fmt.Errorf("%s: more than %d pages for %d Observations", s.name, pages, want)
		}
		t0 := time.Now()
		data, wait, err := r.getPage(ctx, s, key(), u, pages == 0)
		took := time.Since(t0)
		if err != nil {
			return false, err
		}
		if wait > 0 {
			t.refused.Add(1)
			t.rec.Refuse(1)
			if time.Now().Add(wait).After(deadline) {
				return false, nil
			}
			time.Sleep(wait)
			continue
		}
		n, next, err := parsePage(data, u)
		if err != nil {
			return false, fmt.Errorf("%s page %d of %s: %w", s.name, pages+1, u, err)
		}
		t.page(n, took)
		got, pages, u = got+n, pages+1, next
	}
	if got != want {
		return false, fmt.Errorf("%s: %d Observations over %d pages, %d loaded match", s.name, got, pages, want)
	}
	return true, nil
}

// getPage fetches one page of a search. The first page asks for no cached answer: HAPI otherwise
// answers a search repeated within a minute from the results it stored for it. A 429 or 503 is
// returned as refused with the wait it asked for.
func (r *runner) getPage(ctx context.Context, s *server, key, u string, first bool) ([]byte, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, 0, err
	}
	if first {
		req.Header.Set("Cache-Control", "no-cache")
	}
	data, status, wait, err := r.call(req, key)
	if err != nil || wait > 0 {
		return nil, wait, err
	}
	if status != http.StatusOK {
		return nil, 0, fmt.Errorf("%s %s: %d %s", s.name, u, status, snippet(data))
	}
	return data, 0, nil
}

func (t *searchTally) page(found int, took time.Duration) {
	t.pages.Add(1)
	t.found.Add(int64(found))
	t.rec.Observe(found, took)
	t.mu.Lock()
	t.lat = append(t.lat, float64(took.Microseconds())/1000)
	t.mu.Unlock()
}

func (t *searchTally) fail(err error, keep int) {
	t.errs.Add(1)
	t.mu.Lock()
	if len(t.samples) < keep {
		t.samples = append(t.samples, err.Error())
	}
	t.mu.Unlock()
}

func (t *searchTally) percentiles() (p50, p99, maxMs float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lat) == 0 {
		return 0, 0, 0
	}
	slices.Sort(t.lat)
	return report.Percentile(t.lat, 0.5), report.Percentile(t.lat, 0.99), t.lat[len(t.lat)-1]
}
