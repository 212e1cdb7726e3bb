package writeback_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"carehub/storage/writeback"
)

// TestRound: a round asks for the files written since, in subdirectories too, opened read-only
// as the pacer opens a Postgres cluster's files it does not own, and passes over older files
// and links.
func TestRound(t *testing.T) {
	root := t.TempDir()
	write := func(name string, age time.Duration) string {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, make([]byte, 1<<20), 0o400); err != nil {
			t.Fatal(err)
		}
		if age > 0 {
			old := time.Now().Add(-age)
			if err := os.Chtimes(path, old, old); err != nil {
				t.Fatal(err)
			}
		}
		return path
	}
	write("base/1/16384", 0)
	write("base/5/16390", 0)
	write("base/1/1259", time.Hour)
	recent := write("kafka/0.dat", 0)
	if err := os.Symlink(recent, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	n, err := writeback.Round(root, time.Now().Add(-time.Minute))
	if err != nil {
		t.Fatalf("Round: %v", err)
	}
	if want := 3; n != want {
		t.Fatalf("Round asked for %d files, want %d (the three written since, not the old one or the link)", n, want)
	}
	if n, err := writeback.Round(filepath.Join(root, "missing"), time.Time{}); n != 0 || err == nil {
		t.Fatalf("Round of a missing dir = %d, %v; want 0 and an error", n, err)
	}
}

// TestPacerStops: Stop ends the pacer's goroutine and may be called again.
func TestPacerStops(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := writeback.Start(root, time.Millisecond, slog.New(slog.DiscardHandler))
	time.Sleep(20 * time.Millisecond) // a few rounds
	p.Stop()
	p.Stop()
}
