package explorer

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The committed bundle (dist/) and the stand-in schema (testdata/introspection.json) are
// generated from web/. These tests regenerate both and fail when the committed files differ, so a
// change to web/ without a rebuild (or a hand edit of dist/) cannot merge. They need node and
// web/node_modules (make node-deps); without them they skip, unless CAREHUB_REQUIRE_GENERATORS is
// set (make lint sets it), where a missing generator is a failure.

// generator returns the node binary, or skips (fails under CAREHUB_REQUIRE_GENERATORS).
func generator(t *testing.T) string {
	t.Helper()
	missing := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CAREHUB_REQUIRE_GENERATORS") != "" {
			t.Fatalf(format, args...)
		}
		t.Skipf(format, args...)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("drift check needs node on PATH: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e2eWebDir, "node_modules", "esbuild")); err != nil {
		missing("drift check needs web/node_modules (make node-deps): %v", err)
	}
	return node
}

func TestBundleDrift(t *testing.T) {
	node := generator(t)
	out := t.TempDir()
	cmd := exec.Command(node, "build.mjs")
	cmd.Dir = e2eWebDir
	cmd.Env = append(os.Environ(), "EXPLORER_DIST="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("node build.mjs: %v\n%s", err, b)
	}
	for name := range contentTypes {
		built, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(built, embedded(t, name)) {
			t.Errorf("dist/%s differs from a fresh build of web/: run make explorer and commit dist/", name)
		}
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(contentTypes) {
		t.Errorf("the build wrote %d files, the handler serves %d: update contentTypes", len(entries), len(contentTypes))
	}
}

func TestIntrospectionDrift(t *testing.T) {
	node := generator(t)
	cmd := exec.Command(node, "introspection.mjs")
	cmd.Dir = e2eWebDir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	got, err := cmd.Output()
	if err != nil {
		t.Fatalf("node introspection.mjs: %v\n%s", err, stderr.Bytes())
	}
	want, err := os.ReadFile(filepath.Join("testdata", "introspection.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("testdata/introspection.json differs from web/introspection.mjs: " +
			"run (cd web && node introspection.mjs > ../testdata/introspection.json)")
	}
}
