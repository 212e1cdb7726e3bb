package sealing

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestLoadOrCreate: the embedded default's key is made once, private to its owner, and read
// back the same on the next start.
func TestLoadOrCreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data", "sealing.key")
	k1, err := LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, want 0600", fi.Mode().Perm())
	}
	k2, err := LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(k1.raw, k2.raw) {
		t.Fatal("the second start read another key")
	}
	if bytes.Equal(k1.raw, Random().raw) {
		t.Fatal("two random keys are equal")
	}
}

// TestLoadRefusesWhatIsNotAKey: a short or malformed file is an error, not a weak key.
func TestLoadRefusesWhatIsNotAKey(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"short": "c2hvcnQ=\n", "not base64": "not a key!\n"} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(path); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	if _, err := Load(filepath.Join(dir, "absent")); err == nil {
		t.Error("absent file: loaded")
	}
}
