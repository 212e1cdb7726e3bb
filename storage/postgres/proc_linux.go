package postgres

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type procState int

const (
	procGone       procState = iota // no such process
	procPostmaster                  // a live postgres process working in the data dir
	procOther                       // a zombie, or a live process that is not that postmaster
)

// postmasterState tells what pid, read from dataDir's postmaster.pid, is now. A postgres
// process works in its data dir, which /proc/<pid>/cwd shows; when that is unreadable (not
// our process, not root) it assumes the process is the postmaster, as the server would.
func postmasterState(pid int, dataDir string) procState {
	comm, state, ok := procStat(pid)
	switch {
	case !ok:
		return procGone
	case state == 'Z' || state == 'X' || comm != "postgres":
		return procOther
	}
	cwd, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd")
	if err != nil || sameDir(cwd, dataDir) {
		return procPostmaster
	}
	return procOther
}

// postgresProcsIn lists live postgres processes working in dataDir: a postmaster and its
// backends, or backends orphaned by a postmaster that was killed.
func postgresProcsIn(dataDir string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if comm, state, ok := procStat(pid); !ok || comm != "postgres" || state == 'Z' || state == 'X' {
			continue
		}
		if cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd"); err == nil && sameDir(cwd, dataDir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// procStat returns the command name and state of pid from /proc/<pid>/stat.
func procStat(pid int) (comm string, state byte, ok bool) {
	comm, fields, ok := procStatFields(pid)
	if !ok || len(fields[0]) != 1 {
		return "", 0, false
	}
	return comm, fields[0][0], true
}

// procStatFields returns the command name of pid and the fields of /proc/<pid>/stat after it
// (the name may hold spaces and parentheses): fields[0] is the state, field 3 of proc(5).
func procStatFields(pid int) (comm string, fields []string, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", nil, false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", nil, false
	}
	if fields = strings.Fields(s[end+1:]); len(fields) == 0 {
		return "", nil, false
	}
	return s[open+1 : end], fields, true
}

// CPUTime is the user and system time the cluster has used since its postmaster started: the
// postmaster's own and its reaped children's (exited backends, autovacuum workers), and that of
// the postgres processes alive in the data dir. loadtest divides it by the observations stored.
func (l *Local) CPUTime() (time.Duration, error) {
	postmaster, ok := l.running()
	if !ok {
		return 0, errors.New("local postgres: not running")
	}
	var ticks int64
	for _, pid := range postgresProcsIn(l.dataDir) {
		_, f, ok := procStatFields(pid)
		if !ok || len(f) < 15 { // it has just exited
			continue
		}
		last := 15 // utime, stime: fields 14 and 15 of proc(5), f[11] and f[12]
		if pid == postmaster {
			last = 17 // and cutime, cstime
		}
		for n := 14; n <= last; n++ {
			v, err := strconv.ParseInt(f[n-3], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/stat field %d: %w", pid, n, err)
			}
			ticks += v
		}
	}
	return time.Duration(ticks) * ClockTick, nil
}

func sameDir(a, b string) bool {
	if a == b {
		return true
	}
	rb, err := filepath.EvalSymlinks(b)
	return err == nil && a == rb
}

// attachedProcAttr runs the postmaster in its own process group, so a terminal's Ctrl-C
// reaches carehub (which shuts down in order) and not the server directly, and has the
// kernel send it SIGQUIT (immediate shutdown) when carehub dies. Go sets the parent-death
// signal after switching credentials, which would otherwise clear it.
func attachedProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGQUIT}
}
