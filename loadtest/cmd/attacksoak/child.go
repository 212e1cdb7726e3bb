package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"time"

	"carehub/loadtest/loadcli"
)

// The attacker runs in a process of its own, as a third party's client does: sharing the
// legitimate clients' process, its goroutines (thousands of held connections, sockets reading
// megabytes a second) were scheduled and collected with theirs, and the legitimate latency
// measured the soak's own client as much as the node. The parent sets everything up and hands
// the child its order on stdin; the child attacks for the phase and writes its counts to stdout.

// order is what the attacker process needs: where the node is, the attacker's keys and the
// attacks' sizes.
type order struct {
	URL      string        `json:"url"`
	Brokers  []string      `json:"brokers"`
	Slow     int           `json:"slow"`
	Sockets  int           `json:"sockets"`
	Duration time.Duration `json:"duration"`
	Only     string        `json:"only"`
	Keys     wireKeys      `json:"keys"`
}

// wireKeys is attackerKeys on the wire.
type wireKeys struct {
	Live, Test, Writer, OrgID, Project, RealPatient, MRN, IdemKey, JWT string
	Billing                                                            []string
}

func (k *attackerKeys) wire() wireKeys {
	return wireKeys{Live: k.live, Test: k.test, Writer: k.writer, OrgID: k.orgID, Project: k.project, RealPatient: k.realPatient,
		MRN: k.mrn, IdemKey: k.idemKey, JWT: k.jwt, Billing: k.billing}
}

func (k wireKeys) keys() *attackerKeys {
	return &attackerKeys{live: k.Live, test: k.Test, writer: k.Writer, orgID: k.OrgID, project: k.Project, realPatient: k.RealPatient,
		mrn: k.MRN, idemKey: k.IdemKey, jwt: k.JWT, billing: k.Billing}
}

// attackFromChild starts the attacker process for c.duration; wait returns its counts once it
// has ended.
func (w *world) attackFromChild(ctx context.Context, c config) (wait func() (counts []string, cpuSeconds float64, err error), err error) {
	o := order{URL: w.n.url, Brokers: w.n.brokers, Slow: c.slow, Sockets: c.sockets, Duration: c.duration, Only: c.only, Keys: w.attacker.wire()}
	in, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self, "-attacker")
	if c.attackerNice != 0 {
		// nice(1) rather than setpriority on the child: a Linux priority is a thread's, and the
		// Go runtime starts threads before the child could set it; all of them inherit nice's.
		cmd = exec.CommandContext(ctx, "nice", "-n", fmt.Sprint(c.attackerNice), self, "-attacker")
	}
	cmd.Stdin = bytes.NewReader(in)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the attacker process: %w", err)
	}
	return func() ([]string, float64, error) {
		if err := cmd.Wait(); err != nil {
			return nil, 0, fmt.Errorf("the attacker process: %w", err)
		}
		var counts []string
		if err := json.Unmarshal(out.Bytes(), &counts); err != nil {
			return nil, 0, fmt.Errorf("the attacker process's counts: %w (%.300s)", err, out.Bytes())
		}
		st := cmd.ProcessState
		return counts, (st.UserTime() + st.SystemTime()).Seconds(), nil
	}, nil
}

// runAttacker is the attacker process: it reads its order, attacks for its duration and writes
// the counts of what each attack was answered.
func runAttacker(ctx context.Context) error {
	var o order
	if err := json.NewDecoder(os.Stdin).Decode(&o); err != nil {
		return fmt.Errorf("read the order: %w", err)
	}
	c := config{slow: o.Slow, sockets: o.Sockets, only: o.Only}
	w := &world{n: &node{url: o.URL, brokers: o.Brokers}, http: loadcli.HTTPClient(64), attacker: o.Keys.keys()}
	ctx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	a := newAttacker(w, c)
	a.start(ctx)()
	return json.NewEncoder(os.Stdout).Encode(a.counts())
}
