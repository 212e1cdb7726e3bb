// Command attacksoak is issue 51's soak: mixed legitimate traffic from two tenants while a third
// tenant's keys run every attack of docs/SECURITY.md ("Hardening, round two") in a loop, against
// a `carehub serve` process it starts on the embedded defaults. It runs the legitimate traffic
// twice on the same node, first alone (the baseline) and then beside the attacker, and reports
// each phase's error rate and latency and the attacked p99 over the baseline's; it exits 1 when
// the legitimate traffic saw an error under attack, its p99 grew more than 2×, or the node
// stopped answering. The attacker runs in a process of its own (child.go), and each phase says
// where the machine's CPU went (cpu.go).
//
//	go build -o bin/carehub ./cmd/carehub && go run ./loadtest/cmd/attacksoak -d 10m
//
// Everything it starts is on loopback and under a temporary data dir, removed at the end.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"carehub/kernel/access"
	"carehub/loadtest/loadcli"
)

type config struct {
	binary   string
	duration time.Duration
	rate     float64 // legitimate requests a second per tenant
	clients  int     // legitimate clients per tenant
	slow     int     // slow-body connections the attacker holds
	sockets  int     // WebSocket connections the attacker tries to hold
	keep     bool
	profile  string // a CPU profile of the node over the attacked phase's middle half goes here
	trace    string // an execution trace of the node over 5 s in the attacked phase's middle goes here
	only     string // the attacks to run, by number ("1,3,10"); "" runs them all
	// attackerNice is the attacker process's nice value: a real attacker's client runs on its
	// own machine, and on a shared one its CPU is the node's loss only as far as the OS gives it.
	attackerNice int
	nodeArgs     []string // more flags for carehub serve
}

