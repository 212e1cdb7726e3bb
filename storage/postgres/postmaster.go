package postgres

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clearStale makes sure a postmaster.pid left by a crash cannot stop the server from
// starting, and returns the pid file when it names a live postmaster of this data dir.
//
// The server handles a pid file whose process is gone by itself, after checking that no
// orphaned backend still uses the old shared memory. It cannot tell a zombie (the killed
// postmaster, not reaped because our PID 1 does not reap) or a reused pid from a live
// postmaster, and refuses to start; those are the cases handled here.
func (l *Local) clearStale(ctx context.Context) (*pidFile, error) {
	pidPath := filepath.Join(l.dataDir, "postmaster.pid")
	pf, err := readPidFile(pidPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	state := procGone
	if err == nil {
		state = postmasterState(pf.pid, l.dataDir)
		if state == procPostmaster {
			return pf, nil
		}
	}
	// Backends notice their postmaster's death within moments; give them time before
	// touching a lock that protects their shared memory.
	deadline := time.Now().Add(15 * time.Second)
	for {
		orphans := postgresProcsIn(l.dataDir)
		if len(orphans) == 0 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("postgres processes %v still use %s though their postmaster is gone: wait for them to exit or kill them", orphans, l.dataDir)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if state == procGone && err == nil {
		return nil, nil
	}
	l.logger.Warn("local postgres: removing stale lock files of a postmaster that is gone", "pid", pidOf(pf), "data_dir", l.dataDir)
	for _, p := range []string{pidPath, filepath.Join(l.sockDir, socketName+".lock")} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	return nil, nil
}

func pidOf(pf *pidFile) int {
	if pf == nil {
		return 0
	}
	return pf.pid
}

// running reports the pid of a live postmaster on the data dir, if any.
func (l *Local) running() (int, bool) {
	pf, err := readPidFile(filepath.Join(l.dataDir, "postmaster.pid"))
	if err != nil || postmasterState(pf.pid, l.dataDir) != procPostmaster {
		return 0, false
	}
	return pf.pid, true
}

// waitReady polls postmaster.pid until the server reports "ready", as pg_ctl -w does.
// exited, when not nil, closes if the server exits first.
func waitReady(ctx context.Context, dataDir string, exited <-chan struct{}) error {
	deadline := time.Now().Add(defaultWait)
	if d, ok := ctx.Deadline(); ok {
		deadline = d
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		pf, err := readPidFile(filepath.Join(dataDir, "postmaster.pid"))
		if err == nil {
			if pf.status == "ready" {
				return nil
			}
			if exited == nil && postmasterState(pf.pid, dataDir) != procPostmaster {
				return fmt.Errorf("postmaster %d exited before it was ready", pf.pid)
			}
		} else if exited == nil && errors.Is(err, fs.ErrNotExist) {
			return errors.New("postmaster exited before it was ready")
		}
		if time.Now().After(deadline) {
			return errors.New("postgres did not become ready in time")
		}
		select {
		case <-exited:
			return errors.New("postgres exited before it was ready")
		case <-ctx.Done():
			return fmt.Errorf("wait for postgres: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// pidFile is what postmaster.pid says: pid, data dir, start time, port, first socket
// directory, listen address, shared memory key, status.
type pidFile struct {
	pid       int
	socketDir string
	status    string
}

func readPidFile(path string) (*pidFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil || pid <= 0 {
		return nil, fmt.Errorf("%s: bad pid %q", path, lines[0])
	}
	pf := &pidFile{pid: pid}
	if len(lines) > 4 {
		pf.socketDir = strings.TrimSpace(lines[4])
	}
	if len(lines) > 7 {
		pf.status = strings.TrimSpace(lines[7])
	}
	return pf, nil
}
