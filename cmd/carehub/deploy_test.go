package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// deployFiles are the files that configure the binary outside this repository's scripts: the
// image, the Compose deployment and the Helm chart.
var deployFiles = []string{
	"../../Dockerfile",
	"../../deploy/compose/compose*.yaml",
	"../../deploy/helm/carehub/templates/*.yaml",
	"../../deploy/helm/carehub/templates/_helpers.tpl",
	"../../deploy/helm/carehub/ci/*.yaml",
}

// TestDeployFilesNameRealFlags keeps the deployment files honest: every CAREHUB_* variable they
// set is a flag of the command the binary runs there (the environment sets flags as
// CAREHUB_<FLAG>), so a renamed or removed flag fails here, not in a cluster.
func TestDeployFilesNameRealFlags(t *testing.T) {
	flags := map[string]bool{}
	for _, cmd := range []string{"serve", "migrate", "health"} {
		_, stderr, _ := runCLI(t, cmd, "-h")
		for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z0-9-]+)`).FindAllStringSubmatch(stderr, -1) {
			flags[m[1]] = true
		}
	}
	if !flags["roles"] || !flags["database-url"] || !flags["url"] {
		t.Fatalf("could not read the flags from -h: %v", flags)
	}
	envVar := regexp.MustCompile(`\bCAREHUB_[A-Z0-9_]+\b`)
	// Variables the files may name that are not flags: the compose file's own interpolation, and
	// the ONNX Runtime library's path, which the embedded runtime reads itself (docs/MODELS.md).
	notFlags := []string{"CAREHUB_VERSION", "CAREHUB_ONNXRUNTIME_LIB"}
	seen := 0
	for _, pattern := range deployFiles {
		files, err := filepath.Glob(pattern)
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no files (%v)", pattern, err)
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range envVar.FindAllString(string(data), -1) {
				seen++
				if slices.Contains(notFlags, name) {
					continue
				}
				flag := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, "CAREHUB_")), "_", "-")
				if !flags[flag] {
					t.Errorf("%s sets %s, but no command has a --%s flag", f, name, flag)
				}
			}
		}
	}
	if seen < 10 {
		t.Fatalf("only %d CAREHUB_* variables found in the deployment files", seen)
	}
}
