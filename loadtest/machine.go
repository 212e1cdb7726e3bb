package loadtest

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"carehub/storage/postgres"
)

// machineCPU is the CPU time of the whole machine, all cores, by state: /proc/stat's first line.
// With a run's own CPU (Config.CPU) it tells what else took the cores in that window: other
// processes (busy − ours), or the hypervisor (steal: time a virtual core was ready but another
// guest ran). Both move a run's figures on a shared machine.
type machineCPU struct {
	busy, idle, iowait, steal time.Duration
}

// readMachineCPU reads /proc/stat; outside Linux it fails, and the report leaves the figures out.
func readMachineCPU() (machineCPU, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return machineCPU{}, errors.New("/proc/stat: no cpu line")
	}
	// user nice system idle iowait irq softirq steal (guest time is counted in user already)
	var t [8]time.Duration
	for i := range t {
		v, err := strconv.ParseInt(string(f[i+1]), 10, 64)
		if err != nil {
			return machineCPU{}, errors.New("/proc/stat: " + err.Error())
		}
		t[i] = time.Duration(v) * postgres.ClockTick
	}
	return machineCPU{busy: t[0] + t[1] + t[2] + t[5] + t[6], idle: t[3], iowait: t[4], steal: t[7]}, nil
}

func (m machineCPU) sub(o machineCPU) machineCPU {
	return machineCPU{busy: m.busy - o.busy, idle: m.idle - o.idle, iowait: m.iowait - o.iowait, steal: m.steal - o.steal}
}

// pctOf is part as a percentage of the window's whole CPU time.
func (m machineCPU) pctOf(part time.Duration) float64 {
	total := m.busy + m.idle + m.iowait + m.steal
	if total <= 0 {
		return 0
	}
	return 100 * float64(part) / float64(total)
}

// calibrate times two fixed single-threaded jobs before a load: SHA-256 over a buffer that
// stays in a core's cache (how fast a core computes) and dependent reads at random places in
// 64 MB (how long memory takes to answer, past every cache). The same code has run 15–25 %
// slower in some hours with no other process and nothing stolen (2026-11-30): a neighbour on
// the same physical core or memory would show here as a slower job, and carehub not at all.
func calibrate() (hashNsPerKB, readNs float64) {
	buf := make([]byte, 64<<10)
	for i := range buf {
		buf[i] = byte(i)
	}
	const hashes = 2048 // 128 MB
	start := time.Now()
	var sum [32]byte
	for range hashes {
		sum = sha256.Sum256(append(buf[:len(buf)-32], sum[:]...))
	}
	hashNsPerKB = float64(time.Since(start).Nanoseconds()) / (hashes * 64)

	// A single cycle through every slot (Sattolo's shuffle), so each read depends on the last
	// and lands where no prefetcher guesses.
	next := make([]uint32, 16<<20)
	for i := range next {
		next[i] = uint32(i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := len(next) - 1; i > 0; i-- {
		j := rng.IntN(i)
		next[i], next[j] = next[j], next[i]
	}
	const reads = 4 << 20
	start = time.Now()
	p := uint32(0)
	for range reads {
		p = next[p]
	}
	readNs = float64(time.Since(start).Nanoseconds()) / reads
	if p == 1<<31 { // keep the chase from being optimized away
		readNs++
	}
	return hashNsPerKB, readNs
}

// MachineWindow measures the whole machine's CPU from StartMachineWindow to End: what a load
// tool prints beside its figures, so that a reader can tell a quiet run from one whose cores
// other processes or the hypervisor took.
type MachineWindow struct {
	start machineCPU
	err   error
}

// StartMachineWindow starts a window now.
func StartMachineWindow() MachineWindow {
	m, err := readMachineCPU()
	return MachineWindow{start: m, err: err}
}

// End returns the percentages of the window's CPU time that was busy and that the hypervisor
// stole; ok is false where /proc/stat cannot be read.
func (w MachineWindow) End() (busyPct, stealPct float64, ok bool) {
	end, err := readMachineCPU()
	if err != nil || w.err != nil {
		return 0, 0, false
	}
	m := end.sub(w.start)
	return m.pctOf(m.busy), m.pctOf(m.steal), true
}

// MachineCPU is the whole machine's CPU time so far, all cores: busy (every process's and the
// kernel's) and idle (waiting for I/O included). A load tool that drives a node on the same
// machine subtracts what it knows (its own, the node's) from busy to tell the rest: Postgres
// and anything else. Outside Linux it fails.
func MachineCPU() (busy, idle time.Duration, err error) {
	m, err := readMachineCPU()
	return m.busy, m.idle + m.iowait, err
}
