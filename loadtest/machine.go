package loadtest

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"time"
)

// machineCPU is the CPU time of the whole machine, all cores, by state: /proc/stat's first line.
// With a run's own CPU (Config.CPU) it tells what else took the cores in that window: other
// processes (busy − ours), or the hypervisor (steal: time a virtual core was ready but another
// guest ran). Both move a run's figures on a shared machine.
type machineCPU struct {
	busy, idle, steal time.Duration
}

// userHZ is the unit of /proc/stat's times (USER_HZ, 100 on every Linux build).
const userHZ = 10 * time.Millisecond

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
		t[i] = time.Duration(v) * userHZ
	}
	return machineCPU{busy: t[0] + t[1] + t[2] + t[5] + t[6], idle: t[3] + t[4], steal: t[7]}, nil
}

func (m machineCPU) sub(o machineCPU) machineCPU {
	return machineCPU{busy: m.busy - o.busy, idle: m.idle - o.idle, steal: m.steal - o.steal}
}

// pctOf is part as a percentage of the window's whole CPU time (busy, idle and steal).
func (m machineCPU) pctOf(part time.Duration) float64 {
	total := m.busy + m.idle + m.steal
	if total <= 0 {
		return 0
	}
	return 100 * float64(part) / float64(total)
}
