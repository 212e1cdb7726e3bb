package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildCarehub builds the carehub binary into a new temporary directory, for a TestMain whose
// tests run it as a process, and returns its path and a func that removes it. A failed build
// is printed and exits the test binary: no test of the package could run.
func BuildCarehub() (binary string, remove func()) {
	dir, err := os.MkdirTemp("", "carehub-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "carehub")
	if out, err := exec.Command("go", "build", "-o", binary, "carehub/cmd/carehub").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build carehub: %v\n%s", err, out)
		os.Exit(1)
	}
	return binary, func() { _ = os.RemoveAll(dir) }
}
