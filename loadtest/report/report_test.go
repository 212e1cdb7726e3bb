package report

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestTickAndLines(t *testing.T) {
	var out bytes.Buffer
	r := NewRecorder(Options{Unit: "obs/s", LagName: "records behind", Lag: func() float64 { return 0 }, Out: &out})
	t0 := r.start
	for i := range 100 {
		r.Observe(10, time.Duration(i+1)*time.Millisecond) // 1..100 ms
	}
	r.Refuse(3)
	p := r.Tick(t0.Add(2*time.Second), 1234)
	if p.Rate != 500 || p.P50Ms != 50 || p.P99Ms != 99 || p.Lag != 1234 || p.Refused != 3 || p.Seconds != 2 {
		t.Fatalf("first interval: %+v; want rate 500, p50 50, p99 99, lag 1234, refused 3 at 2 s", p)
	}
	// The next interval starts empty.
	r.Observe(1, 7*time.Millisecond)
	p = r.Tick(t0.Add(3*time.Second), 0)
	if p.Rate != 1 || p.P50Ms != 7 || p.P99Ms != 7 || p.Refused != 0 {
		t.Fatalf("second interval: %+v", p)
	}
	r.print(p)
	if got := out.String(); strings.Contains(got, "\r") || !strings.HasSuffix(got, "\n") ||
		!strings.Contains(got, "obs/s") || !strings.Contains(got, "records behind 0") || !strings.Contains(got, "refused 0") {
		t.Errorf("progress line off a terminal: %q; want a plain line with rate, lag and refusals", got)
	}
	if n := len(r.Points()); n != 2 {
		t.Errorf("%d points, want 2", n)
	}
}

func TestWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "results") // made when missing
	r := Report{Scenario: "observations", Started: time.Date(2026, 1, 2, 4, 4, 5, 0, time.FixedZone("CET", 3600)), Unit: "observations/s",
		LagName: "records behind", EndToEnd: "accept → stored",
		Summary: map[string]any{"acceptedPerSecond": 12345.5, "nested": map[string]any{"p99Ms": 87}}}
	for i := range 30 {
		r.Series = append(r.Series, Point{Seconds: float64(i + 1), Rate: float64(1000 * i), P50Ms: 10, P99Ms: float64(20 + i), Lag: float64(100 * i), Refused: int64(i % 3),
			EndToEndP50Ms: 40, EndToEndP99Ms: float64(80 + i)})
	}
	path, err := Write(dir, r)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "observations-20260102T030405Z.json"); path != want {
		t.Errorf("JSON path %s, want %s (the scenario and the start in UTC)", path, want)
	}
	var back Report
	js, _ := os.ReadFile(path)
	if err := json.Unmarshal(js, &back); err != nil || len(back.Series) != 30 || back.Scenario != "observations" ||
		back.Series[29].EndToEndP99Ms != 109 || back.EndToEnd != r.EndToEnd || !back.Started.Equal(r.Started) {
		t.Fatalf("JSON report: %v, %+v", err, back)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 1 {
		t.Errorf("Write left %v; want the JSON alone (loadtest/charts draws the chart and page)", files)
	}
	cmd := ChartsCommand(path, "relative dir")
	abs, _ := filepath.Abs("relative dir")
	if want := "go -C loadtest/charts run . " + path + " '" + abs + "'"; cmd != want {
		t.Errorf("charts command %q, want %q", cmd, want)
	}
}

// An item's end-to-end latency counts in the interval it was sent in, whenever it arrived; an
// interval's figures are its items' alone.
func TestEndToEnd(t *testing.T) {
	points := []Point{{Seconds: 1}, {Seconds: 2}, {Seconds: 3}}
	var (
		sent    []float64
		latency []time.Duration
	)
	for i := range 100 { // sent in (0, 1]: 1..100 ms
		sent, latency = append(sent, float64(i+1)/100), append(latency, time.Duration(i+1)*time.Millisecond)
	}
	// Sent at 2.5 s, in the last interval, and arrived long after it: still counted there.
	sent, latency = append(sent, 2.5), append(latency, 4*time.Second)
	// Sent after the last point: left out.
	sent, latency = append(sent, 3.2), append(latency, time.Hour)
	EndToEnd(points, sent, latency)
	if p := points[0]; p.EndToEndP50Ms != 50 || p.EndToEndP99Ms != 99 {
		t.Errorf("first interval p50 %v p99 %v; want 50 and 99", p.EndToEndP50Ms, p.EndToEndP99Ms)
	}
	if p := points[1]; p.EndToEndP50Ms != 0 || p.EndToEndP99Ms != 0 {
		t.Errorf("an interval with nothing sent: p50 %v p99 %v; want 0", p.EndToEndP50Ms, p.EndToEndP99Ms)
	}
	if p := points[2]; p.EndToEndP50Ms != 4000 || p.EndToEndP99Ms != 4000 {
		t.Errorf("last interval p50 %v p99 %v; want 4000 (the late item) and no more", p.EndToEndP50Ms, p.EndToEndP99Ms)
	}
}
