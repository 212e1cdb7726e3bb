//go:build !linux

package postgres

import (
	"errors"
	"syscall"
	"time"
)

type procState int

const (
	procGone procState = iota
	procPostmaster
	procOther
)

// postmasterState can only ask whether pid exists without /proc: a zombie or reused pid
// then looks like a live postmaster, and the server will refuse to start, as it would.
func postmasterState(pid int, dataDir string) procState {
	if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
		return procPostmaster
	}
	return procGone
}

func postgresProcsIn(dataDir string) []int { return nil }

// CPUTime needs /proc: elsewhere the cluster's CPU time is unknown.
func (l *Local) CPUTime() (time.Duration, error) {
	return 0, errors.New("local postgres: CPU time needs /proc")
}

// attachedProcAttr has no parent-death signal outside Linux: the server outlives a killed
// carehub there and is adopted by the next start.
func attachedProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true}
}
