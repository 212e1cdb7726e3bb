// Package pyserver runs a Python model server process that tests start, kill and restart on
// a fixed loopback port: the process management that the test harnesses of
// processors/inference (oip/mlservertest, chat/llamacpptest) share.
//
// A Process runs its command in its own process group with its output appended to a log
// file, waits until the server answers ready, and, when its test ends, stops it with SIGTERM
// (SIGKILL after 5 s). Kill kills it as a crash would; Restart runs it again on the same
// ports. What a server needs beyond that (its venv, settings, model, command line and
// readiness check) stays with its harness.
package pyserver

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
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// logTail is how much of the server's output Log returns at most.
const logTail = 8000

// Spec says how to run one kind of server.
type Spec struct {
	// Name prefixes every message and log header line, e.g. "mlservertest".
	Name string
	// Server names the server in messages, e.g. "MLServer".
	Server string
	// Program names the server's process in errors, e.g. "mlserver".
	Program string
	// Dir is the process's working directory and holds its log, LogName. The caller makes
	// it (see TempDir) and keeps its own files there.
	Dir     string
	LogName string
	// Ports chooses new free ports for an attempt of Start (not of Restart), puts them where
	// Command and Ready read them, and returns the server's URL, for messages.
	Ports func(tb testing.TB) string
	// Retry ends the message Start logs when a port was taken, e.g. "trying other ports".
	Retry string
	// Command returns the server's command for one run. Run sets its Dir, output,
	// environment (os.Environ with PYTHONUNBUFFERED=1, after any Env of its own) and
	// process group.
	Command func() *exec.Cmd
	// Ready reports whether the server is ready to serve; polled every 100 ms.
	Ready func(hc *http.Client) bool
	// ReadyTimeout bounds one Start or Restart, up to Ready.
	ReadyTimeout time.Duration
}

// Process is one server process on fixed ports, restartable.
type Process struct {
	spec Spec
	url  string

	mu      sync.Mutex
	cmd     *exec.Cmd     // the last process started
	done    chan struct{} // closed when cmd has exited
	starts  int           // processes started
	stopped bool          // set by the cleanup
}

// Start starts the server for tb and stops it when tb ends (t.Cleanup). A start that fails
// because a port was taken is tried again, up to 3 times, on ports Spec.Ports chooses anew;
// any other failure fails tb with the log's tail.
func Start(tb testing.TB, spec Spec) *Process {
	tb.Helper()
	p := &Process{spec: spec}
	tb.Cleanup(p.stop)
	start := time.Now()
	for attempt := 1; ; attempt++ {
		// Free ports are free when looked at; another process may take one before the
		// server binds it. Then try new ones.
		p.url = spec.Ports(tb)
		err := p.run(spec.ReadyTimeout)
		if err == nil {
			break
		}
		if errors.Is(err, errPortTaken) && attempt < 3 {
			tb.Logf("%s: %v; %s", spec.Name, err, spec.Retry)
			continue
		}
		tb.Fatalf("%s: %v\n%s", spec.Name, err, p.Log())
	}
	tb.Logf("%s: %s ready at %s after %v", spec.Name, spec.Server, p.url, time.Since(start).Round(10*time.Millisecond))
	return p
}

// Kill kills the server with SIGKILL (as a crash would) and waits for it to exit. It does
// nothing when the server is not running.
func (p *Process) Kill() {
	if cmd, done := p.running(); cmd != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the process group: the server and any child
		<-done
	}
}

// running returns the last process started and its done channel, or nil when it has
// exited (its pid may belong to another process by now) or none was started.
func (p *Process) running() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil, nil
	}
	select {
	case <-done:
		return nil, nil
	default:
		return cmd, done
	}
}

// Restart starts the server again on the same ports after Kill, and waits until it is
// ready, so a client built with its URL reconnects. A server still running is killed first.
func (p *Process) Restart(tb testing.TB) {
	tb.Helper()
	p.Kill()
	start := time.Now()
	deadline := start.Add(p.spec.ReadyTimeout)
	portDeadline := start.Add(10 * time.Second)
	for {
		err := p.run(time.Until(deadline))
		if err == nil {
			break
		}
		// A port of the killed process may not be free again at once; another process
		// may also have taken it meanwhile. Retry for a while, then give up.
		if errors.Is(err, errPortTaken) && time.Now().Before(portDeadline) {
			time.Sleep(250 * time.Millisecond)
			continue
		}
		tb.Fatalf("%s: restart: %v\n%s", p.spec.Name, err, p.Log())
	}
	tb.Logf("%s: %s ready again at %s after %v", p.spec.Name, p.spec.Server, p.url, time.Since(start).Round(10*time.Millisecond))
}

