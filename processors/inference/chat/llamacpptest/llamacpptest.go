// Package llamacpptest gives tests a real llama-cpp-python server (tests/llamacpp), whose
// OpenAI-compatible API (python -m llama_cpp.server) processors/inference/chat's client
// talks, serving a tiny random-weight llama model.
//
// It needs the venv that tests/llamacpp/setup.sh makes at $LLAMACPP_VENV (default
// $HOME/.cache/carehub/llamacpp-venv), with the model tests/llamacpp/make_tiny_model.py
// wrote into it (tiny.gguf); without them, or with a venv built from another
// tests/llamacpp/requirements.txt or a model from another make_tiny_model.py, Start fails
// the test and names the setup command.
//
// Every Start runs its own server process on a free loopback port, requiring APIKey as a
// bearer token, and takes 1–3 s. The model writes garbage text (its weights are random),
// but it tokenizes any text, formats chats with a ChatML template of its own, and
// generates real tokens: prompt and completion token counts are the server's.
package llamacpptest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// Model is the name (alias) the tiny model is served under.
	Model = "carehub-tiny"
	// APIKey is the bearer token the server requires on every request.
	APIKey = "llamacpptest-key"
	// ContextSize is the server's context window in tokens: the tiny model's trained context
	// (tests/llamacpp/make_tiny_model.py), room for an LLM agent's prompt, which its
	// byte-level vocabulary makes long (about 800 tokens).
	ContextSize = 2048
)

// envVenv names the environment variable that overrides the venv's path.
const envVenv = "LLAMACPP_VENV"

const setupHint = "run `tests/llamacpp/setup.sh` (creates the llama-cpp-python venv and the tiny model; " + envVenv + " overrides its path)"

// readyTimeout bounds one start of the server, up to /v1/models answering.
const readyTimeout = 60 * time.Second

// logTail is how much of the server's output Log returns at most.
const logTail = 8000

// Server is a running llama-cpp-python server serving the tiny model.
type Server struct {
	// URL is the server's root, http://127.0.0.1:port (the API is under /v1). It does not
	// change on Restart.
	URL string
	// Model is the name to send in requests (the same as the package's Model).
	Model string
	// APIKey is the bearer token the server requires (the same as the package's APIKey).
	APIKey string

	dir    string // server.log; removed when the test ends
	python string // the venv's python
	model  string // the venv's tiny.gguf
	port   int

	mu      sync.Mutex
	cmd     *exec.Cmd     // the last process started
	done    chan struct{} // closed when cmd has exited
	starts  int           // processes started
	stopped bool          // set by the cleanup
}

// Start starts a new server for tb and stops it when tb ends (t.Cleanup). It fails tb,
// naming tests/llamacpp/setup.sh, when the venv or its model is missing or stale.
func Start(tb testing.TB) *Server {
	tb.Helper()
	venv := venvPath(tb)
	dir, err := os.MkdirTemp("", "llamacpptest-")
	if err != nil {
		tb.Fatalf("llamacpptest: %v", err)
	}
	s := &Server{
		Model: Model, APIKey: APIKey, dir: dir,
		python: filepath.Join(venv, "bin", "python"),
		model:  filepath.Join(venv, "tiny.gguf"),
	}
	tb.Cleanup(s.stop)

	start := time.Now()
	for attempt := 1; ; attempt++ {
		// A free port is free when looked at; another process may take it before the
		// server binds it. Then try another.
		s.port = freePort(tb)
		s.URL = fmt.Sprintf("http://127.0.0.1:%d", s.port)
		err := s.run(readyTimeout)
		if err == nil {
			break
		}
		if errors.Is(err, errPortTaken) && attempt < 3 {
			tb.Logf("llamacpptest: %v; trying another port", err)
			continue
		}
		tb.Fatalf("llamacpptest: %v\n%s", err, s.Log())
	}
	tb.Logf("llamacpptest: llama-cpp-python ready at %s after %v", s.URL, time.Since(start).Round(10*time.Millisecond))
	return s
}

// Kill kills the server with SIGKILL (as a crash would) and waits for it to exit. It does
// nothing when the server is not running.
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
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the process group: python and any child
	<-done
}

