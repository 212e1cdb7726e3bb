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
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"carehub/processors/inference/internal/pyserver"
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

// Server is a running llama-cpp-python server serving the tiny model. Kill kills it as a
// crash would, Restart starts it again on the same port, Log returns the tail of its output.
type Server struct {
	// URL is the server's root, http://127.0.0.1:port (the API is under /v1). It does not
	// change on Restart.
	URL string
	// Model is the name to send in requests (the same as the package's Model).
	Model string
	// APIKey is the bearer token the server requires (the same as the package's APIKey).
	APIKey string

	python   string // the venv's python
	model    string // the venv's tiny.gguf
	port     int
	*process // Kill, Restart, Log; its directory holds server.log, removed when the test ends
}

// process is embedded in Server under a name that keeps it out of Server's exported fields.
type process = pyserver.Process

// Start starts a new server for tb and stops it when tb ends (t.Cleanup). It fails tb,
// naming tests/llamacpp/setup.sh, when the venv or its model is missing or stale.
func Start(tb testing.TB) *Server {
	tb.Helper()
	// The venv keeps copies of the files it and its model were made from.
	venv := pyserver.VenvPath(tb, pyserver.Venv{
		Name: "llamacpptest", What: "llama-cpp-python venv", Env: envVenv, Cache: "llamacpp-venv", Setup: setupHint,
		Need:    []string{filepath.Join("bin", "python"), "tiny.gguf"},
		Sources: filepath.Join("tests", "llamacpp"), Copies: []string{"requirements.txt", "make_tiny_model.py"},
	})
	s := &Server{
		Model: Model, APIKey: APIKey,
		python: filepath.Join(venv, "bin", "python"),
		model:  filepath.Join(venv, "tiny.gguf"),
	}
	s.process = pyserver.Start(tb, pyserver.Spec{
		Name: "llamacpptest", Server: "llama-cpp-python", Program: "llama_cpp.server",
		Dir: pyserver.TempDir(tb, "llamacpptest"), LogName: "server.log",
		Ports: func(tb testing.TB) string {
			s.port = pyserver.FreePort(tb)
			s.URL = fmt.Sprintf("http://127.0.0.1:%d", s.port)
			return s.URL
		},
		Retry:        "trying another port",
		Command:      func() *exec.Cmd { return exec.Command(s.python, s.args()...) },
		Ready:        s.ready,
		ReadyTimeout: readyTimeout,
	})
	return s
}

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