// Log returns what the server printed, for failure messages: the output of every process
// Start and Restart ran, each under a header line, cut to the last few kilobytes.
func (p *Process) Log() string {
	b, err := os.ReadFile(p.logPath())
	if err != nil {
		return fmt.Sprintf("(no %s log: %v)", p.spec.Server, err)
	}
	if len(b) > logTail {
		return "[…]" + string(b[len(b)-logTail:])
	}
	return string(b)
}

func (p *Process) logPath() string { return filepath.Join(p.spec.Dir, p.spec.LogName) }

// errPortTaken marks a start that failed because a port was in use.
var errPortTaken = errors.New("port in use")

// run starts the server and waits up to timeout for it to be ready. When it is not, the
// process is gone on return.
func (p *Process) run(timeout time.Duration) error {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return errors.New("server stopped (its test has ended)")
	}
	p.starts++
	n := p.starts
	p.mu.Unlock()

	logf, err := os.OpenFile(p.logPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	from, err := logf.Seek(0, io.SeekEnd)
	if err == nil {
		_, err = fmt.Fprintf(logf, "=== %s: start %d at %s ===\n", p.spec.Name, n, time.Now().Format(time.TimeOnly))
	}
	if err != nil {
		logf.Close()
		return err
	}
	cmd := p.spec.Command()
	cmd.Dir = p.spec.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(append(os.Environ(), cmd.Env...), "PYTHONUNBUFFERED=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // Kill and stop signal the group
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %v", cmd.Path, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()

	hc := &http.Client{Timeout: time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.After(timeout)
	for !p.spec.Ready(hc) {
		select {
		case <-done:
			err := fmt.Errorf("%s (start %d) exited before it was ready", p.spec.Program, n)
			if out, _ := os.ReadFile(p.logPath()); int64(len(out)) > from &&
				strings.Contains(strings.ToLower(string(out[from:])), "address already in use") {
				err = fmt.Errorf("%w: %w", err, errPortTaken)
			}
			return err
		case <-deadline:
			p.Kill()
			return fmt.Errorf("%s (start %d) not ready after %v", p.spec.Program, n, timeout)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// stop asks the server to shut down and kills it after 5 s.
func (p *Process) stop() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	cmd, done := p.running()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		p.Kill()
	}
}

// TempDir makes a new directory for a server's files, named name-*, and removes it when tb
// ends. Make it before Start: cleanups run last first, so the directory goes after the
// server has stopped.
func TempDir(tb testing.TB, name string) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", name+"-")
	if err != nil {
		tb.Fatalf("%s: %v", name, err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Venv says where a server's venv is and what makes it current.
type Venv struct {
	Name  string // prefixes messages, e.g. "mlservertest"
	What  string // names the venv in messages, e.g. "MLServer venv"
	Env   string // the environment variable that overrides the venv's path
	Cache string // the venv's directory under $HOME/.cache/carehub when Env is not set
	Setup string // how to make the venv, for messages: "run `tests/…/setup.sh` (…)"
	// Need are the paths, relative to the venv, that must exist: its programs, its model.
	Need []string
	// Sources is the directory, relative to the repository root, that holds the files the
	// venv keeps copies of, Copies; the venv is stale when a copy differs.
	Sources string
	Copies  []string
}

// VenvPath returns v's path, failing tb, naming v.Setup, when the venv lacks a file of v.Need
// or is stale.
func VenvPath(tb testing.TB, v Venv) string {
	tb.Helper()
	venv := os.Getenv(v.Env)
	if venv == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			tb.Fatalf("%s: no home directory for the %s (%v); set %s or %s", v.Name, v.What, err, v.Env, v.Setup)
		}
		venv = filepath.Join(home, ".cache", "carehub", v.Cache)
	}
	for _, f := range v.Need {
		if _, err := os.Stat(filepath.Join(venv, f)); err != nil {
			tb.Fatalf("%s: %s missing or incomplete (%v): %s", v.Name, v.What, err, v.Setup)
		}
	}
	root := RepoRoot(tb)
	for _, f := range v.Copies {
		want, err := os.ReadFile(filepath.Join(root, v.Sources, f))
		if err != nil {
			tb.Fatalf("%s: %v", v.Name, err)
		}
		have, _ := os.ReadFile(filepath.Join(venv, f))
		if string(want) != string(have) {
			tb.Fatalf("%s: %s %s was made from another %s/%s: %s", v.Name, v.What, venv, v.Sources, f, v.Setup)
		}
	}
	return venv
}

// RepoRoot is the directory holding go.mod, found upwards from this file.
func RepoRoot(tb testing.TB) string {
	tb.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		tb.Fatal("pyserver: runtime.Caller failed")
	}
	for dir := filepath.Dir(file); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if filepath.Dir(dir) == dir {
			tb.Fatalf("pyserver: go.mod not found above %s", file)
		}
	}
}

// FreePort returns a loopback TCP port that was free when looked at.
func FreePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("pyserver: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
