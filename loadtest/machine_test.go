package loadtest

import (
	"runtime"
	"testing"
	"time"
)

func TestMachineCPUCountsThisProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/stat is Linux's")
	}
	m0, err := readMachineCPU()
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); { // busy, on one core
	}
	m1, err := readMachineCPU()
	if err != nil {
		t.Fatal(err)
	}
	d := m1.sub(m0)
	if d.busy < 200*time.Millisecond || d.idle < 0 || d.steal < 0 {
		t.Fatalf("300 ms spinning: busy %v, idle %v, steal %v", d.busy, d.idle, d.steal)
	}
	if pct := d.pctOf(d.busy); pct <= 0 || pct > 100 {
		t.Fatalf("busy %.1f %% of the window", pct)
	}
}

func TestCalibrate(t *testing.T) {
	hash, read := calibrate()
	if hash <= 0 || read <= 0 {
		t.Fatalf("hash %v ns/KB, read %v ns", hash, read)
	}
	t.Logf("SHA-256 %.0f ns/KB, a random read in 64 MB %.1f ns", hash, read)
}
