package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"carehub/kernel/access"
	"carehub/storage/demo"
	"carehub/storage/postgres"
)

// server is one server under load, started by this process and stopped by Close.
type server struct {
	name   string
	base   string   // FHIR base URL
	origin string   // http://host:port (carehub)
	keys   []string // bearer keys (carehub), taken in turn; none for HAPI
	pid    int      // the server's process (carehub serve; HAPI's JVM)
	pgPid  string   // its PostgreSQL cluster's postmaster.pid
	close  func()

	// carehub: its binary, data dir and the flags its keys commands need.
	bin, dataDir string
	keyArgs      []string
}

// CPU is the CPU time the server's process and its PostgreSQL cluster have used so far (0
// for what /proc does not tell).
func (s *server) CPU() (proc, pg time.Duration) {
	proc, _ = procCPU(s.pid, true)
	if b, err := os.ReadFile(s.pgPid); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		if pm, err := strconv.Atoi(strings.TrimSpace(line)); err == nil {
			pg = treeCPU(pm)
		}
	}
	return proc, pg
}

func (s *server) Close() {
	if s.close != nil {
		s.close()
	}
}

// procCPU is user + system CPU of pid (with its reaped children's when children).
func procCPU(pid int, children bool) (time.Duration, int) {
	return statCPU(fmt.Sprintf("/proc/%d/stat", pid), children)
}

// statCPU reads a /proc stat file: a process's, or one thread's (/proc/PID/task/TID/stat;
// /proc/TID/stat would count the whole process).
func statCPU(path string, children bool) (time.Duration, int) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return 0, 0
	}
	// After the command: state ppid … utime(11) stime(12) cutime(13) cstime(14).
	n := 2
	if children {
		n = 4
	}
	var ticks int64
	for k := 11; k < 11+n; k++ {
		v, _ := strconv.ParseInt(f[k], 10, 64)
		ticks += v
	}
	ppid, _ := strconv.Atoi(f[1])
	return time.Duration(ticks) * postgres.ClockTick, ppid
}

// treeCPU is the CPU of a postmaster, its reaped children and its live ones (the backends).
func treeCPU(postmaster int) time.Duration {
	total, _ := procCPU(postmaster, true)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == postmaster {
			continue
		}
		if c, ppid := procCPU(pid, true); ppid == postmaster {
			total += c
		}
	}
	return total
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// stop sends SIGTERM to cmd's process and waits for it up to grace, then kills its group.
func stop(cmd *exec.Cmd, done <-chan struct{}, grace time.Duration) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// startCarehub starts `carehub serve` on its embedded defaults (local Postgres, durable; the
// embedded Kafka broker unless extra names --kafka-brokers; demo data) under a new data dir in
// /tmp on a free loopback port, and creates keys live keys of the demo organization with the
// FHIR read and write scopes.
func startCarehub(ctx context.Context, bin string, keys int, extra []string) (*server, error) {
	dir, err := os.MkdirTemp("/tmp", "carehub-peerbench-")
	if err != nil {
		return nil, err
	}
	s, err := startCarehubIn(ctx, bin, dir, extra)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	stopNode := s.close
	s.close = func() {
		stopNode()
		_ = os.RemoveAll(dir)
	}
	scopes := []string{access.ReadPatients, access.WritePatients, access.ReadObservations, access.WriteObservations}
	for range keys {
		k, err := s.createKey(ctx, access.Live, scopes)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.keys = append(s.keys, k)
	}
	return s, nil
}

