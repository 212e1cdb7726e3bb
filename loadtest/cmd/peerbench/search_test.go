package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"carehub/loadtest/report"
)

// TestSearchCases counts, in the Bundles the vitals workload posts, the Observations each search
// must find, and checks searchCases worked out the same.
func TestSearchCases(t *testing.T) {
	for _, obs := range []int{100, 7, 1} {
		t.Run(fmt.Sprintf("obs=%d", obs), func(t *testing.T) {
			w := vitalsWorkload(3, obs, 20261202)
			cases := searchCases(3, obs)
			if len(cases) != 3*len(vitals)*2 {
				t.Fatalf("%d cases, want %d", len(cases), 3*len(vitals)*2)
			}
			for _, c := range cases {
				var b struct {
					Entry []struct {
						Resource struct {
							ResourceType      string `json:"resourceType"`
							EffectiveDateTime string `json:"effectiveDateTime"`
							Code              struct {
								Coding []struct{ System, Code string } `json:"coding"`
							} `json:"code"`
						} `json:"resource"`
					} `json:"entry"`
				}
				if err := json.Unmarshal(w.bodies[c.bundle].data, &b); err != nil {
					t.Fatal(err)
				}
				want := 0
				for _, e := range b.Entry {
					r := e.Resource
					if r.ResourceType != "Observation" || r.Code.Coding[0].System != "http://loinc.org" || r.Code.Coding[0].Code != c.code {
						continue
					}
					at, err := time.Parse(time.RFC3339, r.EffectiveDateTime)
					if err != nil {
						t.Fatal(err)
					}
					if !at.Before(c.since) {
						want++
					}
				}
				if c.want != want {
					t.Errorf("bundle %d %s ge %s: want %d, the Bundle has %d", c.bundle, c.code, c.since.Format(time.RFC3339), c.want, want)
				}
				if obs == 100 && (c.want < 8 || c.want > 17) {
					t.Errorf("bundle %d %s: %d Observations, want 8 to 17 at 100 a Bundle", c.bundle, c.code, c.want)
				}
			}
		})
	}
}

func TestSearchURL(t *testing.T) {
	c := searchCase{code: "8867-4", since: time.Date(2026, 11, 1, 5, 0, 30, 0, time.UTC)}
	got := searchURL("http://127.0.0.1:8080/fhir", "pat-01J", c, 20)
	want := "http://127.0.0.1:8080/fhir/Observation?patient=pat-01J&code=http%3A%2F%2Floinc.org%7C8867-4&date=ge2026-11-01T05%3A00%3A30Z&_count=20"
	if got != want {
		t.Errorf("searchURL =\n%s, want\n%s", got, want)
	}
}

func TestPatientID(t *testing.T) {
	answer := func(locations ...string) bundleAnswer {
		entries := make([]string, len(locations))
		for i, l := range locations {
			entries[i] = fmt.Sprintf(`{"response":{"status":"201 Created","location":%q}}`, l)
		}
		var a bundleAnswer
		if err := json.Unmarshal([]byte(`{"resourceType":"Bundle","type":"transaction-response","entry":[`+strings.Join(entries, ",")+`]}`), &a); err != nil {
			t.Fatal(err)
		}
		return a
	}
	tests := []struct {
		name string
		a    bundleAnswer
		want string // "" for an error
	}{
		{"HAPI", answer("Patient/1/_history/1", "Observation/2/_history/1"), "1"},
		{"carehub", answer("Patient/pat-01JZ8/_history/1", "Observation/obs-01JZ9/_history/1"), "pat-01JZ8"},
		{"absolute, no version", answer("http://127.0.0.1:9/fhir/Patient/7"), "7"},
		{"not the first entry", answer("Observation/2/_history/1", "Patient/3/_history/1"), "3"},
		{"no Patient", answer("Observation/2/_history/1"), ""},
		{"an empty id", answer("Patient/"), ""},
		{"no entries", bundleAnswer{}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := patientID(tc.a)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("patientID = %q, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("patientID = %q, %v, want %q", got, err, tc.want)
			}
		})
	}
}

