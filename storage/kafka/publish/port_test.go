package publish_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestOnlyThePortProduces: no non-test Go file of the module outside this package calls
// franz-go's Produce, ProduceSync or TryProduce (loadtest, a harness of its own, aside). A new
// way of producing is a route here, with the conformance suite behind it.
func TestOnlyThePortProduces(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	port := filepath.Join(root, "storage", "kafka", "publish")
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (path == port || path == filepath.Join(root, "loadtest") || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
					switch sel.Sel.Name {
					case "Produce", "ProduceSync", "TryProduce":
						rel, _ := filepath.Rel(root, fset.Position(call.Pos()).Filename)
						t.Errorf("%s:%d: .%s( outside storage/kafka/publish: produce through one of its routes", rel, fset.Position(call.Pos()).Line, sel.Sel.Name)
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
