package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMissingHelper is run by TestMissing in a child process; alone it just skips.
func TestMissingHelper(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") == "" {
		t.Skip("run by TestMissing")
	}
	Missing(t, "needs %s", "a tool")
}

// Without RequireEnv a missing tool skips; with it, it fails.
func TestMissing(t *testing.T) {
	for _, tc := range []struct {
		require  string
		wantFail bool
		wantOut  string
	}{
		{"", false, "--- SKIP: TestMissingHelper"},
		{"1", true, "--- FAIL: TestMissingHelper"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissingHelper$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", RequireEnv+"="+tc.require)
		out, err := cmd.CombinedOutput()
		if (err != nil) != tc.wantFail || !strings.Contains(string(out), tc.wantOut) || !strings.Contains(string(out), "needs a tool") {
			t.Errorf("%s=%q: err %v, output:\n%s", RequireEnv, tc.require, err, out)
		}
	}
}
