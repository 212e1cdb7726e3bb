package server_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"carehub/e2e/servertest"
)

// A route whose variables have patterns (the FHIR base's {type:[A-Z][A-Za-z]+}) is labelled by
// its template without them, as every other route is.
func TestRouteLabelHasNoPattern(t *testing.T) {
	s := servertest.Start(t)
	s.Do(http.MethodGet, "/fhir/R4/Patient/pat-nope", s.DemoKey(), nil)

	r := s.Do(http.MethodGet, "/metrics", "", nil)
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(r.Body))
	if err != nil {
		t.Fatal(err)
	}
	routes := map[string]bool{}
	for _, m := range families["carehub_http_requests_total"].GetMetric() {
		for _, l := range m.Label {
			if l.GetName() == "route" {
				routes[l.GetValue()] = true
			}
		}
	}
	if !routes["/fhir/R4/{type}/{id}"] {
		t.Errorf("carehub_http_requests_total routes %v: want /fhir/R4/{type}/{id}", routes)
	}
	for route := range routes {
		if strings.ContainsAny(route, ":[+") {
			t.Errorf("route label %q holds a pattern", route)
		}
	}
}
