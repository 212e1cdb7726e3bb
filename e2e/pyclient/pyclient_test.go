// Package pyclient drives a whole carehub node (e2e/servertest) from Python, a second language
// beside Node's reference verifier (processors/webhooks/nodeverify): attemptlog.py subscribes a
// receiver of its own, verifies each delivery with PyPI's standardwebhooks and reads the attempt
// log over REST and GraphQL with requests, as a client developer following docs/WEBHOOKS.md would.
package pyclient

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/internal/testenv"
	"carehub/kernel/access"
	"carehub/storage/demo"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestPythonAttemptLog runs attemptlog.py against a node and fails unless it exits 0: every
// delivery verifies with standardwebhooks (and a tampered one does not), and each first attempt
// in the log, over REST and GraphQL alike, holds the status, latency and body excerpt the
// script's receiver answered (2xx, 4xx, 5xx, a slow answer, one over the KiB kept).
func TestPythonAttemptLog(t *testing.T) {
	python := venvPython(t)
	s := servertest.Start(t)
	key := s.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg, access.ExecWorkflows)

	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "attemptlog.py", s.URL, key, s.ProjectID(demo.SepsisProjectName))
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("attemptlog.py:\n%s", out.String())
	if err != nil {
		t.Fatalf("attemptlog.py: %v (its FAIL lines above)", err)
	}
}

// venvPython is the python of the virtualenv make pyclient-deps fills from requirements.txt
// (CAREHUB_PYCLIENT_VENV, or ~/.cache/carehub/pyclient-venv as the Makefile's PYCLIENT_VENV).
func venvPython(t *testing.T) string {
	t.Helper()
	venv := os.Getenv("CAREHUB_PYCLIENT_VENV")
	if venv == "" {
		home, _ := os.UserHomeDir()
		venv = filepath.Join(home, ".cache", "carehub", "pyclient-venv")
	}
	python := filepath.Join(venv, "bin", "python")
	if _, err := os.Stat(python); err != nil {
		testenv.Missing(t, "no Python webhook client in %s: run make pyclient-deps (or make test-deps)", venv)
	}
	return python
}
