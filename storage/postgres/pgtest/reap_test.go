package pgtest

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

func TestReapAbandoned(t *testing.T) {
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	owners := map[string]int{"abandoned": exited.Process.Pid, "live": os.Getpid()}
	dirs := map[string]string{}
	for name, pid := range owners {
		dir, err := os.MkdirTemp(bases[1], dirPrefix)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			t.Fatal(err)
		}
		dirs[name] = dir
	}
	reapAbandoned(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if _, err := os.Stat(dirs["abandoned"]); !os.IsNotExist(err) {
		t.Errorf("directory of a dead test binary kept: %v", err)
	}
	if _, err := os.Stat(dirs["live"]); err != nil {
		t.Errorf("directory of a running test binary removed: %v", err)
	}
}

func TestDatabaseName(t *testing.T) {
	tests := []struct{ test, prefix string }{
		{"TestX", "test_testx_"},
		{"TestY/sub case#01", "test_testy_sub_case_01_"},
		{"TestAVeryLongNameThatGoesOnAndOnAndOnForeverAndEver/more", "test_testaverylongnamethatgoesonandonandonfor_"},
	}
	for _, tt := range tests {
		got := databaseName(tt.test)
		if len(got) > 63 || len(got) != len(tt.prefix)+12 || got[:len(tt.prefix)] != tt.prefix {
			t.Errorf("databaseName(%q) = %q, want %s + 12 hex digits, at most 63 bytes", tt.test, got, tt.prefix)
		}
	}
}