// Restart starts the server again on the same port after Kill, and waits until it is
// ready, so a client built with URL reconnects. A server still running is killed first.
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
		// The killed process's port may not be free again at once; another process may
		// also have taken it meanwhile. Retry for a while, then give up.
		if errors.Is(err, errPortTaken) && time.Now().Before(portDeadline) {
			time.Sleep(250 * time.Millisecond)
			continue
		}
		tb.Fatalf("llamacpptest: restart: %v\n%s", err, s.Log())
	}
	tb.Logf("llamacpptest: llama-cpp-python ready again at %s after %v", s.URL, time.Since(start).Round(10*time.Millisecond))
}

// Log returns what the server printed, for failure messages: the output of every process
// Start and Restart ran, each under a header line, cut to the last few kilobytes.
func (s *Server) Log() string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return fmt.Sprintf("(no llama-cpp-python log: %v)", err)
	}
	if len(b) > logTail {
		return "[…]" + string(b[len(b)-logTail:])
	}
	return string(b)
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "server.log") }

// errPortTaken marks a start that failed because the port was in use.
var errPortTaken = errors.New("port in use")

// args is the server's command line. Each flag is a ServerSettings or ModelSettings field
// of llama_cpp.server.
func (s *Server) args() []string {
	return []string{
		"-m", "llama_cpp.server",
		"--model", s.model,
		"--model_alias", Model, // requests name the model by this, and /v1/models lists it
		"--host", "127.0.0.1",
		"--port", strconv.Itoa(s.port),
		"--api_key", APIKey,
		"--n_ctx", strconv.Itoa(ContextSize),
		"--n_threads", "1", // the model is tiny: more threads only contend with the tests
		"--n_threads_batch", "1",
	}
}

// run starts the server and waits up to timeout for /v1/models to answer 200. When it
// does not, the process is gone on return.
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
		_, err = fmt.Fprintf(logf, "=== llamacpptest: start %d at %s ===\n", n, time.Now().Format(time.TimeOnly))
	}
	if err != nil {
		logf.Close()
		return err
	}
	cmd := exec.Command(s.python, s.args()...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "PYTHONUNBUFFERED=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // Kill and stop signal the group
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %v", s.python, err)
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
			err := fmt.Errorf("llama_cpp.server (start %d) exited before it was ready", n)
			if out, _ := os.ReadFile(s.logPath()); int64(len(out)) > from &&
				strings.Contains(strings.ToLower(string(out[from:])), "address already in use") {
				err = fmt.Errorf("%w: %w", err, errPortTaken)
			}
			return err
		case <-deadline:
			s.Kill()
			return fmt.Errorf("llama_cpp.server (start %d) not ready after %v", n, timeout)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// ready reports whether GET /v1/models answers 200; the server loads the model before it
// listens, so that means the model is loaded.
func (s *Server) ready(hc *http.Client) bool {
	req, err := http.NewRequest(http.MethodGet, s.URL+"/v1/models", nil)
	if err != nil {
		return false
	}
	req.Header.Set("Authorization", "Bearer "+APIKey)
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
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
		tb.Fatal("llamacpptest: runtime.Caller failed")
	}
	for dir := filepath.Dir(file); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if filepath.Dir(dir) == dir {
			tb.Fatalf("llamacpptest: go.mod not found above %s", file)
		}
	}
}

// venvPath returns the venv's path, failing tb when it or its model is missing or stale.
func venvPath(tb testing.TB) string {
	tb.Helper()
	venv := os.Getenv(envVenv)
	if venv == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			tb.Fatalf("llamacpptest: no home directory for the llama-cpp-python venv (%v); set %s or %s", err, envVenv, setupHint)
		}
		venv = filepath.Join(home, ".cache", "carehub", "llamacpp-venv")
	}
	for _, f := range []string{filepath.Join("bin", "python"), "tiny.gguf"} {
		if _, err := os.Stat(filepath.Join(venv, f)); err != nil {
			tb.Fatalf("llamacpptest: llama-cpp-python venv incomplete (%v): %s", err, setupHint)
		}
	}
	// The venv keeps copies of the files it and its model were made from.
	for _, f := range []string{"requirements.txt", "make_tiny_model.py"} {
		want, err := os.ReadFile(filepath.Join(repoRoot(tb), "tests", "llamacpp", f))
		if err != nil {
			tb.Fatalf("llamacpptest: %v", err)
		}
		have, _ := os.ReadFile(filepath.Join(venv, f))
		if string(want) != string(have) {
			tb.Fatalf("llamacpptest: llama-cpp-python venv %s was made from another tests/llamacpp/%s: %s", venv, f, setupHint)
		}
	}
	return venv
}

func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("llamacpptest: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