func TestParsePage(t *testing.T) {
	obs := `{"resource":{"resourceType":"Observation"},"search":{"mode":"match"}}`
	from := "http://127.0.0.1:8080/fhir/Observation?patient=1&_count=2"
	tests := []struct {
		name      string
		page      string
		wantFound int
		wantNext  string
		wantErr   string
	}{
		{name: "HAPI, a next page",
			page:      `{"resourceType":"Bundle","type":"searchset","link":[{"relation":"self","url":"x"},{"relation":"next","url":"http://127.0.0.1:8080/fhir?_getpages=5d1c&_getpagesoffset=2&_count=2&_bundletype=searchset"}],"entry":[` + obs + `,` + obs + `]}`,
			wantFound: 2, wantNext: "http://127.0.0.1:8080/fhir?_getpages=5d1c&_getpagesoffset=2&_count=2&_bundletype=searchset"},
		{name: "carehub, a next page",
			page:      `{"resourceType":"Bundle","type":"searchset","link":[{"relation":"next","url":"http://127.0.0.1:8080/fhir/R4/Observation?_count=2&_page=abc"}],"entry":[` + obs + `,` + obs + `]}`,
			wantFound: 2, wantNext: "http://127.0.0.1:8080/fhir/R4/Observation?_count=2&_page=abc"},
		{name: "a relative next link", page: `{"resourceType":"Bundle","type":"searchset","link":[{"relation":"next","url":"Observation?_page=2"}],"entry":[` + obs + `]}`,
			wantFound: 1, wantNext: "http://127.0.0.1:8080/fhir/Observation?_page=2"},
		{name: "the last page, no search mode", page: `{"resourceType":"Bundle","type":"searchset","entry":[{"resource":{"resourceType":"Observation"}}]}`, wantFound: 1},
		{name: "an empty last page", page: `{"resourceType":"Bundle","type":"searchset","total":0}`},
		{name: "not a searchset", page: `{"resourceType":"Bundle","type":"batch-response"}`, wantErr: "not a searchset"},
		{name: "an OperationOutcome", page: `{"resourceType":"OperationOutcome","issue":[]}`, wantErr: "not a searchset"},
		{name: "an outcome entry", page: `{"resourceType":"Bundle","type":"searchset","entry":[{"resource":{"resourceType":"OperationOutcome"},"search":{"mode":"outcome"}}]}`, wantErr: "not an Observation matched"},
		{name: "an included Patient", page: `{"resourceType":"Bundle","type":"searchset","entry":[` + obs + `,{"resource":{"resourceType":"Patient"},"search":{"mode":"include"}}]}`, wantErr: "entry 1"},
		{name: "an empty next link", page: `{"resourceType":"Bundle","type":"searchset","link":[{"relation":"next","url":""}]}`, wantErr: "not a URL"},
		{name: "not JSON", page: `<html>`, wantErr: "not JSON"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			found, next, err := parsePage([]byte(tc.page), from)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parsePage() = %d, %q, %v, want an error with %q", found, next, err, tc.wantErr)
				}
				return
			}
			if err != nil || found != tc.wantFound || next != tc.wantNext {
				t.Fatalf("parsePage() = %d, %q, %v, want %d, %q", found, next, err, tc.wantFound, tc.wantNext)
			}
		})
	}
}

// TestSearchPages reads a search of 5 Observations served 2 a page from a server that refuses
// once, and checks what is counted.
func TestSearchPages(t *testing.T) {
	var (
		mu      sync.Mutex
		noCache []string
		refused bool
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if !refused && r.URL.Query().Get("page") == "2" {
			refused = true
			w.Header().Set("Retry-After", "0.01")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		noCache = append(noCache, r.Header.Get("Cache-Control"))
		page := map[string]string{"": "1", "1": "2", "2": "3"}[r.URL.Query().Get("page")]
		n := 2
		next := `,"link":[{"relation":"next","url":"/fhir/Observation?page=` + page + `"}]`
		if page == "3" {
			n, next = 1, ""
		}
		entries := strings.TrimSuffix(strings.Repeat(`{"resource":{"resourceType":"Observation"}},`, n), ",")
		fmt.Fprintf(w, `{"resourceType":"Bundle","type":"searchset"%s,"entry":[%s]}`, next, entries)
	}))
	defer srv.Close()
	r := &runner{client: srv.Client()}
	s := &server{name: "peer", base: srv.URL + "/fhir"}
	key := func() string { return "" }
	for _, tc := range []struct {
		want    int
		wantErr string
	}{{want: 5}, {want: 6, wantErr: "5 Observations over 3 pages, 6 loaded match"}} {
		mu.Lock()
		refused, noCache = false, nil
		mu.Unlock()
		tally := &searchTally{rec: report.NewRecorder(report.Options{Quiet: true})}
		done, err := r.search(context.Background(), s, key, s.base+"/Observation?code=x", tc.want, time.Now().Add(time.Minute), tally)
		if tc.wantErr != "" {
			if done || err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("want %d: search() = %v, %v, want an error with %q", tc.want, done, err, tc.wantErr)
			}
		} else if !done || err != nil {
			t.Errorf("want %d: search() = %v, %v", tc.want, done, err)
		}
		if p, f, rf := tally.pages.Load(), tally.found.Load(), tally.refused.Load(); p != 3 || f != 5 || rf != 1 {
			t.Errorf("want %d: %d pages, %d found, %d refused; want 3, 5, 1", tc.want, p, f, rf)
		}
		mu.Lock()
		if strings.Join(noCache, ",") != "no-cache,," {
			t.Errorf("Cache-Control of the pages: %q, want no-cache on the first alone", noCache)
		}
		mu.Unlock()
	}
}

