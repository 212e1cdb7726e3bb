package graphql

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/parser"

	"carehub/api/graphql/spectest"
)

// patientPage is one alias of the amplification attack of issue 13: a page of 100 patients with
// the newest 100 observations of each.
const patientPage = `patients(limit: 100) { id observations { id code valueQuantity effectiveDateTime } }`

// aliases returns n aliases of selection in one query.
func aliases(n int, selection string) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		fmt.Fprintf(&b, " a%d: %s", i, selection)
	}
	b.WriteString(" }")
	return b.String()
}

func TestCost(t *testing.T) {
	m, err := newCostModel()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, query, operation string
		vars                   map[string]any
		want                   int64
	}{
		{"a leaf", `{ apiVersion }`, "", nil, 1},
		{"__typename", `{ __typename apiVersion }`, "", nil, 2},
		{"explorer's default query: a page of 20 by default", `query Organizations { organizations { id name slug plan } }`, "", nil, 1 + 20*4},
		{"a single lookup; observations default to 100", `{ patient(id: "pat_1") { id name observations { id code valueQuantity effectiveDateTime } } }`, "", nil, 1 + 1 + 1 + 1 + 100*4},
		{"limit multiplies", `{ organizations(limit: 5) { id } }`, "", nil, 1 + 5},
		{"limit out of range counts as 100", `{ organizations(limit: 100000) { id } }`, "", nil, 1 + 100},
		{"limit from a variable", `query($n: Int) { patients(limit: $n) { id } }`, "", map[string]any{"n": float64(7)}, 1 + 7},
		{"limit from a variable's default", `query($n: Int = 3) { patients(limit: $n) { id } }`, "", nil, 1 + 3},
		{"an unset variable is the default limit", `query($n: Int) { patients(limit: $n) { id } }`, "", nil, 1 + 20},
		{"nested limits multiply", `{ patients(limit: 10) { observations(limit: 5) { id } encounters(limit: 2) { id status } } }`, "", nil, 1 + 10*((1+5)+(1+2*2))},
		{"unbounded list: assumed size", `{ organization(id: "o") { projects { id name } } }`, "", nil, 1 + 1 + 20*2},
		{"server-capped lists: their cap", `{ agent(id: "a") { sessions { id } } workflow(id: "w") { runs { id } } }`, "", nil, 2 * (1 + 1 + 100)},
		{"a page object passes its limit to its list", `{ eventHistory(projectId: "p", limit: 50) { events { id type } total nextCursor } }`, "", nil, 1 + (1 + 50*2) + 1 + 1},
		{"a page object's default limit", `{ eventHistory(projectId: "p") { events { id } } }`, "", nil, 1 + (1 + 20)},
		{"a page object's limit does not reach deeper lists", `{ eventHistory(projectId: "p", limit: 5) { events { id } } organization(id: "o") { projects { id } } }`, "", nil, (1 + (1 + 5)) + (1 + 1 + 20)},
		{"event statistics: a day of minutes", `{ eventStats(from: "2020-01-01T00:00:00Z") { key count } }`, "", nil, 1 + 1440*2},
		{"leaf lists count 1", `{ workflow(id: "w") { steps triggers } }`, "", nil, 1 + 2},
		{"aliases count each", aliases(3, `organizations(limit: 2) { id }`), "", nil, 3 * (1 + 2)},
		{"fragments expand where spread", `{ organizations(limit: 2) { ...O } x: organizations(limit: 3) { ...O } } fragment O on Organization { id projects { id } }`,
			"", nil, (1 + 2*(1+1+20)) + (1 + 3*(1+1+20))},
		{"inline fragments expand", `{ organizations(limit: 2) { ... on Organization { id name } ... { slug } } }`, "", nil, 1 + 2*3},
		{"the named operation only", `query A { apiVersion } query B { organizations { id } }`, "B", nil, 1 + 20},
		{"no operation to run costs nothing", `query A { apiVersion } query B { organizations { id } }`, "", nil, 0},
		{"a mutation", `mutation { createWorkflow(name: "w", projectId: "p", steps: ["notify"]) { id runs { id } } }`, "", nil, 1 + 1 + 1 + 100},
		{"a subscription: one event", `subscription { eventStream(projectId: "p") { id type payload } }`, "", nil, 1 + 3},
		{"one page of the attack", "{ " + patientPage + " }", "", nil, 1 + 100*(1+1+100*4)},
		{"the attack: 60 aliases", aliases(60, patientPage), "", nil, 60 * (1 + 100*(1+1+100*4))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := parser.ParseQuery(&ast.Source{Input: tc.query})
			if err != nil {
				t.Fatal(err)
			}
			got, err := m.cost(doc, tc.operation, tc.vars)
			if err != nil || got != tc.want {
				t.Fatalf("cost %d (err %v), want %d", got, err, tc.want)
			}
		})
	}

	t.Run("fragments spreading one another saturate without being walked out", func(t *testing.T) {
		var b strings.Builder
		b.WriteString("{ ...F80 } fragment F0 on Query { organizations(limit: 100) { id } }")
		for i := 1; i <= 80; i++ {
			fmt.Fprintf(&b, " fragment F%d on Query { ...F%d a: apiVersion ...F%d }", i, i-1, i-1)
		}
		doc, err := parser.ParseQuery(&ast.Source{Input: b.String()})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := m.cost(doc, "", nil); err != nil || got != costCap {
			t.Fatalf("cost %d (err %v), want the cap %d", got, err, int64(costCap))
		}
	})

	t.Run("unreadable documents are left to validation", func(t *testing.T) {
		for _, q := range []string{`{ nope { id } }`, `{ ...A } fragment A on Query { ...B } fragment B on Query { ...A }`, `{ ...Missing }`,
			`{ organizations { ... on Nope { id } } }`} {
			doc, err := parser.ParseQuery(&ast.Source{Input: q})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.cost(doc, "", nil); err != errNotCosted {
				t.Errorf("%s: err %v, want errNotCosted", q, err)
			}
		}
	})

	// The introspection lists count with their average length, so the estimate of the full
	// introspection query follows the size of its answer: above it, mostly because every level
	// of the type references (ofType) counts whether the type nests that deep or not.
	t.Run("full introspection: a few times its answer, well within the budget", func(t *testing.T) {
		h, err := New(Services{}, Config{})
		if err != nil {
			t.Fatal(err)
		}
		res := h.Execute(context.Background(), Request{Query: spectest.IntrospectionQuery})
		if len(res.Errors) > 0 {
			t.Fatalf("errors: %+v", res.Errors)
		}
		var answer any
		if err := json.Unmarshal(res.Data, &answer); err != nil {
			t.Fatal(err)
		}
		values := countValues(answer)
		doc, _ := parser.ParseQuery(&ast.Source{Input: spectest.IntrospectionQuery})
		cost, err := m.cost(doc, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("full introspection: cost %d, answer %d values", cost, values)
		if cost < values || cost > values*5 || cost > DefaultMaxCost/4 {
			t.Fatalf("cost %d for an answer of %d values (budget %d)", cost, values, DefaultMaxCost)
		}
	})
}

