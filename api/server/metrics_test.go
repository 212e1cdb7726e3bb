package server_test

import (
	"bytes"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"carehub/e2e/servertest"
)

// A node's /metrics follows the Prometheus naming conventions (promlint: counters end in
// _total and nothing else does, base units, help text), carries carehub_build_info, and labels
// HTTP requests with their status code, not its class.
func TestMetricsConventions(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	s.Do(http.MethodGet, "/v1/organizations", key, nil)
	s.Do(http.MethodGet, "/v1/organizations/org_nope", key, nil)

	r := s.Do(http.MethodGet, "/metrics", "", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("/metrics: HTTP %d", r.Status)
	}
	problems, err := promlint.New(bytes.NewReader(r.Body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}

	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(r.Body))
	if err != nil {
		t.Fatal(err)
	}
	info := families["carehub_build_info"]
	if info == nil || len(info.Metric) != 1 || info.Metric[0].GetGauge().GetValue() != 1 {
		t.Fatalf("carehub_build_info: %v", info)
	}
	labels := map[string]string{}
	for _, l := range info.Metric[0].Label {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["goversion"] != runtime.Version() || labels["version"] == "" {
		t.Errorf("carehub_build_info labels: %v", labels)
	}

	codes := map[string]bool{}
	for _, m := range families["carehub_http_requests_total"].GetMetric() {
		for _, l := range m.Label {
			if l.GetName() == "code" {
				codes[l.GetValue()] = true
			}
		}
	}
	if !codes["200"] || !codes["404"] {
		t.Errorf("carehub_http_requests_total codes: %v, want 200 and 404", codes)
	}
	for c := range codes {
		if strings.HasSuffix(c, "xx") {
			t.Errorf("status class %q as a code label", c)
		}
	}
}
