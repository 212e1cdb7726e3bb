package fhir_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/internal/testenv"
)

// fhirPyVenv is the virtualenv make fhir-py-deps fills from tests/fhir-py/requirements.txt.
func fhirPyVenv() string {
	if d := os.Getenv("CAREHUB_FHIR_PY_VENV"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "carehub", "fhir-py-venv")
}

// TestPythonClients runs tests/fhir-py against a live node: fhirpy and fhirclient (SMART), two
// FHIR clients nobody here wrote, create, read, search with paging, create conditionally as
// fhirpy's get_or_create does and post batch and transaction Bundles to the base; every response
// is parsed with fhir.resources' R4 models (issue 52).
func TestPythonClients(t *testing.T) {
	python := filepath.Join(fhirPyVenv(), "bin", "python")
	if _, err := os.Stat(python); err != nil {
		testenv.Missing(t, "no Python FHIR clients in %s: run make fhir-py-deps (or make test-deps)", fhirPyVenv())
		return
	}
	s := servertest.Start(t)
	runClientSuite(t, "Python FHIR clients", exec.CommandContext(t.Context(), python, "../../tests/fhir-py/roundtrip.py",
		s.URL+"/fhir/R4", s.DemoKey(), fmt.Sprint(time.Now().UnixNano())))
}

// runClientSuite runs a client suite that prints "PASS …"/"FAIL …" lines and "N passed, N
// failed", and fails t with its failures.
func runClientSuite(t *testing.T, name string, cmd *exec.Cmd) {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("%s:\n%s", name, out.String())
	var failed []string
	summary := false
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "FAIL ") {
			failed = append(failed, line)
		}
		if strings.HasSuffix(line, " passed, 0 failed") {
			summary = true
		}
	}
	if err != nil || !summary || len(failed) > 0 {
		t.Fatalf("%s: %v; %d failed:\n%s", name, err, len(failed), strings.Join(failed, "\n"))
	}
}
