package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"carehub/api/ws/wstest"
	"carehub/e2e/servertest"
	"carehub/storage/demo"
)

const (
	dashboardFile  = "../../deploy/compose/grafana/dashboards/carehub.json"
	prometheusFile = "../../deploy/compose/prometheus/prometheus.yml"
)

// dashboardQueries returns every PromQL expression of the Grafana dashboard, by panel title.
func dashboardQueries(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	out := map[string][]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			if tg.Expr != "" {
				out[p.Title] = append(out[p.Title], tg.Expr)
			}
		}
	}
	return out
}

var (
	metricName = regexp.MustCompile(`\b((?:carehub|go|process|kafka)_[a-z0-9_]+)\b`)
	byLabels   = regexp.MustCompile(`\bby \(([^)]*)\)`)
)

// The Grafana dashboard in deploy/ charts only what a node exports: every metric its queries
// name is on a live node's /metrics, and every label they group by is one that metric carries
// or one Prometheus adds to the target (deploy/compose/prometheus/prometheus.yml).
func TestDashboardUsesExportedMetrics(t *testing.T) {
	queries := dashboardQueries(t)
	if len(queries) == 0 {
		t.Fatalf("%s has no queries", dashboardFile)
	}
	// Which metric each query needs, and the labels it groups by.
	need := map[string][]string{} // metric family → labels
	for title, exprs := range queries {
		for _, e := range exprs {
			names := metricName.FindAllString(e, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: %q names no metric", title, e)
			}
			var labels []string
			for _, m := range byLabels.FindAllStringSubmatch(e, -1) {
				for l := range strings.SplitSeq(m[1], ",") {
					if l = strings.TrimSpace(l); l != "" && l != "le" {
						labels = append(labels, l)
					}
				}
			}
			for _, n := range names {
				n = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_count"), "_sum")
				need[n] = append(need[n], labels...)
			}
		}
	}

	s := servertest.Start(t)
	key := s.DemoKey()
	// Traffic that makes the labelled series exist: requests, an observation stored.
	s.Do(http.MethodGet, "/v1/organizations", key, nil)
	obs := map[string]any{"resourceType": "Observation", "status": "final",
		"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4"}}},
		"subject":           map[string]any{"reference": "Patient/" + demo.StablePatientID},
		"valueQuantity":     map[string]any{"value": 80, "unit": "/min"},
		"effectiveDateTime": time.Now().UTC().Format(time.RFC3339)}
	if r := s.Do(http.MethodPost, "/v1/observations", key, obs); r.Status != http.StatusAccepted {
		t.Fatalf("POST /v1/observations: HTTP %d %s", r.Status, r.Body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, err := wstest.Dial(ctx, "ws"+strings.TrimPrefix(s.URL, "http")+"/graphql", "Bearer "+key)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	// Labels Prometheus adds to every series of a target (prometheus.yml's relabelling).
	targetLabels := map[string]bool{}
	prom, err := os.ReadFile(prometheusFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`target_label:\s*(\w+)`).FindAllStringSubmatch(string(prom), -1) {
		targetLabels[m[1]] = true
	}

	// Wait (bounded) until every family the dashboard needs is exported; report what is not.
	var missing []string
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := s.Do(http.MethodGet, "/metrics", "", nil)
		parser := expfmt.NewTextParser(model.LegacyValidation)
		families, err := parser.TextToMetricFamilies(bytes.NewReader(r.Body))
		if err != nil {
			t.Fatal(err)
		}
		missing = missing[:0]
		for name, labels := range need {
			f := families[name]
			if f == nil || len(f.Metric) == 0 {
				missing = append(missing, name+" (not exported)")
				continue
			}
			have := map[string]bool{}
			for _, m := range f.Metric {
				for _, l := range m.Label {
					have[l.GetName()] = true
				}
			}
			for _, l := range labels {
				if !have[l] && !targetLabels[l] {
					missing = append(missing, name+" has no label "+l)
				}
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	slices.Sort(missing)
	for _, m := range slices.Compact(missing) {
		t.Errorf("the dashboard queries %s", m)
	}
}
