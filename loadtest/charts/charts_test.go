package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeReport writes r as loadtest/report.Write does: indented JSON, named after the scenario
// and the start.
func writeReport(t *testing.T, dir string, r Report) string {
	t.Helper()
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, r.Scenario+"-"+r.Started.UTC().Format("20060102T150405Z")+".json")
	if err := os.WriteFile(path, append(js, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func sample(t *testing.T) Report {
	summary, err := json.Marshal(map[string]any{"acceptedPerSecond": 12345.5, "nested": map[string]any{"p99Ms": 87}})
	if err != nil {
		t.Fatal(err)
	}
	r := Report{Scenario: "observations", Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Unit: "observations/s",
		LagName: "records behind", EndToEnd: "accept → stored", Summary: summary}
	for i := range 30 {
		r.Series = append(r.Series, Point{Seconds: float64(i + 1), Rate: float64(1000 * i), P50Ms: 10, P99Ms: float64(20 + i), Lag: float64(100 * i), Refused: int64(i % 3),
			EndToEndP50Ms: 40, EndToEndP99Ms: float64(80 + i)})
	}
	return r
}

func TestDraw(t *testing.T) {
	dir := t.TempDir()
	path := writeReport(t, dir, sample(t))
	r, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := Draw(path, r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(f.PNG, "observations-20260102T030405Z.png") || !strings.HasSuffix(f.HTML, "observations-20260102T030405Z.html") {
		t.Errorf("paths %+v; want the JSON's name with .png and .html", f)
	}
	b, err := os.ReadFile(f.PNG)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("the chart is not a PNG: %v", err)
	}
	// A log axis with nothing to show (no sample arrived), or one value, still draws.
	for _, series := range [][]Point{{{Seconds: 1}, {Seconds: 2}}, {{Seconds: 1, EndToEndP50Ms: 5, EndToEndP99Ms: 5}}} {
		if _, err := Chart(Report{Scenario: "events", EndToEnd: "publish → log", Series: series}); err != nil {
			t.Errorf("chart of %+v: %v", series, err)
		}
	}
	without := r
	without.EndToEnd = ""
	b3, err := Chart(without)
	if err != nil {
		t.Fatal(err)
	}
	img3, err := png.Decode(bytes.NewReader(b3))
	if err != nil {
		t.Fatal(err)
	}
	if w, h, h3 := img.Bounds().Dx(), img.Bounds().Dy(), img3.Bounds().Dy(); w < 600 || max(3*h-4*h3, 4*h3-3*h) > 4 { // pixel rounding
		t.Errorf("chart %dx%d, %d high without the end-to-end panel: want four panels (throughput, latency, end to end, lag) against three", w, h, h3)
	}
	html, _ := os.ReadFile(f.HTML)
	for _, want := range []string{`src="data:image/png;base64,iVBOR`, "acceptedPerSecond", "12345.5", "nested.p99Ms", "records behind", "accept → stored p99 ms", "<td class=\"v\">109.0</td>"} {
		if !bytes.Contains(html, []byte(want)) {
			t.Errorf("HTML page lacks %q", want)
		}
	}
	if bytes.Contains(html, []byte("ZgotmplZ")) {
		t.Error("HTML page: the template refused the chart's data URL")
	}
}

// The summary's rows keep the order of its fields in the JSON, as the scenario wrote them.
func TestSummaryRowsKeepTheFileOrder(t *testing.T) {
	dir := t.TempDir()
	r := sample(t)
	r.Summary = json.RawMessage(`{"zeta": 1, "alpha": {"b": "x & <y>", "a": [1, 2]}, "none": null}`)
	path := writeReport(t, dir, r)
	back, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := summaryRows(back.Summary)
	if err != nil {
		t.Fatal(err)
	}
	want := []row{{"zeta", "1"}, {"alpha.b", "x & <y>"}, {"alpha.a", "[1 2]"}, {"none", "<nil>"}}
	if len(rows) != len(want) {
		t.Fatalf("rows %v, want %v", rows, want)
	}
	for i := range want {
		if rows[i] != want[i] {
			t.Errorf("row %d: %v, want %v", i, rows[i], want[i])
		}
	}
}

// A directory: each report is drawn once, other JSON files are left alone, -force redraws.
func TestRunDirectory(t *testing.T) {
	dir := t.TempDir()
	path := writeReport(t, dir, sample(t))
	for name, body := range map[string]string{"list.json": "[1, 2]", "other.json": `{"scenario": "no series"}`} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := run(&out, dir, false); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); strings.Count(got, "report: ") != 1 || !strings.Contains(got, "observations-20260102T030405Z.png") {
		t.Errorf("first run said %q; want the one report drawn", got)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 5 {
		t.Errorf("files %v; want the three JSON files, the chart and the page", files)
	}
	out.Reset()
	if err := run(&out, dir, false); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); strings.Contains(got, "report: ") || !strings.Contains(got, "1 report(s) already drawn") {
		t.Errorf("second run said %q; want nothing redrawn", got)
	}
	out.Reset()
	if err := run(&out, dir, true); err != nil || !strings.Contains(out.String(), "report: ") {
		t.Errorf("-force: %v, %q; want the report redrawn", err, out.String())
	}
	out.Reset()
	if err := run(&out, path, false); err != nil || !strings.Contains(out.String(), "report: ") {
		t.Errorf("the report's file: %v, %q; want it drawn, drawn or not before", err, out.String())
	}
	if err := run(&out, filepath.Join(dir, "other.json"), false); !errors.Is(err, errNotReport) {
		t.Errorf("a file that is no report: %v; want errNotReport", err)
	}
}
