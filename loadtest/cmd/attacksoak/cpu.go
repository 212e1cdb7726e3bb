package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuUse is where the machine's CPU went over a phase, in cores (CPU seconds a second): the whole
// machine's busy time, the node's process, its embedded Postgres (the postmaster serving the
// node's data dir and its backends alive at both ends of the phase), this soak's legitimate
// clients and the attacker process. A ratio measured on a machine already
// busy with something else says little; these say whether it was.
type cpuUse struct {
	Machine  float64 `json:"machineCores"`
	Node     float64 `json:"nodeCores"`
	Postgres float64 `json:"postgresCores"`
	Clients  float64 `json:"legitimateClientCores"`
	Attacker float64 `json:"attackerCores,omitempty"`
	Cores    int     `json:"cores"`
}

func (u cpuUse) String() string {
	return fmt.Sprintf("CPU: machine %.2f of %d cores busy; node %.2f, its Postgres %.2f, legitimate clients %.2f, attacker %.2f",
		u.Machine, u.Cores, u.Node, u.Postgres, u.Clients, u.Attacker)
}

// cpuMark is the counters at a phase's start.
type cpuMark struct {
	at              time.Time
	busy, all       float64 // machine jiffies
	node, clients   float64 // seconds
	postgres        float64 // seconds of the node's Postgres processes alive at the mark
	attackerSeconds float64
}

func markCPU(nodePID int, dataDir string) cpuMark {
	m := cpuMark{at: time.Now()}
	m.busy, m.all = machineJiffies()
	m.node = processSeconds(nodePID)
	m.postgres = postgresSeconds(dataDir)
	m.clients = selfSeconds()
	return m
}

// since returns the use from m until now; attacker is the attacker process's CPU seconds.
func (m cpuMark) since(nodePID int, dataDir string, attacker float64) cpuUse {
	now := markCPU(nodePID, dataDir)
	wall := now.at.Sub(m.at).Seconds()
	u := cpuUse{Cores: runtime.NumCPU()}
	if wall <= 0 {
		return u
	}
	if d := now.all - m.all; d > 0 {
		u.Machine = (now.busy - m.busy) / d * float64(u.Cores)
	}
	u.Node = (now.node - m.node) / wall
	u.Postgres = max(0, now.postgres-m.postgres) / wall // backends that ended in between are not counted
	u.Clients = (now.clients - m.clients) / wall
	u.Attacker = attacker / wall
	return u
}

// machineJiffies reads the first line of /proc/stat: busy and total jiffies of all CPUs.
func machineJiffies() (busy, all float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, v := range f[1:] {
		n, _ := strconv.ParseFloat(v, 64)
		all += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, all
}

// processSeconds is the user and system CPU seconds of process pid (/proc/pid/stat).
func processSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	_, rest, ok := strings.Cut(string(b), ") ") // after the command, which may hold spaces
	if !ok {
		return 0
	}
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// postgresSeconds is the CPU seconds of the Postgres serving dataDir (pg_ctl detaches it from
// the node): the process whose command line names dataDir, and its descendants.
func postgresSeconds(dataDir string) float64 {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	parent := map[int]int{}
	root := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if _, rest, ok := strings.Cut(string(b), ") "); ok {
			if f := strings.Fields(rest); len(f) > 1 {
				parent[pid], _ = strconv.Atoi(f[1])
			}
		}
		if cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && root == 0 &&
			strings.Contains(string(cmd), "postgres") && strings.Contains(string(cmd), dataDir) {
			root = pid
		}
	}
	if root == 0 {
		return 0
	}
	total := processSeconds(root)
	for pid := range parent {
		for p := parent[pid]; p > 1; p = parent[p] {
			if p == root {
				total += processSeconds(pid)
				break
			}
		}
	}
	return total
}

func selfSeconds() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
