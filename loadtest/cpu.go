package loadtest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPU time spent by a -self run's two halves: this process (the devices, intake, the embedded
// broker, the writer) and the local Postgres cluster. Divided by the observations stored it is
// the pipeline's cost per observation, which moves less than the rates do on a shared machine
// (docs/PERFORMANCE.md: about 4 % against a fifth). It reads /proc: on another Unix the run
// reports no CPU (the first read fails), and a run against a remote node never asks.

// clockTick is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on every Linux build).
const clockTick = 10 * time.Millisecond

// processCPU is the user and system time this process has used.
func processCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// postgresCPU is the user and system time the cluster of dataDir has used since it started: the
// postmaster's own and its reaped children's (cutime, cstime), and that of the children alive
// (backends, checkpointer, WAL writer, …), found by their parent in /proc.
func postgresCPU(dataDir string) (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	postmaster, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid: %w", err)
	}
	ticks, err := statTicks(postmaster, true)
	if err != nil {
		return 0, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == postmaster {
			continue
		}
		if parent, err := statParent(pid); err == nil && parent == postmaster {
			if t, err := statTicks(pid, false); err == nil { // it may have just exited
				ticks += t
			}
		}
	}
	return time.Duration(ticks) * clockTick, nil
}

// statFields are the fields of /proc/<pid>/stat after the command name (which may hold
// spaces): fields[0] is the state, field 3 of proc(5), so field n is fields[n-3].
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	return f, nil
}

func statParent(pid int) (int, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(f[4-3])
}

// statTicks is utime + stime of pid (fields 14 and 15), with its reaped children's (16 and 17).
func statTicks(pid int, children bool) (int64, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	last := 15
	if children {
		last = 17
	}
	var sum int64
	for n := 14; n <= last; n++ {
		v, err := strconv.ParseInt(f[n-3], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat field %d: %w", pid, n, err)
		}
		sum += v
	}
	return sum, nil
}

// CPUMeter reads the CPU time of a -self run's two halves.
type CPUMeter struct {
	PostgresDataDir string
}

// Read returns the CPU time used so far by this process and by the Postgres cluster.
func (m CPUMeter) Read() (process, postgres time.Duration, err error) {
	if process, err = processCPU(); err != nil {
		return 0, 0, err
	}
	if postgres, err = postgresCPU(m.PostgresDataDir); err != nil {
		return 0, 0, err
	}
	return process, postgres, nil
}
