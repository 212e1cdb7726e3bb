package main

import (
	"os"
	"slices"
	"testing"
	"time"

	"carehub/loadtest/wsfleet"
)

func TestParseFanout(t *testing.T) {
	valid := func() config {
		return config{workloadsFlag: "fanout", clientsFlag: "1", Duration: 20 * time.Second, KeysPerClient: 1, VitalsBundles: 1, ObsPerBundle: 1,
			Fanout: fanoutConfig{socketsFlag: "2000,10000", Rate: 100, Reach: 20, Publishers: 8, PublishKeys: 4, Dial: 100, Warmup: 5 * time.Second, Drain: 10 * time.Second}}
	}
	tests := []struct {
		name    string
		edit    func(*config)
		wantErr string
		sockets []int
	}{
		{name: "defaults", edit: func(*config) {}, sockets: []int{2000, 10000}},
		{name: "fanout beside the FHIR workloads", edit: func(c *config) { c.workloadsFlag = "vitals,fanout" }, sockets: []int{2000, 10000}},
		{name: "no socket count", edit: func(c *config) { c.Fanout.socketsFlag = "" }, wantErr: "-fanout-sockets"},
		{name: "too many sockets", edit: func(c *config) { c.Fanout.socketsFlag = "30000" }, wantErr: "not 1 to 20,000"},
		{name: "no rate", edit: func(c *config) { c.Fanout.Rate = 0 }, wantErr: "-fanout-rate"},
		{name: "drain too long", edit: func(c *config) { c.Fanout.Drain = time.Hour }, wantErr: "-fanout-drain"},
		{name: "unknown workload", edit: func(c *config) { c.workloadsFlag = "fanout,centrifugo" }, wantErr: `unknown "centrifugo"`},
		{name: "sockets not read without fanout", edit: func(c *config) { c.workloadsFlag = "vitals"; c.Fanout.socketsFlag = "x" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.edit(&c)
			if !parsedAsWanted(t, &c, tc.wantErr) {
				return
			}
			if !slices.Equal(c.Fanout.Sockets, tc.sockets) {
				t.Errorf("sockets = %v, want %v", c.Fanout.Sockets, tc.sockets)
			}
		})
	}
}

func TestCompareFanout(t *testing.T) {
	phase := func(p99 float64, delivered int64, kib, kibAfter, cpu, net float64) fanoutPhase {
		return fanoutPhase{Sockets: 2000, SubscribersPerEvent: 20, FromCall: wsfleet.Summary{P50: p99 / 4, P99: p99},
			Delivered: delivered, Expected: 1000, KiBPerSocket: kib, KiBPerSocketAfter: kibAfter, CPUPer1000: cpu, CarehubNetCPUPer1000: net}
	}
	tests := []struct {
		name             string
		carehub, peer    fanoutPhase
		wantP99, wantMem bool
		wantRatioP99     float64
		wantRatioCPU     float64
	}{
		{"carehub ahead", phase(50, 1000, 30, 40, 0.2, 0.05), phase(100, 1000, 40, 50, 0.1, 0), true, true, 0.5, 0.5},
		{"more memory once subscribed", phase(50, 1000, 60, 40, 0.2, 0.05), phase(100, 1000, 40, 50, 0.1, 0), true, false, 0.5, 0.5},
		{"more memory after the load", phase(50, 1000, 30, 140, 0.2, 0.05), phase(100, 1000, 40, 50, 0.1, 0), true, false, 0.5, 0.5},
		{"a slower tail", phase(150, 1000, 30, 40, 0.2, 0.05), phase(100, 1000, 40, 50, 0.1, 0), false, true, 1.5, 0.5},
		{"a lower tail but deliveries missing", phase(50, 999, 30, 40, 0.2, 0.05), phase(100, 1000, 40, 50, 0.1, 0), false, true, 0.5, 0.5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := compareFanout(tc.carehub, tc.peer, 100)
			if got.GoalP99 != tc.wantP99 || got.GoalMemory != tc.wantMem {
				t.Errorf("goals p99 %v memory %v, want %v %v", got.GoalP99, got.GoalMemory, tc.wantP99, tc.wantMem)
			}
			if got.RatioP99 != tc.wantRatioP99 || got.RatioCPU != tc.wantRatioCPU {
				t.Errorf("ratios p99 %v CPU %v, want %v %v", got.RatioP99, got.RatioCPU, tc.wantRatioP99, tc.wantRatioCPU)
			}
		})
	}
}

func TestProcRSS(t *testing.T) {
	if rss := procRSS(os.Getpid()); rss < 1<<20 {
		t.Errorf("procRSS(self) = %v bytes, want at least 1 MiB", rss)
	}
	if rss := procRSS(-1); rss != 0 {
		t.Errorf("procRSS(-1) = %v, want 0", rss)
	}
}
