package postgres

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open || end+2 >= len(s) {
		return "", 0, false
	}
	return s[open+1 : end], s[end+2], true
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
