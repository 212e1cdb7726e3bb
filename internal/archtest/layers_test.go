// Package archtest holds the tests of the code's shape: the layer order of docs/ARCHITECTURE.md
// ("Layers"), which every import of every Go file of the module must follow.
package archtest

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "carehub"

// layers, bottom first: a package imports its own layer and those below, never one above. The
// longest prefix names a directory's layer.
var layers = [][]string{
	{"kernel/", "schemas/", "models/", "internal/testenv/"}, // 0: the vocabulary every layer shares, the shipped models
	{"storage/"},               // 1: stores, brokers, the outbox, idempotency
	{"ingest/", "processors/"}, // 2: the services
	{"api/"},                   // 3: the transports
	{"cmd/"},                   // 4: the composition root
	{"e2e/", "loadtest/", "internal/", "tests/", "deploy/"}, // 5: whole-node suites, benchmarks, tooling
}

// siblings are layers whose groups must not import each other outside tests: the observation
// intake and the processors meet only through Kafka topics and the stores.
var siblings = map[string]bool{"ingest/": true, "processors/": true}

// harnesses are the whole-node test harnesses: any package's tests may drive the node through
// them, black-box, from beside the code they test.
var harnesses = map[string]bool{"e2e/servertest/": true, "api/ws/wstest/": true}

// drivers are the store and broker clients that only stores (layer 1), the services (layer 2)
// and the composition root use: the kernel holds types and rules, and the transports call
// services, so whatever runs SQL or talks to a broker is a store.
var drivers = []string{"github.com/jackc/pgx", "github.com/twmb/franz-go", "github.com/ClickHouse/clickhouse-go"}

// driverFree are the layers whose non-test code uses no driver: the kernel and the transports.
var driverFree = map[int]string{0: "the kernel uses no store or broker client", 3: "a transport runs no SQL and talks to no broker: stores live under storage/"}

// group returns the prefix that places dir (slash-terminated, relative to the module root) and
// its layer, or -1 when no layer holds it.
func group(dir string) (string, int) {
	best, layer := "", -1
	for i, prefixes := range layers {
		for _, p := range prefixes {
			if strings.HasPrefix(dir, p) && len(p) > len(best) {
				best, layer = p, i
			}
		}
	}
	return best, layer
}

// violation says why a file in dir may not import path, or "" when it may.
func violation(dir, path string, test bool) string {
	from, fromLayer := group(dir)
	if fromLayer < 0 {
		return "its directory is in no layer (add it to archtest's layers and docs/ARCHITECTURE.md)"
	}
	if !strings.HasPrefix(path, module+"/") {
		if why, ok := driverFree[fromLayer]; ok && !test {
			for _, d := range drivers {
				if strings.HasPrefix(path, d) {
					return why
				}
			}
		}
		return ""
	}
	target := strings.TrimPrefix(path, module+"/") + "/"
	if test && harnesses[target] {
		return ""
	}
	to, toLayer := group(target)
	switch {
	case toLayer < 0:
		return "it is in no layer"
	case toLayer > fromLayer:
		return "it is in a higher layer (" + to + " over " + from + ")"
	case !test && toLayer == fromLayer && from != to && siblings[from] && siblings[to]:
		return from + " and " + to + " meet only through topics and stores"
	}
	return ""
}

// TestLayers: every import of every Go file follows the layer order.
func TestLayers(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "bin" || name == "target") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(rel)) + "/"
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if why := violation(dir, p, strings.HasSuffix(rel, "_test.go")); why != "" {
				t.Errorf("%s imports %s: %s", rel, p, why)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLayerRule: the rule refuses the wrong-way imports it exists for (issue 53's) and allows
// the right ones, so TestLayers passing means something.
func TestLayerRule(t *testing.T) {
	for _, tc := range []struct {
		dir, path string
		test      bool
		ok        bool
	}{
		{"kernel/events/", "carehub/storage", false, false},
		{"kernel/events/", "carehub/storage/outbox", false, false},
		{"kernel/phi/", "github.com/jackc/pgx/v5/pgxpool", false, false},
		{"api/auth/", "github.com/jackc/pgx/v5", false, false},
		{"api/rest/", "github.com/twmb/franz-go/pkg/kgo", false, false},
		{"api/auth/", "github.com/jackc/pgx/v5", true, true},
		{"storage/postgres/", "github.com/jackc/pgx/v5", false, true},
		{"ingest/intake/", "carehub/processors/idempotency", false, false},
		{"api/server/servertest/", "carehub/cmd/carehub/node", false, false},
		{"storage/postgres/", "carehub/api/auth", false, false},
		{"processors/feed/", "carehub/api/rest", true, false},
		{"kernel/events/", "carehub/kernel/ids", false, true},
		{"storage/outbox/", "carehub/kernel/events", false, true},
		{"processors/feed/", "carehub/storage/outbox", false, true},
		{"api/rest/", "carehub/e2e/servertest", true, true},
		{"ingest/intake/", "carehub/processors/observations", true, true},
		{"e2e/servertest/", "carehub/cmd/carehub/node", false, true},
		{"cmd/carehub/node/", "carehub/api/server", false, true},
	} {
		if got := violation(tc.dir, tc.path, tc.test) == ""; got != tc.ok {
			t.Errorf("%s importing %s (test %v): allowed %v, want %v", tc.dir, tc.path, tc.test, got, tc.ok)
		}
	}
	if _, err := os.Stat(filepath.Join("..", "..", "go.mod")); err != nil {
		t.Fatalf("the module root is not two levels up: %v", err)
	}
}