// countValues counts the fields and list items of a decoded JSON answer, as the cost model does.
func countValues(v any) int64 {
	switch v := v.(type) {
	case map[string]any:
		var n int64
		for _, x := range v {
			n += 1 + countValues(x)
		}
		return n
	case []any:
		var n int64
		for _, x := range v {
			n += countValues(x)
		}
		return n
	}
	return 0
}

// BenchmarkPrecheck measures what the checks before execution add to every request: parsing the
// document (a second time: graph-gophers parses it again to run it), checking its text and
// estimating its cost.
//
//	go test ./api/graphql -run '^$' -bench Precheck
func BenchmarkPrecheck(b *testing.B) {
	h, err := New(Services{}, Config{})
	if err != nil {
		b.Fatal(err)
	}
	for name, req := range map[string]Request{
		"assets query": {Query: `query($t: AssetType, $s: AssetStatus, $r: Float) { assets(type: $t, status: $s, minRating: $r, limit: 20) {
			id name type status rating downloads pricing { type } complianceScore { overall } } }`,
			Variables: map[string]any{"t": "MODEL", "s": "APPROVED", "r": 4.0}},
		"full introspection": {Query: spectest.IntrospectionQuery},
		"the attack":         {Query: aliases(60, patientPage)},
	} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				h.precheck(req)
			}
		})
	}
}