func TestParseSearch(t *testing.T) {
	valid := func() config {
		return config{workloadsFlag: "search", clientsFlag: "1,4", Duration: 20 * time.Second, KeysPerClient: 1, VitalsBundles: 1, ObsPerBundle: 100,
			SearchPatients: 200, SearchCount: 20}
	}
	tests := []struct {
		name    string
		edit    func(*config)
		wantErr string
	}{
		{name: "defaults", edit: func(*config) {}},
		{name: "beside the others", edit: func(c *config) { c.workloadsFlag = "vitals,synthea,search,fanout"; c.Fanout = validFanout() }},
		{name: "no patients", edit: func(c *config) { c.SearchPatients = 0 }, wantErr: "-search-patients"},
		{name: "_count above carehub's 1,000", edit: func(c *config) { c.SearchCount = 1001 }, wantErr: "-search-count"},
		{name: "search flags not read without search", edit: func(c *config) { c.workloadsFlag = "vitals"; c.SearchCount = 0 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.edit(&c)
			if !parsedAsWanted(t, &c, tc.wantErr) {
				return
			}
			if !c.fhir() {
				t.Errorf("fhir() = false for %v", c.Workloads)
			}
		})
	}
}

// parsedAsWanted parses c, a valid config a table case edited: with wantErr, it checks that
// parse fails naming it; otherwise that parse succeeds. It reports whether the case goes on to
// check what parse made of c.
func parsedAsWanted(t *testing.T, c *config, wantErr string) bool {
	t.Helper()
	err := c.parse()
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("parse() = %v, want an error with %q", err, wantErr)
		}
		return false
	}
	if err != nil {
		t.Fatalf("parse() = %v", err)
	}
	return true
}

func validFanout() fanoutConfig {
	return fanoutConfig{socketsFlag: "2000", Rate: 100, Reach: 20, Publishers: 8, PublishKeys: 4, Dial: 100, Warmup: 5 * time.Second, Drain: 10 * time.Second}
}

// fakeFHIR serves what the search workload asks of a server: transactions of vitals Bundles
// (ids p1, p2, …), the Observation count, and Observation searches by patient, code and date,
// paged by offset. With lose, it counts every fifth Observation but never finds it.
type fakeFHIR struct {
	mu   sync.Mutex
	obs  []fakeObs
	pats int
	lose bool
}

type fakeObs struct {
	patient, code string
	at            time.Time
}

func (f *fakeFHIR) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodPost:
		f.transaction(w, r)
	case q.Get("_summary") == "count":
		fmt.Fprintf(w, `{"resourceType":"Bundle","type":"searchset","total":%d}`, len(f.obs))
	default:
		var match []fakeObs
		since, _ := time.Parse(time.RFC3339, strings.TrimPrefix(q.Get("date"), "ge"))
		for _, o := range f.obs {
			if o.patient == q.Get("patient") && "http://loinc.org|"+o.code == q.Get("code") && !o.at.Before(since) {
				match = append(match, o)
			}
		}
		var offset, count int
		fmt.Sscan(q.Get("_count"), &count)
		fmt.Sscan(q.Get("offset"), &offset)
		end := min(offset+count, len(match))
		next := ""
		if end < len(match) {
			q.Set("offset", fmt.Sprint(end))
			next = `,"link":[{"relation":"next","url":"Observation?` + q.Encode() + `"}]`
		}
		entries := strings.TrimSuffix(strings.Repeat(`{"resource":{"resourceType":"Observation"},"search":{"mode":"match"}},`, end-offset), ",")
		fmt.Fprintf(w, `{"resourceType":"Bundle","type":"searchset"%s,"entry":[%s]}`, next, entries)
	}
}

