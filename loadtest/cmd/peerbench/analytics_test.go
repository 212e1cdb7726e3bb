package main

import (
	"cmp"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"carehub/kernel/events"
)

func TestParseAnalytics(t *testing.T) {
	valid := func() config {
		return config{workloadsFlag: "analytics", clientsFlag: "1", Duration: 20 * time.Second, KeysPerClient: 1, VitalsBundles: 1, ObsPerBundle: 1,
			Analytics: analyticsConfig{Records: 1_000_000, ratesFlag: "5000,10000", Window: 5 * time.Minute, Partitions: 6}}
	}
	tests := []struct {
		name    string
		edit    func(*config)
		wantErr string
		rates   []int
	}{
		{name: "defaults", edit: func(*config) {}, rates: []int{5000, 10000}},
		{name: "beside fanout", edit: func(c *config) { c.workloadsFlag = "fanout,analytics"; c.Fanout = validFanout() }, rates: []int{5000, 10000}},
		{name: "the backlog alone", edit: func(c *config) { c.Analytics.ratesFlag = "" }},
		{name: "spaces", edit: func(c *config) { c.Analytics.ratesFlag = " 5000 , 20000 " }, rates: []int{5000, 20000}},
		{name: "a rate too high", edit: func(c *config) { c.Analytics.ratesFlag = "5000,200000" }, wantErr: `"200000" is not 1 to 100,000`},
		{name: "not a rate", edit: func(c *config) { c.Analytics.ratesFlag = "fast" }, wantErr: "-analytics-rates"},
		{name: "no records", edit: func(c *config) { c.Analytics.Records = 0 }, wantErr: "-analytics-records"},
		{name: "too many records at a rate", edit: func(c *config) { c.Analytics.ratesFlag = "100000"; c.Duration = 10 * time.Minute }, wantErr: "more than 10,000,000"},
		{name: "window too short", edit: func(c *config) { c.Analytics.Window = time.Second }, wantErr: "-analytics-window"},
		{name: "no partitions", edit: func(c *config) { c.Analytics.Partitions = 0 }, wantErr: "-analytics-partitions"},
		{name: "negative flush", edit: func(c *config) { c.Analytics.FlushMs = -1 }, wantErr: "-analytics-flush-ms"},
		{name: "not read without analytics", edit: func(c *config) { c.workloadsFlag = "vitals"; c.Analytics.ratesFlag = "x"; c.Analytics.Records = 0 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.edit(&c)
			if !parsedAsWanted(t, &c, tc.wantErr) {
				return
			}
			if !slices.Equal(c.Analytics.Rates, tc.rates) {
				t.Errorf("rates = %v, want %v", c.Analytics.Rates, tc.rates)
			}
			if slices.Contains(c.Workloads, "analytics") && c.Analytics.Duration != c.Duration {
				t.Errorf("steady runs last %v, want -d %v", c.Analytics.Duration, c.Duration)
			}
		})
	}
}

func TestParseBuckets(t *testing.T) {
	got, err := parseBuckets("1764806400000\t12\n1764806400050\t3\n\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1764806400000] != 12 || got[1764806400050] != 3 {
		t.Errorf("parseBuckets = %v", got)
	}
	if got, err := parseBuckets(""); err != nil || len(got) != 0 {
		t.Errorf("empty answer: %v %v", got, err)
	}
	for _, bad := range []string{"1764806400000", "x\t1", "1\ty", "1\t2\t3"} {
		if _, err := parseBuckets(bad); err == nil {
			t.Errorf("parseBuckets(%q): no error", bad)
		}
	}
}

// TestVisibility follows two buckets over three polls: only the rows a bucket gained since the
// previous poll count, at the poll's time less the bucket's middle.
func TestVisibility(t *testing.T) {
	v := newVisibility()
	const b0, b1 = 1_000_000, 1_000_050
	v.observe(b0+100, map[int64]int64{b0: 10})
	v.observe(b0+150, map[int64]int64{b0: 10, b1: 4}) // b0 unchanged: no sample
	v.observe(b0+1200, map[int64]int64{b0: 12, b1: 5})
	want := []lagSample{{75, 10}, {75, 4}, {1175, 2}, {1125, 1}}
	byLag := func(a, b lagSample) int { return cmp.Or(cmp.Compare(a.lagMs, b.lagMs), cmp.Compare(a.rows, b.rows)) }
	got := slices.Clone(v.samples) // a poll's buckets come in map order
	slices.SortFunc(got, byLag)
	slices.SortFunc(want, byLag)
	if !slices.Equal(got, want) {
		t.Errorf("samples = %v, want %v", got, want)
	}
	if v.rows != 17 {
		t.Errorf("rows = %d, want 17", v.rows)
	}
	// A count that goes down (a merge, a bucket read twice) is no new row.
	v.observe(b0+1300, map[int64]int64{b0: 11, b1: 5})
	if v.rows != 17 || len(v.samples) != 4 {
		t.Errorf("after a lower count: rows %d samples %d", v.rows, len(v.samples))
	}
}

