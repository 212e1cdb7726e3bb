package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The run's one report judges every goal of every workload it ran, met or not, and names the
// workload's own report.
func TestVerdictsJudgeEveryGoal(t *testing.T) {
	v := &verdicts{}
	v.add(fhirVerdicts(summary{Comparisons: map[string]comparison{
		"vitals c=1":  {Unit: "observations/s", CarehubReadable: 4000, HAPIReadable: 300, RatioReadable: 13.3, CarehubP99Ms: 70, HAPIP99Ms: 800, RatioP99: 0.09},
		"synthea c=4": {Unit: "resources/s", CarehubReadable: 1700, HAPIReadable: 360, RatioReadable: 4.7, CarehubP99Ms: 1500, HAPIP99Ms: 7000, RatioP99: 0.21},
		"search c=1":  {Unit: "searches/s", CarehubP99Ms: 30, HAPIP99Ms: 20, RatioP99: 1.5},
	}}, "fhir.json")...)
	v.add(fanoutVerdicts(fanoutSummary{Comparisons: map[string]fanoutComparison{
		"fanout n=2000": {CarehubP99Ms: 16, PeerP99Ms: 22, RatioP99: 0.73, CarehubKiBPerSocket: 30, PeerKiBPerSocket: 42, RatioMemory: 0.71},
	}}, "fanout.json")...)
	lagMet := true
	v.add(analyticsVerdicts(analyticsSummary{Comparisons: map[string]analyticsComparison{
		"analytics backlog": {CarehubRowsPerSec: 90000, EngineRowsPerSec: 60000, RatioRows: 1.5},
		"analytics 5000/s":  {CarehubRowsPerSec: 5000, EngineRowsPerSec: 5000, RatioRows: 1, CarehubLagP99Ms: 1200, EngineFlushMs: 7500, GoalLag: &lagMet},
	}}, "analytics.json")...)

	want := map[string]bool{ // scenario | figure → met
		"vitals c=1|readable observations/s":                     true,
		"vitals c=1|p99 ms":                                      true,
		"synthea c=4|readable resources/s":                       false,
		"synthea c=4|p99 ms":                                     true,
		"search c=1|p99 ms":                                      false,
		"fanout n=2000|publish → received p99 ms":                true,
		"fanout n=2000|RSS KiB per socket, subscribed":           true,
		"analytics backlog|rows/s":                               true,
		"analytics 5000/s|rows/s":                                true,
		"analytics 5000/s|lag p99 ms (peer: its flush interval)": true,
	}
	if len(v.list) != len(want) {
		t.Fatalf("%d verdicts, want %d: %+v", len(v.list), len(want), v.list)
	}
	for _, x := range v.list {
		met, ok := want[x.Scenario+"|"+x.Figure]
		if !ok || met != x.Met || x.Report == "" {
			t.Errorf("verdict %+v: want met %v (known %v) and its report named", x, met, ok)
		}
	}

	dir := t.TempDir()
	if err := writeVerdicts(dir, time.Now(), []string{"vitals", "fanout", "analytics"}, v, nil); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "peers-summary-*.json"))
	if len(files) != 1 {
		t.Fatalf("reports %v, want one peers-summary", files)
	}
	raw, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Summary verdictSummary `json:"summary"`
		Series  []any          `json:"series"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || r.Series == nil {
		t.Fatalf("report: %v (series %v): loadtest/charts needs a series", err, r.Series)
	}
	if r.Summary.Goals != len(want) || r.Summary.Met != 8 {
		t.Errorf("summary: %d of %d met, want 8 of %d", r.Summary.Met, r.Summary.Goals, len(want))
	}
}
