// Package mlservertest gives tests a real MLServer (tests/mlserver) serving
// models/demo's deterioration model through MLServer's scikit-learn runtime,
// speaking the Open Inference Protocol v2 that processors/inference/oip's
// client talks.
//
// It needs the venv that tests/mlserver/setup.sh makes at $MLSERVER_VENV
// (default $HOME/.cache/carehub/mlserver-venv); without it, or with one built
// from another tests/mlserver/requirements.txt, Start fails the test and names
// the setup command.
//
// Every Start runs its own `mlserver start` process on free loopback ports
// (HTTP, gRPC, metrics) from a new temp dir, and takes 3–5 s. The model is
// exported from models/demo/deterioration.onnx by
// tests/mlserver/export_sklearn.py into a cache inside the venv, keyed by the
// content of the ONNX file, expected.json, the script and the venv's
// requirements.txt, so it is made once, not per test or per run.
package mlservertest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"carehub/processors/inference/internal/pyserver"
)

// Model is the name the demo model is served under; its version is "1".
const Model = "deterioration"

// envVenv names the environment variable that overrides the venv's path.
const envVenv = "MLSERVER_VENV"

const setupHint = "run `tests/mlserver/setup.sh` (creates the MLServer venv; " + envVenv + " overrides its path)"

// readyTimeout bounds one start of the server, up to the model being ready.
const readyTimeout = 60 * time.Second

// Server is a running MLServer serving models/demo's deterioration model
// through its scikit-learn runtime. Kill kills it as a crash would, Restart
// starts it again on the same ports, Log returns the tail of its output.
type Server struct {
	// URL is the base URL of the OIP REST API, http://127.0.0.1:port. It does
	// not change on Restart.
	URL string

	dir      string // settings.json, the model's directory, mlserver.log; removed when the test ends
	bin      string // the venv's mlserver
	*process        // Kill, Restart, Log
}

// process is embedded in Server under a name that keeps it out of Server's
// exported fields.
type process = pyserver.Process

// Start starts a new MLServer for tb and stops it when tb ends (t.Cleanup).
// It fails tb, naming tests/mlserver/setup.sh, when the venv is missing or
// stale.
func Start(tb testing.TB) *Server {
	tb.Helper()
	venv := pyserver.VenvPath(tb, pyserver.Venv{
		Name: "mlservertest", What: "MLServer venv", Env: envVenv, Cache: "mlserver-venv", Setup: setupHint,
		Need:    []string{filepath.Join("bin", "mlserver")},
		Sources: filepath.Join("tests", "mlserver"), Copies: []string{"requirements.txt"},
	})
	root := pyserver.RepoRoot(tb)
	dir := pyserver.TempDir(tb, "mlservertest")
	s := &Server{dir: dir, bin: filepath.Join(venv, "bin", "mlserver")}

	joblib := exportedModel(tb, root, venv, dir)
	if err := os.Mkdir(filepath.Join(dir, Model), 0o755); err != nil {
		tb.Fatalf("mlservertest: %v", err)
	}
	writeJSON(tb, filepath.Join(dir, Model, "model-settings.json"), map[string]any{
		"name":           Model,
		"implementation": "mlserver_sklearn.SKLearnModel",
		"platform":       "sklearn",
		"versions":       []string{"1"},
		"inputs":         []map[string]any{{"name": "vitals", "datatype": "FP32", "shape": []int{-1, 5}}},
		"outputs":        []map[string]any{{"name": "predict_proba", "datatype": "FP64", "shape": []int{-1, 2}}},
		"parameters": map[string]any{
			"uri":     joblib,
			"version": "1",
			// mlserver-sklearn 1.7 returns predict() unless told otherwise.
			"extra": map[string]any{"predict_fn": "predict_proba"},
		},
	})

	s.process = pyserver.Start(tb, pyserver.Spec{
		Name: "mlservertest", Server: "MLServer", Program: "mlserver",
		Dir:     dir, // MLServer puts .envs and .metrics in its working directory
		LogName: "mlserver.log",
		Ports:   s.ports, Retry: "trying other ports",
		Command:      func() *exec.Cmd { return exec.Command(s.bin, "start", s.dir) },
		Ready:        s.ready,
		ReadyTimeout: readyTimeout,
	})
	return s
}

// ports writes settings.json with new free ports (HTTP, gRPC, metrics) and
// returns the new URL.
func (s *Server) ports(tb testing.TB) string {
	httpPort, grpcPort, metricsPort := pyserver.FreePort(tb), pyserver.FreePort(tb), pyserver.FreePort(tb)
	writeJSON(tb, filepath.Join(s.dir, "settings.json"), map[string]any{
		"debug":            false,
		"host":             "127.0.0.1",
		"http_port":        httpPort,
		"grpc_port":        grpcPort,
		"metrics_port":     metricsPort,
		"parallel_workers": 0, // infer in the server process: faster start, no worker pool
	})
	s.URL = fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	return s.URL
}

// ready reports whether the server and the model's version 1 answer ready.
func (s *Server) ready(hc *http.Client) bool {
	for _, p := range []string{"/v2/health/ready", "/v2/models/" + Model + "/versions/1/ready"} {
		resp, err := hc.Get(s.URL + p)
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
	}
	return true
}

var exportMu sync.Mutex // one export at a time in this process

// exportedModel returns the path of the demo model exported by
// tests/mlserver/export_sklearn.py: from the cache in the venv, exporting it
// there first when missing, or, when the cache cannot be written, exported
// into dir.
func exportedModel(tb testing.TB, root, venv, dir string) string {
	tb.Helper()
	script := filepath.Join(root, "tests", "mlserver", "export_sklearn.py")
	onnx := filepath.Join(root, "models", "demo", "deterioration.onnx")
	expected := filepath.Join(root, "models", "demo", "expected.json")
	h := sha256.New()
	for _, f := range []string{script, onnx, expected, filepath.Join(venv, "requirements.txt")} {
		b, err := os.ReadFile(f)
		if err != nil {
			tb.Fatalf("mlservertest: %v", err)
		}
		fmt.Fprintf(h, "%s %d\n", filepath.Base(f), len(b))
		h.Write(b)
	}
	cacheDir := filepath.Join(venv, "carehub-model-cache")
	cached := filepath.Join(cacheDir, "deterioration-"+hex.EncodeToString(h.Sum(nil))[:16]+".joblib")

	export := func(out string) error {
		cmd := exec.Command(filepath.Join(venv, "bin", "python"), script,
			"--onnx", onnx, "--expected", expected, "--out", out)
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("export_sklearn.py: %v\n%s", err, b)
		}
		return nil
	}

	exportMu.Lock()
	defer exportMu.Unlock()
	if _, err := os.Stat(cached); err == nil {
		return cached
	}
	// Export to a temp file beside the cached one and rename it into place, so that
	// concurrent test processes never see half a file.
	if err := os.MkdirAll(cacheDir, 0o755); err == nil {
		if f, err := os.CreateTemp(cacheDir, "export-*.joblib"); err == nil {
			tmp := f.Name()
			f.Close()
			err := export(tmp)
			if err == nil {
				err = os.Rename(tmp, cached)
			}
			if err == nil {
				return cached
			}
			os.Remove(tmp)
			tb.Fatalf("mlservertest: %v", err)
		}
	}
	out := filepath.Join(dir, "model.joblib")
	if err := export(out); err != nil {
		tb.Fatalf("mlservertest: %v", err)
	}
	return out
}

func writeJSON(tb testing.TB, path string, v any) {
	tb.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		tb.Fatalf("mlservertest: %v", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		tb.Fatalf("mlservertest: %v", err)
	}
}
