// Package docstest holds the repository's documentation to the repository: README.md and
// docs/*.md link only files that exist inside it, and docs/LIMITS.md states the limits the code
// runs with.
package docstest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// root is the repository's top directory, relative to this package.
const root = "../.."

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestLinksResolveInsideTheRepository checks every relative link of README.md and docs/*.md: it
// names a file or directory that exists, inside the repository (a clone has no ../shared).
func TestLinksResolveInsideTheRepository(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		files = append(files, filepath.Join("docs", filepath.Base(d)))
	}
	top, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, f := range files {
		text := read(t, f)
		if strings.Contains(text, "../shared") || strings.Contains(text, "/work/") {
			t.Errorf("%s names a path outside the repository", f)
		}
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			abs := filepath.Clean(filepath.Join(top, filepath.Dir(f), target))
			if rel, err := filepath.Rel(top, abs); err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("%s links %s, outside the repository", f, m[1])
				continue
			}
			if _, err := os.Stat(abs); err != nil {
				t.Errorf("%s links %s: %v", f, m[1], err)
			}
		}
	}
}

// TestREADMELinksTheDocs: a newcomer reaches every page of docs/ from README.md.
func TestREADMELinksTheDocs(t *testing.T) {
	readme := read(t, "README.md")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		want := "](docs/" + filepath.Base(d) + ")"
		if !strings.Contains(readme, want) {
			t.Errorf("README.md does not link docs/%s", filepath.Base(d))
		}
	}
}
