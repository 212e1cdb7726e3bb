package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// kafkaBroker is an Apache Kafka broker of deploy/local/kafka/kafka.sh started by this process on
// free ports with its state in a directory of its own, stopped and deleted by Close.
type kafkaBroker struct {
	*localDaemon
	addr string
}

// startKafka runs `kafka.sh up` (it fetches the jars once, formats the state dir, starts the
// broker and waits until it serves metadata) on two free loopback ports.
func startKafka(ctx context.Context, script string, logw io.Writer) (*kafkaBroker, error) {
	d, err := startDaemon(ctx, "kafka", script, logw, [2]string{"KAFKA_PORT", "KAFKA_CONTROLLER_PORT"}, "KAFKA_STATE_DIR")
	if err != nil {
		return nil, err
	}
	if out, err := d.output(ctx, "pid"); err == nil {
		d.pid, _ = strconv.Atoi(strings.TrimSpace(out))
	}
	return &kafkaBroker{localDaemon: d, addr: fmt.Sprintf("127.0.0.1:%d", d.ports[0])}, nil
}

// localDaemon is a server of deploy/local (kafka.sh, clickhouse.sh) that this process started
// on two free loopback ports, with its state in a directory of its own under /tmp.
type localDaemon struct {
	name, script, state string
	env                 []string
	ports               [2]int
	pid                 int // when known: Close kills it if the script cannot stop it
}

// startDaemon runs `script up` with the two ports in portVars and the state directory in
// stateVar, plus env; it stops and deletes what it started if up fails.
func startDaemon(ctx context.Context, name, script string, logw io.Writer, portVars [2]string, stateVar string, env ...string) (*localDaemon, error) {
	d := &localDaemon{name: name, script: script}
	for i := range d.ports {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		d.ports[i] = port
	}
	state, err := os.MkdirTemp("/tmp", "carehub-peerbench-"+name+"-")
	if err != nil {
		return nil, err
	}
	d.state = state
	d.env = append(append(os.Environ(), fmt.Sprintf("%s=%d", portVars[0], d.ports[0]), fmt.Sprintf("%s=%d", portVars[1], d.ports[1]),
		stateVar+"="+state), env...)
	if err := d.run(ctx, logw, "up"); err != nil {
		d.Close()
		return nil, fmt.Errorf("%s up: %w", filepath.Base(script), err)
	}
	return d, nil
}

func (d *localDaemon) run(ctx context.Context, logw io.Writer, args ...string) error {
	cmd := exec.CommandContext(ctx, d.script, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = d.env, logw, logw
	return cmd.Run()
}

func (d *localDaemon) output(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, d.script, args...)
	cmd.Env = d.env
	out, err := cmd.Output()
	return string(out), err
}

// Close stops the server (`script down`: SIGTERM, SIGKILL after its timeout) and deletes its
// state. It does not depend on the run's context, which may be over.
func (d *localDaemon) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := d.run(ctx, io.Discard, "down"); err != nil {
		fmt.Fprintf(os.Stderr, "peerbench: %s down: %v\n", filepath.Base(d.script), err)
		if d.pid > 0 {
			_ = syscall.Kill(d.pid, syscall.SIGKILL)
		}
	}
	_ = os.RemoveAll(d.state)
}

// graphqlwsPeer is loadtest/peers/graphqlws/server.cjs on Node, started by this process.
type graphqlwsPeer struct {
	wsURL, statsURL string
	pid             int
	close           func()
}

func (p *graphqlwsPeer) Close() {
	if p.close != nil {
		p.close()
	}
}

// startGraphQLWS starts the peer on a free loopback port, reading topic from brokers with the
// packages installed under modules (make peers-deps), and waits for its ready line (it has
// joined its consumer group).
func startGraphQLWS(ctx context.Context, node, script, modules string, brokers, topic string, logw io.Writer) (*graphqlwsPeer, error) {
	if _, err := os.Stat(filepath.Join(modules, "node_modules", "graphql-ws")); err != nil {
		return nil, fmt.Errorf("graphql-ws peer: its packages are not installed under %s (make peers-deps)", modules)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(node, script)
	// NODE_ENV=production is how the libraries are deployed: graphql-js skips its development
	// checks and graphql-ws its verbose close reasons.
	cmd.Env = append(os.Environ(), "NODE_ENV=production", "GRAPHQLWS_PEER_MODULES="+modules, "KAFKA_BROKERS="+brokers,
		"KAFKA_TOPIC="+topic, "HOST=127.0.0.1", fmt.Sprintf("PORT=%d", port))
	p := &graphqlwsPeer{}
	line, err := startReady(ctx, cmd, logw, 20*time.Second, 2*time.Minute, func(stop func()) { p.close = stop })
	if err != nil {
		return nil, fmt.Errorf("graphql-ws peer: %w", err)
	}
	p.pid = cmd.Process.Pid
	f := strings.Fields(line)
	if len(f) < 2 || !strings.HasPrefix(f[1], "http://") {
		p.Close()
		return nil, fmt.Errorf("graphql-ws peer: unexpected ready line %q", line)
	}
	origin := strings.TrimSuffix(f[1], "/graphql")
	p.wsURL, p.statsURL = "ws"+strings.TrimPrefix(f[1], "http"), origin+"/stats"
	return p, nil
}

// peerStats is the peer's GET /stats.
type peerStats struct {
	Sockets       int64 `json:"sockets"`
	Subscriptions int64 `json:"subscriptions"`
	Records       int64 `json:"records"`
	Pushed        int64 `json:"pushed"`
	Dropped       int64 `json:"dropped"`
	Undecodable   int64 `json:"undecodable"`
	Memory        struct {
		HeapTotal float64 `json:"heapTotal"`
		HeapUsed  float64 `json:"heapUsed"`
		External  float64 `json:"external"`
	} `json:"memory"`
}

func (p *graphqlwsPeer) stats(ctx context.Context) (peerStats, error) {
	var st peerStats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.statsURL, nil)
	if err != nil {
		return st, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("GET %s: %d", p.statsURL, resp.StatusCode)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// procRSS is the resident set of pid (VmRSS), in bytes; 0 when /proc does not tell.
func procRSS(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseFloat(f[0], 64)
				return kb * 1024
			}
		}
	}
	return 0
}

// raiseOpenFiles makes the open-file limit of this process, and so of the servers it starts,
// at least want: the soft limit up to the hard one, and the hard one too when we may (root).
func raiseOpenFiles(want uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= want {
		return lim.Cur, nil
	}
	next := lim
	next.Cur = want
	if lim.Max < want {
		next.Max = want
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &next); err != nil {
		// Not allowed past the hard limit: take what there is.
		next = syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
		if err2 := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &next); err2 != nil {
			return lim.Cur, err2
		}
		return next.Cur, fmt.Errorf("open-file limit %d, %d wanted: %w", next.Cur, want, err)
	}
	return next.Cur, nil
}