func TestLagPercentiles(t *testing.T) {
	tests := []struct {
		name          string
		samples       []lagSample
		p50, p99, max float64
	}{
		{"none", nil, 0, 0, 0},
		{"one sample", []lagSample{{300, 7}}, 300, 300, 300},
		// Weighted by rows: 98 rows at 100 ms, 1 at 5,000, 1 at 9,000.
		{"weighted", []lagSample{{9000, 1}, {100, 98}, {5000, 1}}, 100, 5000, 9000},
		{"half and half", []lagSample{{200, 50}, {100, 50}}, 100, 200, 200},
		{"the tail's hundredth", []lagSample{{10, 989}, {20, 10}, {7500, 1}}, 10, 20, 7500},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p50, p99, maxMs := lagPercentiles(tc.samples)
			if p50 != tc.p50 || p99 != tc.p99 || maxMs != tc.max {
				t.Errorf("lagPercentiles = %v %v %v, want %v %v %v", p50, p99, maxMs, tc.p50, tc.p99, tc.max)
			}
		})
	}
}

func TestCompareAnalytics(t *testing.T) {
	run := func(side, mode string, rowsPerSec, p99 float64) analyticsRun {
		r := analyticsRun{Side: side, Mode: mode, Records: 1000, RowsPerSec: rowsPerSec}
		if mode == "rate" {
			r.Rate, r.LagP50Ms, r.LagP99Ms, r.LagMaxMs, r.LagRows = 5000, p99/2, p99, p99*1.5, 1000
		}
		return r
	}
	tests := []struct {
		name             string
		engine, carehub  analyticsRun
		flushMs          int
		ratioRows        float64
		ratioP99         float64
		goalRows         bool
		goalLag, lagGoal bool // lagGoal: a lag goal is given
	}{
		{"backlog, carehub at half", run(sideEngine, "backlog", 40000, 0), run(sideCarehub, "backlog", 20000, 0), 7500, 0.5, 0, false, false, false},
		{"backlog, carehub at 0.8", run(sideEngine, "backlog", 40000, 0), run(sideCarehub, "backlog", 32000, 0), 7500, 0.8, 0, true, false, false},
		{"rate, carehub's tail under the flush", run(sideEngine, "rate", 5000, 10000), run(sideCarehub, "rate", 5000, 2000), 7500, 1, 0.2, true, true, true},
		{"rate, carehub's tail over the flush", run(sideEngine, "rate", 5000, 10000), run(sideCarehub, "rate", 4000, 8000), 7500, 0.8, 0.8, true, false, true},
		{"rate, no flush interval known", run(sideEngine, "rate", 5000, 10000), run(sideCarehub, "rate", 5000, 100), 0, 1, 0.01, true, false, true},
		{"engine stored nothing", run(sideEngine, "backlog", 0, 0), run(sideCarehub, "backlog", 100, 0), 7500, 0, 0, false, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := compareAnalytics(tc.engine, tc.carehub, tc.flushMs)
			if c.RatioRows != tc.ratioRows || c.RatioLagP99 != tc.ratioP99 || c.GoalRows != tc.goalRows {
				t.Errorf("ratios rows %v p99 %v, goal rows %v; want %v %v %v", c.RatioRows, c.RatioLagP99, c.GoalRows, tc.ratioRows, tc.ratioP99, tc.goalRows)
			}
			if (c.GoalLag != nil) != tc.lagGoal || (c.GoalLag != nil && *c.GoalLag != tc.goalLag) {
				t.Errorf("lag goal %v, want given %v met %v", c.GoalLag, tc.lagGoal, tc.goalLag)
			}
			if c.EngineFlushMs != tc.flushMs || c.Mode != tc.engine.Mode || c.Records != 1000 {
				t.Errorf("row %+v", c)
			}
			js, err := json.Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(js), "goalLagMet") != tc.lagGoal {
				t.Errorf("JSON %s: goalLagMet present %v, want %v", js, !tc.lagGoal, tc.lagGoal)
			}
		})
	}
}

func TestCheckRows(t *testing.T) {
	tests := []struct {
		name                           string
		want, rows, distinct, inserted int64
		err                            string
	}{
		{"exactly", 1000, 1000, 1000, 1000, ""},
		{"missing", 1000, 999, 999, 999, "999 distinct ids stored, want 1000"},
		{"a copy in the table", 1000, 1001, 1000, 1001, "1 duplicates"},
		{"a copy merged away, counted at insert", 1000, 1000, 1000, 1002, "2 duplicates"},
		{"missing and copies", 1000, 1000, 998, 1000, "998 distinct ids"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkRows(tc.want, tc.rows, tc.distinct, tc.inserted)
			if tc.err == "" {
				if err != nil {
					t.Fatalf("checkRows = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("checkRows = %v, want %q", err, tc.err)
			}
		})
	}
}

// TestAnalyticsEvent checks the records are envelopes carehub's writer decodes, and carry the
// keys the Kafka table reads (JSONEachRow by name).
func TestAnalyticsEvent(t *testing.T) {
	at := time.Date(2026, 12, 4, 16, 0, 0, 123456000, time.UTC)
	b, err := analyticsEvent(123457, at)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := events.Decode(b)
	if err != nil {
		t.Fatalf("events.Decode: %v (%s)", err, b)
	}
	if ev.ID != "evt_00000000000000000000123457" || ev.OrgID != "org_0007" || ev.ProjectID != "prj_0057" || !ev.CreatedAt.Equal(at) {
		t.Errorf("decoded %+v", ev)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"id", "type", "orgId", "projectId", "source", "severity", "payload", "createdAt"} {
		if _, ok := m[k]; !ok {
			t.Errorf("envelope has no %q: %s", k, b)
		}
	}
}
