package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuUse is where the machine's CPU went over a phase, in cores (CPU seconds a second): the whole
// machine's busy time, the node's process (the embedded Postgres runs in processes of its own and
// counts only in the machine's), this soak's legitimate clients and the attacker process. A
// ratio measured on a machine already busy with something else says little; these say whether
// it was.
type cpuUse struct {
	Machine  float64 `json:"machineCores"`
	Node     float64 `json:"nodeCores"`
	Clients  float64 `json:"legitimateClientCores"`
	Attacker float64 `json:"attackerCores,omitempty"`
	Cores    int     `json:"cores"`
}

func (u cpuUse) String() string {
	return fmt.Sprintf("CPU: machine %.2f of %d cores busy; node %.2f, legitimate clients %.2f, attacker %.2f",
		u.Machine, u.Cores, u.Node, u.Clients, u.Attacker)
}

// cpuMark is the counters at a phase's start.
type cpuMark struct {
	at              time.Time
	busy, all       float64 // machine jiffies
	node, clients   float64 // seconds
	attackerSeconds float64
}

func markCPU(nodePID int) cpuMark {
	m := cpuMark{at: time.Now()}
	m.busy, m.all = machineJiffies()
	m.node = processSeconds(nodePID)
	m.clients = selfSeconds()
	return m
}

// since returns the use from m until now; attacker is the attacker process's CPU seconds.
func (m cpuMark) since(nodePID int, attacker float64) cpuUse {
	now := markCPU(nodePID)
	wall := now.at.Sub(m.at).Seconds()
	u := cpuUse{Cores: numCPU()}
	if wall <= 0 {
		return u
	}
	if d := now.all - m.all; d > 0 {
		u.Machine = (now.busy - m.busy) / d * float64(u.Cores)
	}
	u.Node = (now.node - m.node) / wall
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

func selfSeconds() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func numCPU() int {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "cpu") && !strings.HasPrefix(line, "cpu ") {
			n++
		}
	}
	return n
}