func (f *fakeFHIR) transaction(w http.ResponseWriter, r *http.Request) {
	var b struct {
		Entry []struct {
			Resource struct {
				ResourceType      string `json:"resourceType"`
				EffectiveDateTime string `json:"effectiveDateTime"`
				Code              struct {
					Coding []struct{ Code string } `json:"coding"`
				} `json:"code"`
			} `json:"resource"`
		} `json:"entry"`
	}
	_ = json.NewDecoder(r.Body).Decode(&b)
	f.pats++
	patient := fmt.Sprintf("p%d", f.pats)
	var answers []string
	for i, e := range b.Entry {
		loc := fmt.Sprintf("Observation/o%d-%d/_history/1", f.pats, i)
		if e.Resource.ResourceType == "Patient" {
			loc = "Patient/" + patient + "/_history/1"
		} else {
			at, _ := time.Parse(time.RFC3339, e.Resource.EffectiveDateTime)
			o := fakeObs{patient: patient, code: e.Resource.Code.Coding[0].Code, at: at}
			if f.lose && i%5 == 0 {
				o.code = "lost"
			}
			f.obs = append(f.obs, o)
		}
		answers = append(answers, fmt.Sprintf(`{"response":{"status":"201 Created","location":%q}}`, loc))
	}
	fmt.Fprintf(w, `{"resourceType":"Bundle","type":"transaction-response","entry":[%s]}`, strings.Join(answers, ","))
}

// TestSearchWorkload loads vitals Bundles into a fake server, checks the searches, and runs a
// short phase; a server that loses an Observation fails the check.
func TestSearchWorkload(t *testing.T) {
	for _, lose := range []bool{false, true} {
		t.Run(fmt.Sprintf("lose=%v", lose), func(t *testing.T) {
			srv := httptest.NewServer(&fakeFHIR{lose: lose})
			defer srv.Close()
			r := &runner{client: srv.Client(), readable: 100 * time.Millisecond, quiet: true, maxErrors: 5}
			s := &server{name: "fake", base: srv.URL + "/fhir"}
			w := vitalsWorkload(4, 30, 20261202)
			cases := searchCases(4, 30)
			plan, err := r.loadSearch(context.Background(), s, w, cases, 2)
			if lose {
				if err == nil || !strings.Contains(err.Error(), "loaded match") {
					t.Fatalf("loadSearch() = %v on a server that does not find some, want a count that differs", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(plan.ids, ",") != "p1,p2,p3,p4" {
				t.Errorf("ids %v, want p1 to p4", plan.ids)
			}
			ph := r.runSearch(context.Background(), s, plan, 2, 200*time.Millisecond, false)
			if ph.Errors != 0 || ph.Searches == 0 || ph.Requests < 2*ph.Searches || ph.Resources == 0 || ph.P99Ms <= 0 {
				t.Errorf("phase: %d errors %v, %d searches, %d pages, %d Observations, p99 %v ms", ph.Errors, ph.ErrorSamples, ph.Searches, ph.Requests, ph.Resources, ph.P99Ms)
			}
		})
	}
}

func TestCompareSearch(t *testing.T) {
	c := phase{Workload: "search", SearchesPerSec: 300, ResourcesPerSec: 3900, P50Ms: 2, P99Ms: 8}
	h := phase{Workload: "search", SearchesPerSec: 100, ResourcesPerSec: 1300, P50Ms: 10, P99Ms: 40}
	got := compare("search", c, h)
	if got.Unit != "searches/s" || got.CarehubAcknowledged != 300 || got.HAPI != 100 || got.RatioAcknowledged != 3 || got.RatioReadable != 3 {
		t.Errorf("rates: %+v", got)
	}
	if got.RatioP50 != 0.2 || got.RatioP99 != 0.2 {
		t.Errorf("latency ratios p50 %v p99 %v, want 0.2 and 0.2", got.RatioP50, got.RatioP99)
	}
}
