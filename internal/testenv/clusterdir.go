package testenv

import (
	"os"
	"testing"
)

// ClusterDir returns a fresh directory under /tmp for a Postgres cluster a test starts, removed
// when the test ends: reachable by user postgres with its subdirectories (t.TempDir's parents
// are 0700, and the server runs as postgres when tests run as root) and short enough for a
// socket path.
func ClusterDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "carehub-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil { // MkdirTemp's 0700 would close subdirs to postgres
		t.Fatal(err)
	}
	return dir
}
