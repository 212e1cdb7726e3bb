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
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Model is the name the demo model is served under; its version is "1".
const Model = "deterioration"

// envVenv names the environment variable that overrides the venv's path.
const envVenv = "MLSERVER_VENV"

const setupHint = "run `tests/mlserver/setup.sh` (creates the MLServer venv; " + envVenv + " overrides its path)"

// readyTimeout bounds one start of the server, up to the model being ready.
const readyTimeout = 60 * time.Second

// logTail is how much of the server's output Log returns at most.
const logTail = 8000

// Server is a running MLServer serving models/demo's deterioration model
// through its scikit-learn runtime.
type Server struct {
	// URL is the base URL of the OIP REST API, http://127.0.0.1:port. It does
	// not change on Restart.
	URL string

	dir string // settings.json, the model's directory, mlserver.log; removed when the test ends
	bin string // the venv's mlserver

	mu      sync.Mutex
	cmd     *exec.Cmd     // the last process started
	done    chan struct{} // closed when cmd has exited
	starts  int           // processes started
	stopped bool          // set by the cleanup
}

// Start starts a new MLServer for tb and stops it when tb ends (t.Cleanup).
// It fails tb, naming tests/mlserver/setup.sh, when the venv is missing or
// stale.
func Start(tb testing.TB) *Server {
	tb.Helper()
	venv := venvPath(tb)
	root := repoRoot(tb)
	dir, err := os.MkdirTemp("", "mlservertest-")
	if err != nil {
		tb.Fatalf("mlservertest: %v", err)
	}
	s := &Server{dir: dir, bin: filepath.Join(venv, "bin", "mlserver")}
	tb.Cleanup(s.stop)

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

	start := time.Now()
	for attempt := 1; ; attempt++ {
		// Free ports are free when looked at; another process may take one before
		// MLServer binds it. Then try new ones.
		httpPort, grpcPort, metricsPort := freePort(tb), freePort(tb), freePort(tb)
		writeJSON(tb, filepath.Join(dir, "settings.json"), map[string]any{
			"debug":            false,
			"host":             "127.0.0.1",
			"http_port":        httpPort,
			"grpc_port":        grpcPort,
			"metrics_port":     metricsPort,
			"parallel_workers": 0, // infer in the server process: faster start, no worker pool
		})
		s.URL = fmt.Sprintf("http://127.0.0.1:%d", httpPort)
		err := s.run(readyTimeout)
		if err == nil {
			break
		}
		if errors.Is(err, errPortTaken) && attempt < 3 {
			tb.Logf("mlservertest: %v; trying other ports", err)
			continue
		}
		tb.Fatalf("mlservertest: %v\n%s", err, s.Log())
	}
	tb.Logf("mlservertest: MLServer ready at %s after %v", s.URL, time.Since(start).Round(10*time.Millisecond))
	return s
}

// Kill kills the server with SIGKILL (as a crash would) and waits for it to
// exit. It does nothing when the server is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return // exited already: its pid may belong to another process by now
	default:
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the process group: MLServer and any child
	<-done
}

// Restart starts the server again on the same ports after Kill, and waits
// until it is ready, so a client built with URL reconnects. A server still
// running is killed first.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Kill()
	start := time.Now()
	deadline := start.Add(readyTimeout)
	portDeadline := start.Add(10 * time.Second)
	for {
		err := s.run(time.Until(deadline))
		if err == nil {
			break
		}
		// A port of the killed process may not be free again at once; another process
		// may also have taken it meanwhile. Retry for a while, then give up.
		if errors.Is(err, errPortTaken) && time.Now().Before(portDeadline) {
			time.Sleep(250 * time.Millisecond)
			continue
		}
		tb.Fatalf("mlservertest: restart: %v\n%s", err, s.Log())
	}
	tb.Logf("mlservertest: MLServer ready again at %s after %v", s.URL, time.Since(start).Round(10*time.Millisecond))
}

// Log returns what the server printed, for failure messages: the output of
// every process Start and Restart ran, each under a header line, cut to the
// last few kilobytes.
func (s *Server) Log() string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return fmt.Sprintf("(no MLServer log: %v)", err)
	}
	if len(b) > logTail {
		return "[…]" + string(b[len(b)-logTail:])
	}
	return string(b)
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "mlserver.log") }

// errPortTaken marks a start that failed because a port was in use.
var errPortTaken = errors.New("port in use")

// run starts `mlserver start` on s.dir and waits up to timeout for the model to be
// ready. When it is not, the process is gone on return.
func (s *Server) run(timeout time.Duration) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return errors.New("server stopped (its test has ended)")
	}
	s.starts++
	n := s.starts
	s.mu.Unlock()

	logf, err := os.OpenFile(s.logPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	from, err := logf.Seek(0, io.SeekEnd)
	if err == nil {
		_, err = fmt.Fprintf(logf, "=== mlservertest: start %d at %s ===\n", n, time.Now().Format(time.TimeOnly))
	}
	if err != nil {
		logf.Close()
		return err
	}
	cmd := exec.Command(s.bin, "start", s.dir)
	cmd.Dir = s.dir // MLServer puts .envs and .metrics in its working directory
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "PYTHONUNBUFFERED=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // Kill and stop signal the group
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %v", s.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	hc := &http.Client{Timeout: time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.After(timeout)
	for !s.ready(hc) {
		select {
		case <-done:
			err := fmt.Errorf("mlserver (start %d) exited before it was ready", n)
			if out, _ := os.ReadFile(s.logPath()); int64(len(out)) > from &&
				strings.Contains(strings.ToLower(string(out[from:])), "address already in use") {
				err = fmt.Errorf("%w: %w", err, errPortTaken)
			}
			return err
		case <-deadline:
			s.Kill()
			return fmt.Errorf("mlserver (start %d) not ready after %v", n, timeout)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
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

// stop asks the server to shut down, kills it after 5 s, and removes its directory.
func (s *Server) stop() {
	s.mu.Lock()
	s.stopped = true
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd != nil {
		select {
		case <-done:
		default:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				s.Kill()
			}
		}
	}
	_ = os.RemoveAll(s.dir)
}

// repoRoot is the directory holding go.mod, found upwards from this file.
func repoRoot(tb testing.TB) string {
	tb.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		tb.Fatal("mlservertest: runtime.Caller failed")
	}
	for dir := filepath.Dir(file); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if filepath.Dir(dir) == dir {
			tb.Fatalf("mlservertest: go.mod not found above %s", file)
		}
	}
}

// venvPath returns the venv's path, failing tb when it is missing or stale.
func venvPath(tb testing.TB) string {
	tb.Helper()
	venv := os.Getenv(envVenv)
	if venv == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			tb.Fatalf("mlservertest: no home directory for the MLServer venv (%v); set %s or %s", err, envVenv, setupHint)
		}
		venv = filepath.Join(home, ".cache", "carehub", "mlserver-venv")
	}
	if _, err := os.Stat(filepath.Join(venv, "bin", "mlserver")); err != nil {
		tb.Fatalf("mlservertest: MLServer venv missing (%v): %s", err, setupHint)
	}
	want, err := os.ReadFile(filepath.Join(repoRoot(tb), "tests", "mlserver", "requirements.txt"))
	if err != nil {
		tb.Fatalf("mlservertest: %v", err)
	}
	have, _ := os.ReadFile(filepath.Join(venv, "requirements.txt"))
	if string(want) != string(have) {
		tb.Fatalf("mlservertest: MLServer venv %s was built from another tests/mlserver/requirements.txt: %s", venv, setupHint)
	}
	return venv
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

func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("mlservertest: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
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
