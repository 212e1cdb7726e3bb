package testenv

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// SyntheaDir is where tests/synthea/generate.sh writes its patients (make synthea-deps):
// CAREHUB_SYNTHEA_DIR, or ~/.cache/carehub/synthea.
func SyntheaDir() string {
	if d := os.Getenv("CAREHUB_SYNTHEA_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "carehub", "synthea")
}

// SyntheaBundles returns the Synthea Bundles in SyntheaDir in the order a client loads them: the
// hospital and practitioner batches first (hospitals before practitioners, whose references
// resolve to them), then each patient's transaction, by name. With none there it reports them
// Missing and returns ok false.
func SyntheaBundles(t testing.TB) (providers, patients []string, ok bool) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(SyntheaDir(), "fhir", "*.json"))
	if len(files) == 0 {
		Missing(t, "no Synthea patients in %s: run make synthea-deps (or make test-deps)", SyntheaDir())
		return nil, nil, false
	}
	for _, f := range files {
		if b := filepath.Base(f); strings.HasPrefix(b, "hospitalInformation") || strings.HasPrefix(b, "practitionerInformation") {
			providers = append(providers, f)
		} else {
			patients = append(patients, f)
		}
	}
	slices.SortFunc(providers, func(a, b string) int { return strings.Compare(filepath.Base(a), filepath.Base(b)) })
	slices.Sort(patients)
	return providers, patients, true
}