func main() {
	var c config
	flag.StringVar(&c.binary, "carehub", "bin/carehub", "the carehub binary to start (go build -o bin/carehub ./cmd/carehub)")
	flag.DurationVar(&c.duration, "d", 10*time.Minute, "length of each phase (baseline, then under attack)")
	flag.Float64Var(&c.rate, "rate", 30, "legitimate requests a second per tenant (below the per-key limit of 50/s over its keys)")
	flag.IntVar(&c.clients, "c", 4, "legitimate clients per tenant, each with a key of its own")
	flag.IntVar(&c.slow, "slow-conns", 2000, "connections the attacker holds open with an unfinished body")
	flag.IntVar(&c.sockets, "sockets", 300, "WebSocket connections the attacker tries to hold, each subscribing as often as it may")
	flag.BoolVar(&c.keep, "keep", false, "keep the node's data dir")
	flag.StringVar(&c.profile, "cpuprofile", "", "write a CPU profile of the node over the middle half of the attacked phase to this file")
	flag.StringVar(&c.trace, "trace", "", "write an execution trace of the node over 5 s in the middle of the attacked phase to this file (go tool trace; -pprof=sched for where goroutines waited to run)")
	flag.StringVar(&c.only, "only", "", "run only these attacks, by their numbers in docs/SECURITY.md (\"2,10\"), to see what each costs the node")
	flag.IntVar(&c.attackerNice, "attacker-nice", 0, "run the attacker process at this nice value (19: it gets only the CPU the node and the legitimate clients leave, as if it ran on a machine of its own)")
	flag.Func("node-flag", "a flag to pass to carehub serve (repeatable: -node-flag=--rate-per-org=50), to see what a limit does to the soak", func(v string) error {
		c.nodeArgs = append(c.nodeArgs, v)
		return nil
	})
	attackerProcess := flag.Bool("attacker", false, "run as the attacker process (the soak starts it; its order comes on stdin)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	do := run
	if *attackerProcess {
		do = func(ctx context.Context, _ config) error { return runAttacker(ctx) }
	}
	if err := do(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "attacksoak:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) error {
	if c.duration <= 0 || c.duration > loadcli.MaxDuration || c.rate <= 0 || c.clients < 1 || c.clients > 64 {
		return fmt.Errorf("-d must be within (0, %v], -rate positive, -c 1..64", loadcli.MaxDuration)
	}
	dir, err := os.MkdirTemp("", "carehub-attacksoak-")
	if err != nil {
		return err
	}
	if !c.keep {
		defer os.RemoveAll(dir)
	}
	// The postgres account must traverse it to reach the embedded cluster.
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	n, err := startNode(ctx, c.binary, dir, c.profile != "" || c.trace != "", c.nodeArgs)
	if err != nil {
		return err
	}
	defer n.stop()
	w, err := setUp(ctx, n, c)
	if err != nil {
		return fmt.Errorf("set up: %w", err)
	}

	fmt.Fprintf(os.Stderr, "baseline: %v of legitimate traffic, no attacker\n", c.duration)
	pid := n.cmd.Process.Pid
	mark := markCPU(pid, n.dir)
	base := w.legitimate(ctx, c)
	base.CPU = mark.since(pid, n.dir, 0)
	fmt.Fprintf(os.Stderr, "under attack: %v of legitimate traffic beside the attacker\n", c.duration)
	waitAttacker, err := w.attackFromChild(ctx, c)
	if err != nil {
		return err
	}
	mark = markCPU(pid, n.dir)
	profiled := make(chan error, 2)
	if c.profile != "" {
		go func() { profiled <- n.profile(ctx, "profile", c.duration/4, c.duration/2, c.profile) }()
	} else {
		profiled <- nil
	}
	if c.trace != "" {
		go func() { profiled <- n.profile(ctx, "trace", c.duration/2, 5*time.Second, c.trace) }()
	} else {
		profiled <- nil
	}
	attacked := w.legitimate(ctx, c)
	for range 2 {
		if err := <-profiled; err != nil {
			fmt.Fprintln(os.Stderr, "attacksoak: profile:", err)
		}
	}
	counts, attackerCPU, err := waitAttacker()
	if err != nil {
		return err
	}
	attacked.CPU = mark.since(pid, n.dir, attackerCPU)
	alive := n.ready(ctx)

	rep := report{Baseline: base, Attacked: attacked, Attacks: counts, NodeAnswered: alive}
	if base.Latency.P99 > 0 {
		rep.P99Ratio = attacked.Latency.P99 / base.Latency.P99
	}
	rep.print(os.Stdout)
	var fails []string
	if attacked.Errors > 0 || base.Errors > 0 {
		fails = append(fails, fmt.Sprintf("legitimate errors: %d baseline, %d under attack", base.Errors, attacked.Errors))
	}
	if rep.P99Ratio > 2 {
		fails = append(fails, fmt.Sprintf("p99 under attack is %.2f× the baseline's", rep.P99Ratio))
	}
	if !alive {
		fails = append(fails, "the node's /readyz did not answer 200 after the attack")
	}
	if len(fails) > 0 {
		return errors.New(strings.Join(fails, "; "))
	}
	return nil
}

// node is the carehub serve process under test.
type node struct {
	cmd     *exec.Cmd
	url     string
	dir     string
	binary  string
	brokers []string
	// debugURL serves the node's profiles (--debug-addr) when -cpuprofile or -trace asked for one.
	debugURL string
	exited   chan struct{}
}

func startNode(ctx context.Context, binary, dir string, debug bool, extra []string) (*node, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{"serve", "--data-dir", filepath.Join(dir, "node"), "--http-addr", addr,
		"--webhooks-allow-private", "--access-log", "off", "--log-level", "info"}
	var debugAddr string
	if debug {
		if debugAddr, err = freeAddr(); err != nil {
			return nil, err
		}
		args = append(args, "--debug-addr", debugAddr)
	}
	args = append(args, extra...)
	cmd := exec.Command(binary, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	n := &node{cmd: cmd, url: "http://" + addr, debugURL: "http://" + debugAddr, dir: filepath.Join(dir, "node"), binary: binary, exited: make(chan struct{})}
	ready := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line struct {
				Msg     string   `json:"msg"`
				Brokers []string `json:"kafka_brokers"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "carehub ready" {
				ready <- line.Brokers
			} else if strings.Contains(sc.Text(), `"level":"ERROR"`) {
				fmt.Fprintln(os.Stderr, "node:", sc.Text())
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(n.exited) }()
	select {
	case n.brokers = <-ready:
		return n, nil
	case <-n.exited:
		return nil, errors.New("carehub exited before it was ready")
	case <-time.After(3 * time.Minute):
		n.stop()
		return nil, errors.New("carehub not ready after 3 minutes")
	case <-ctx.Done():
		n.stop()
		return nil, ctx.Err()
	}
}

// profile waits for after, then writes the node's /debug/pprof/<kind> (a CPU profile, an
// execution trace) over the next d to file.
func (n *node) profile(ctx context.Context, kind string, after, d time.Duration, file string) error {
	select {
	case <-time.After(after):
	case <-ctx.Done():
		return ctx.Err()
	}
	url := fmt.Sprintf("%s/debug/pprof/%s?seconds=%d", n.debugURL, kind, max(1, int(d.Seconds())))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (n *node) stop() {
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(time.Minute):
		_ = n.cmd.Process.Kill()
		<-n.exited
	}
}

// key creates a key with the CLI, as an operator would.
func (n *node) key(ctx context.Context, org, mode string, scopes ...string) (string, error) {
	args := []string{"keys", "create", "--data-dir", n.dir, "--org", org, "--mode", mode, "--json"}
	if len(scopes) > 0 {
		args = append(args, "--scopes", strings.Join(scopes, ","))
	}
	out, err := exec.CommandContext(ctx, n.binary, args...).Output()
	if err != nil {
		return "", fmt.Errorf("keys create --org %s: %w", org, err)
	}
	var k struct{ Key string }
	if err := json.Unmarshal(out, &k); err != nil || k.Key == "" {
		return "", fmt.Errorf("keys create --org %s: %q", org, out)
	}
	return k.Key, nil
}

// ready reports whether /readyz answers 200 within 10 s.
func (n *node) ready(ctx context.Context) bool {
	cl := loadcli.HTTPClient(1)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		req, _ := httpRequest(ctx, "GET", n.url+"/readyz", "", nil)
		if resp, err := cl.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return true
			}
		}
	}
	return false
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Every scope, for the keys that stand for a full integration.
var allScopes = access.Scopes
