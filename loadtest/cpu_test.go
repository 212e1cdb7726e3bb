package loadtest

import (
	"os"
	"testing"
)

// TestStatOfThisProcess reads this process's /proc/<pid>/stat as postgresCPU reads the
// cluster's: the parent it names is the one the kernel reports, and the CPU time it counts
// (including reaped children) is a number of ticks.
func TestStatOfThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	if parent, err := statParent(os.Getpid()); err != nil || parent != os.Getppid() {
		t.Fatalf("parent %d, %v; want %d", parent, err, os.Getppid())
	}
	own, err := statTicks(os.Getpid(), false)
	if err != nil || own < 0 {
		t.Fatalf("ticks %d, %v", own, err)
	}
	if all, err := statTicks(os.Getpid(), true); err != nil || all < own {
		t.Fatalf("with children %d (%v), own %d", all, err, own)
	}
	if _, err := postgresCPU(t.TempDir()); err == nil {
		t.Fatal("a directory without postmaster.pid gave a CPU time")
	}
}