// startCarehubIn starts `carehub serve` with its data under dir/data (made on the first start,
// kept by Close: a later start on dir finds the same database, keys and topics) and its log in
// dir/carehub.log, on a free loopback port, and waits until it is ready.
func startCarehubIn(ctx context.Context, bin, dir string, extra []string) (*server, error) {
	// The embedded Postgres runs as user postgres when we are root: it must traverse dir.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "carehub.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	dataDir := filepath.Join(dir, "data")
	args := append([]string{"serve", "--data-dir", dataDir, "--http-addr", addr,
		"--log-level", "warn", "--log-format", "text", "--access-log", "off"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM} // stopped with us, however we end
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s := &server{name: "carehub", base: "http://" + addr + "/fhir/R4", origin: "http://" + addr, pid: cmd.Process.Pid,
		pgPid: filepath.Join(dataDir, "postgres", "data", "postmaster.pid"), bin: bin, dataDir: dataDir}
	// Keys are made with the node's own settings (its Kafka brokers among them).
	for i, a := range extra {
		if a == "--kafka-brokers" && i+1 < len(extra) {
			s.keyArgs = append(s.keyArgs, a, extra[i+1])
		}
	}
	s.close = func() {
		stop(cmd, done, time.Minute)
		_ = logf.Close()
	}
	if err := waitHTTP(ctx, "http://"+addr+"/readyz", done, 3*time.Minute); err != nil {
		tail, _ := os.ReadFile(logPath)
		if len(tail) > 4000 {
			tail = tail[len(tail)-4000:]
		}
		s.Close()
		return nil, fmt.Errorf("carehub: %w\ncarehub log:\n%s", err, tail)
	}
	return s, nil
}

// createKey makes a key of the demo organization in mode (access.Live, access.Test) with
// scopes (none: an empty list), with `carehub keys create` on the node's data dir.
func (s *server) createKey(ctx context.Context, mode string, scopes []string) (string, error) {
	args := append([]string{"keys", "create", "--data-dir", s.dataDir, "--org", demo.DemoOrgSlug, "--mode", mode,
		"--scopes", strings.Join(scopes, ","), "--name", "peerbench", "--json"}, s.keyArgs...)
	out, err := exec.CommandContext(ctx, s.bin, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return "", fmt.Errorf("carehub keys create: %w", err)
	}
	var k struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal(out, &k); err != nil || k.Key == "" {
		return "", fmt.Errorf("carehub keys create: unexpected output %q", out)
	}
	return k.Key, nil
}

// startHAPI runs loadtest/peers/hapi/run.sh (build once, a fresh PostgreSQL cluster, the HAPI
// JVM) on a free loopback port and waits for its `ready` line.
func startHAPI(ctx context.Context, script string, heap string, pool int, logw io.Writer) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(script)
	cmd.Env = append(os.Environ(), fmt.Sprintf("HAPI_PORT=%d", port), "HAPI_HEAP="+heap, fmt.Sprintf("HAPI_POOL=%d", pool))
	s := &server{name: "hapi"}
	// The first run builds the server (Maven) before it starts it.
	line, err := startReady(ctx, cmd, logw, 90*time.Second, 30*time.Minute, func(stop func()) { s.close = stop })
	if err != nil {
		return nil, fmt.Errorf("HAPI (%s): %w", script, err)
	}
	for _, f := range strings.Fields(line)[1:] {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "pid":
			s.pid, _ = strconv.Atoi(v)
		case "pgdata":
			s.pgPid = filepath.Join(v, "postmaster.pid")
		default:
			if strings.HasPrefix(f, "http") {
				s.base = f
			}
		}
	}
	if s.base == "" {
		s.Close()
		return nil, errors.New("run.sh's ready line names no URL")
	}
	return s, nil
}

// startReady starts a peer's process (in a process group of its own, stopped with us however
// we end) and waits for the first line of its standard output that starts with "ready ", which
// it returns. setClose is given the way to stop the process (SIGTERM to its group, SIGKILL after
// grace) before any wait: the caller's Close stops it whatever happens next. An error stops it.
func startReady(ctx context.Context, cmd *exec.Cmd, logw io.Writer, grace, timeout time.Duration, setClose func(stop func())) (string, error) {
	cmd.Stderr = logw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start: %w", err)
	}
	done := make(chan struct{})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "ready ") {
				select {
				case ready <- line:
				default:
				}
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(done) }()
	halt := func() { stop(cmd, done, grace) }
	setClose(halt)
	select {
	case line := <-ready:
		return line, nil
	case <-done:
		return "", errors.New("exited before it was ready")
	case <-ctx.Done():
		halt()
		return "", ctx.Err()
	case <-time.After(timeout):
		halt()
		return "", fmt.Errorf("not ready after %s", timeout)
	}
}

// waitHTTP polls url until it answers 200, the process exits or timeout passes.
func waitHTTP(ctx context.Context, url string, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("exited before it was ready")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not 200 after %s", url, timeout)
		}
	}
}

// machineBusy is the whole machine's busy CPU time so far (/proc/stat's cpu line: user, nice,
// system, irq, softirq, steal), 0 where it cannot be read.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += v
	}
	return time.Duration(ticks) * postgres.ClockTick
}

// jitCPU is the CPU time of the JVM's JIT compiler threads of pid (0 for a process with none):
// while it grows the JVM is still compiling, and the server is not yet at its steady state.
func jitCPU(pid int) time.Duration {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var total time.Duration
	for _, t := range tasks {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/comm", pid, t.Name()))
		if err != nil || !(strings.HasPrefix(string(comm), "C1 Compiler") || strings.HasPrefix(string(comm), "C2 Compiler")) {
			continue
		}
		c, _ := statCPU(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()), false)
		total += c
	}
	return total
}
