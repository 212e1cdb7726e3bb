package graphql

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"carehub/api/graphql/gqldoc"
)

func TestIntrospectionOnly(t *testing.T) {
	for doc, want := range map[string]bool{
		`{ __schema { types { name } } }`:                                                           true,
		`query Q { __type(name: "Query") { name } __typename }`:                                     true,
		"query IntrospectionQuery { __schema { ...S } }\nfragment S on __Schema { types { name } }": true,
		`{ t: __schema { types { name } } }`:                                                        true,
		`{ __schema { types { name } } apiVersion }`:                                                false,
		`{ ...F } fragment F on Query { organizations { id } }`:                                     false,
		`{ ... on Query { __schema { types { name } } } }`:                                          true,
		`query($x: Int = 3) { organizations(limit: $x) { id } }`:                                    false,
		`{ __schema { description } } mutation { publishEvent { id } }`:                             false,
		`{ __schema { types { name } `:                                                              false,
		`"""doc""" { __schema { types { name } } }`:                                                 false,
		``: false,
		`{ __schema(x: "}") @skip(if: false) { types { name } } }`:           true,
		`{ ...A } fragment A on Query { ...B } fragment B on Query { ...A }`: false, // a cycle
	} {
		parsed, _ := gqldoc.Parse(doc) // nil when it does not parse: not introspection
		if got := introspectionOnly(parsed); got != want {
			t.Errorf("introspectionOnly(%q) = %v, want %v", doc, got, want)
		}
	}
}

func TestLocate(t *testing.T) {
	doc := "query A { apiVersion }\nquery B($id: ID!) {\n  p: project(id: $id) {\n    ...Fields\n  }\n}\n" +
		"fragment Fields on Project {\n  ... on Project { organization { name } }\n  workflows { runs { id } }\n}"
	parsed, err := gqldoc.Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		op         string
		path       []any
		line, col  int
		unresolved bool
	}{
		{"B", []any{"p"}, 3, 3, false},
		{"B", []any{"p", "organization"}, 8, 20, false},
		{"B", []any{"p", "workflows", 2, "runs"}, 9, 15, false},
		{"A", []any{"apiVersion"}, 1, 11, false},
		{"B", []any{"project"}, 0, 0, true},    // the response key is the alias
		{"", []any{"apiVersion"}, 0, 0, true},  // two operations, none named
		{"C", []any{"apiVersion"}, 0, 0, true}, // no such operation
		{"B", []any{"p", "nope"}, 0, 0, true},
		{"B", nil, 0, 0, true},
	} {
		locs := locate(parsed, tc.op, tc.path)
		if tc.unresolved {
			if locs != nil {
				t.Errorf("%s %v: located %v, want none", tc.op, tc.path, locs)
			}
			continue
		}
		if len(locs) != 1 || locs[0].Line != tc.line || locs[0].Column != tc.col {
			t.Errorf("%s %v: %v, want %d:%d", tc.op, tc.path, locs, tc.line, tc.col)
		}
	}
}

// TestLoaderBatches: concurrent Loads of hinted keys make one fetch, unhinted ones gathered by
// the window make one more, and every caller gets its own value.
func TestLoaderBatches(t *testing.T) {
	var fetches atomic.Int32
	l := newLoader(func(_ context.Context, keys []int) (map[int]int, error) {
		fetches.Add(1)
		m := map[int]int{}
		for _, k := range keys {
			m[k] = k * 10
		}
		return m, nil
	})
	l.wait = 5 * time.Millisecond
	hinted := make([]int, 50)
	for i := range hinted {
		hinted[i] = i
	}
	l.Hint(hinted...)
	var wg sync.WaitGroup
	for i := range 100 { // 50 hinted, 50 not
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := l.Load(context.Background(), i)
			if err != nil || v != i*10 {
				t.Errorf("Load(%d) = %d, %v", i, v, err)
			}
		}()
	}
	wg.Wait()
	if n := fetches.Load(); n < 1 || n > 3 {
		t.Fatalf("%d fetches for 100 keys", n)
	}
	before := fetches.Load()
	if v, _ := l.Load(context.Background(), 7); v != 70 || fetches.Load() != before {
		t.Fatal("a loaded key is fetched again")
	}
}
