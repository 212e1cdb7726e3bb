package fhir_test

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/internal/testenv"
)

// TestJavaScriptClient runs tests/fhir-js against a live node: fhir-kit-client, a FHIR client
// nobody here wrote, creates, reads, searches with paging, creates conditionally and posts batch
// and transaction Bundles to the base; every response is decoded by R4 models
// (@ahryman40k/ts-fhir-types) and validated by FHIR.js (issue 52).
func TestJavaScriptClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Missing(t, "node not found: the JavaScript FHIR client suite needs Node.js 20 (make test-deps)")
		return
	}
	if _, err := os.Stat("../../tests/fhir-js/node_modules/fhir-kit-client"); err != nil {
		testenv.Missing(t, "tests/fhir-js has no node_modules: run make node-deps (or make test-deps)")
		return
	}
	s := servertest.Start(t)
	runClientSuite(t, "fhir-kit-client", exec.CommandContext(t.Context(), node, "../../tests/fhir-js/roundtrip.mjs",
		s.URL+"/fhir/R4", s.DemoKey(), fmt.Sprint(time.Now().UnixNano())))
}
