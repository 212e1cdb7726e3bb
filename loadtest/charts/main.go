// Command charts draws the chart and the page of carehub's load reports: beside each JSON report
// that loadtest/report.Write left (<scenario>-<UTC time>.json), <same name>.png, throughput,
// latency percentiles, end-to-end latency and lag over time, stacked, and <same name>.html, a
// self-contained page embedding the chart, the summary and the series.
//
// It is a module of its own (issue 53): gonum.org/v1/plot, with its fonts, LaTeX and PDF
// packages, stays out of the service's go.mod. So it imports nothing of carehub; Report mirrors
// the JSON that loadtest/report writes. From the repository root:
//
//	go -C loadtest/charts run . [-force] PATH...    (or make charts DIR=PATH)
//
// A PATH is a report's JSON file or a directory of them (its other JSON files are left alone; a
// report whose chart and page are newer than its JSON is not redrawn without -force). go -C runs
// the command inside loadtest/charts, so a relative PATH is taken from there: give absolute ones.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Report is one run of a scenario as loadtest/report.Write writes it (its Report type).
type Report struct {
	Scenario string          `json:"scenario"`
	Started  time.Time       `json:"started"`
	Unit     string          `json:"unit"`               // what a point's rate counts
	LagName  string          `json:"lagName,omitempty"`  // what a point's lag measures
	EndToEnd string          `json:"endToEnd,omitempty"` // what a point's end-to-end percentiles measure ("": none)
	Summary  json.RawMessage `json:"summary"`            // the scenario's own figures, in their order
	Series   []Point         `json:"series"`
}

// Point is one interval of a run (loadtest/report's Point).
type Point struct {
	Seconds       float64 `json:"t"`
	Rate          float64 `json:"rate"`
	P50Ms         float64 `json:"p50Ms"`
	P99Ms         float64 `json:"p99Ms"`
	Lag           float64 `json:"lag"`
	Refused       int64   `json:"refused"`
	EndToEndP50Ms float64 `json:"endToEndP50Ms,omitempty"`
	EndToEndP99Ms float64 `json:"endToEndP99Ms,omitempty"`
}

// Files are the paths Draw wrote.
type Files struct{ PNG, HTML string }

var errNotReport = errors.New("not a load report (no scenario or no series)")

// reportFile is a report's JSON with its series told apart from none.
type reportFile struct {
	Report
	Series *[]Point `json:"series"` // nil: the file has no series
}

// Read decodes the report at path.
func Read(path string) (Report, error) {
	var r reportFile
	b, err := os.ReadFile(path)
	if err != nil {
		return Report{}, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return Report{}, fmt.Errorf("%s: %w: %v", path, errNotReport, err)
	}
	if r.Scenario == "" || r.Series == nil {
		return Report{}, fmt.Errorf("%s: %w", path, errNotReport)
	}
	r.Report.Series = *r.Series
	return r.Report, nil
}

// Draw writes the chart and the page of r beside jsonPath, the file it was read from.
func Draw(jsonPath string, r Report) (Files, error) {
	base := strings.TrimSuffix(jsonPath, filepath.Ext(jsonPath))
	f := Files{PNG: base + ".png", HTML: base + ".html"}
	png, err := Chart(r)
	if err != nil {
		return Files{}, fmt.Errorf("%s: %w", jsonPath, err)
	}
	page, err := HTML(r, png)
	if err != nil {
		return Files{}, fmt.Errorf("%s: %w", jsonPath, err)
	}
	for path, b := range map[string][]byte{f.PNG: png, f.HTML: page} {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return Files{}, err
		}
	}
	return f, nil
}

// upToDate reports whether the chart and the page of the report at jsonPath are at least as
// new as it.
func upToDate(jsonPath string) bool {
	js, err := os.Stat(jsonPath)
	if err != nil {
		return false
	}
	base := strings.TrimSuffix(jsonPath, filepath.Ext(jsonPath))
	for _, p := range []string{base + ".png", base + ".html"} {
		if st, err := os.Stat(p); err != nil || st.ModTime().Before(js.ModTime()) {
			return false
		}
	}
	return true
}

// run draws the report at path, or each report in the directory path, and says what it wrote
// on out.
func run(out io.Writer, path string, force bool) error {
	st, err := os.Stat(path)
	if err != nil {
		if wd, _ := os.Getwd(); !filepath.IsAbs(path) {
			return fmt.Errorf("%w (relative to %s, where go -C loadtest/charts runs this command: give an absolute path)", err, wd)
		}
		return err
	}
	if !st.IsDir() {
		return drawOne(out, path)
	}
	jsons, err := filepath.Glob(filepath.Join(path, "*.json"))
	if err != nil {
		return err
	}
	var errs []error
	reports, current := 0, 0
	for _, js := range jsons {
		if !force && upToDate(js) {
			current++
			continue
		}
		err := drawOne(out, js)
		if errors.Is(err, errNotReport) {
			continue
		}
		reports++
		errs = append(errs, err)
	}
	if reports == 0 && current == 0 {
		fmt.Fprintf(out, "%s: no load reports\n", path)
	} else if current > 0 {
		fmt.Fprintf(out, "%s: %d report(s) already drawn (-force redraws them)\n", path, current)
	}
	return errors.Join(errs...)
}

func drawOne(out io.Writer, jsonPath string) error {
	r, err := Read(jsonPath)
	if err != nil {
		return err
	}
	f, err := Draw(jsonPath, r)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "report: %s (chart %s, page %s)\n", jsonPath, f.PNG, f.HTML)
	return nil
}

func main() {
	force := flag.Bool("force", false, "in a directory, redraw also the reports whose chart and page are newer than their JSON")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: go -C loadtest/charts run . [-force] PATH...\n\n"+
			"Draws PATH.png and PATH.html beside each load report PATH.json that loadtest/report wrote, or\n"+
			"beside each one in the directory PATH. Relative paths are taken from loadtest/charts.")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	failed := false
	for _, path := range flag.Args() {
		if err := run(os.Stdout, path, *force); err != nil {
			fmt.Fprintln(os.Stderr, "charts:", err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}
