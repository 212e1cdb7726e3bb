package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Report is one run of a scenario: its own figures (Summary, the scenario's JSON report) and
// the series its Recorder collected.
type Report struct {
	Scenario string    `json:"scenario"`
	Started  time.Time `json:"started"`
	Unit     string    `json:"unit"`               // what a point's rate counts
	LagName  string    `json:"lagName,omitempty"`  // what a point's lag measures
	EndToEnd string    `json:"endToEnd,omitempty"` // what a point's end-to-end percentiles measure ("": none)
	Summary  any       `json:"summary"`
	Series   []Point   `json:"series"`
}

// Write writes r under dir as <scenario>-<UTC time>.json and returns its path. Its chart (.png)
// and page (.html, the chart and the summary in one file to share) are drawn from that file by
// loadtest/charts, a module of its own so that gonum's plotting stays out of the service's
// go.mod (issue 53): ChartsCommand says how.
func Write(dir string, r Report) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%s.json", r.Scenario, r.Started.UTC().Format("20060102T150405Z")))
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", fmt.Errorf("report JSON: %w", err)
	}
	if err := os.WriteFile(path, append(js, '\n'), 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// ChartsCommand is the command, run from the repository root, that draws the chart and page of
// the reports at paths (report files or directories of them). The paths are made absolute: go -C
// runs the command inside loadtest/charts.
func ChartsCommand(paths ...string) string {
	cmd := "go -C loadtest/charts run ."
	for _, p := range paths {
		if abs, err := filepath.Abs(p); err == nil {
			p = abs
		}
		cmd += " " + shellQuote(p)
	}
	return cmd
}

// shellQuote quotes s for a POSIX shell when it holds more than letters, digits and -_./:=+,@.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=+,@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
