package gqldoc

import (
	"strings"
	"testing"
)

func TestOperationName(t *testing.T) {
	for _, tc := range []struct{ query, name, want string }{
		{`{ patient(id: "pat_1") { id name } }`, "", "graphql query patient"},
		{`query { patients(limit: 5) { id observations { id } } organizations { id } }`, "", "graphql query organizations,patients"},
		{`query Q($id: ID! = "x") @cached { p: patient(id: $id) { id } q: patient(id: "b") { id } }`, "", "graphql query patient"},
		{`mutation Run { runAgent(agentId: "agt_1", patientId: "pat_1", input: {note: "}{"}) { id } }`, "", "graphql mutation runAgent"},
		{`subscription { eventStream(projectId: "prj_1", types: ["a.b"]) { id } }`, "", "graphql subscription eventStream"},
		{"query A { agents(projectId: \"p\") { id } }\nmutation B { createAgent(name: \"n\", projectId: \"p\") { id } }", "B", "graphql mutation createAgent"},
		{"query A { agents(projectId: \"p\") { id } }\nmutation B { createAgent(name: \"n\", projectId: \"p\") { id } }", "A", "graphql query agents"},
		{`query A { a } query B { b }`, "", Unparsed},
		{`query A { a }`, "C", Unparsed},
		{`query A { a }`, "A", "graphql query a"},
		{`{ ...Root ... on Query { patients { id } } } fragment Root on Query { organization(id: "o") { id } ...More } fragment More on Query { __typename events(projectId: "p") { id } }`, "", "graphql query events,organization,patients"},
		{`{ ...A } fragment A on Query { a ...B } fragment B on Query { b ...A }`, "", "graphql query a,b"}, // a cycle
		{`{ ...Missing b }`, "", "graphql query b"},
		{`{ __typename }`, "", "graphql query __typename"},
		{`{ __schema { types { name } } }`, "", "graphql query __schema"},
		{`fragment F on Query { a }`, "", Unparsed},
	} {
		doc, err := Parse(tc.query)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tc.query, err)
		}
		if got := OperationName(doc, tc.name); got != tc.want {
			t.Errorf("OperationName(%q, %q) = %q, want %q", tc.query, tc.name, got, tc.want)
		}
	}
	if got := OperationName(nil, ""); got != Unparsed {
		t.Errorf("OperationName(nil) = %q", got)
	}
	var b strings.Builder
	b.WriteString("{")
	for i := range 200 {
		b.WriteString(" field" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26)))
	}
	b.WriteString(" }")
	doc, err := Parse(b.String())
	if err != nil {
		t.Fatal(err)
	}
	if got := OperationName(doc, ""); len(got) != MaxOperationLen || !strings.HasPrefix(got, "graphql query field") {
		t.Errorf("a long name: %d bytes, %q", len(got), got)
	}
}

// TestParse: a short document is parsed once and shared; a long one, or one that does not parse,
// is not kept; nesting is bounded (the parser's limit), not a stack overflow.
func TestParse(t *testing.T) {
	q := `query Cached { organizations { id } }`
	a, err := Parse(q)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := Parse(q); b != a {
		t.Error("a short document was parsed again")
	}
	long := "{ a " + strings.Repeat(" ", maxCachedDoc) + "}"
	if a, _ := Parse(long); a == nil {
		t.Fatal("a long document did not parse")
	} else if b, _ := Parse(long); b == a {
		t.Error("a long document was kept")
	}
	for _, bad := range []string{`{ a `, `not graphql`, `"""doc""" { a }`, "{" + strings.Repeat("a{", 100_000) + "b" + strings.Repeat("}", 100_001)} {
		if doc, err := Parse(bad); err == nil || doc != nil {
			t.Errorf("Parse(%.40q) = %v, %v; want an error", bad, doc, err)
		}
	}
	if doc, err := Parse(""); err != nil || OperationName(doc, "") != Unparsed {
		t.Errorf("an empty document: %v, %v", doc, err)
	}
}
