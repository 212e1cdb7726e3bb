package graphql

import (
	"strings"

	gqlerrors "github.com/graph-gophers/graphql-go/errors"
	"github.com/vektah/gqlparser/v2/ast"

	"carehub/api/graphql/gqldoc"
)

// Depth limits. Data operations may nest at most MaxDepth fields (DECISIONS §3). The standard
// introspection queries of GraphQL clients (graphql-js getIntrospectionQuery, GraphiQL, the
// spectest query) nest type references 13 to 15 fields deep (__schema › types › fields › args ›
// type › ofType…), so an operation that selects nothing but introspection root fields (__schema,
// __type, __typename) is allowed IntrospectionMaxDepth instead. Introspection resolves from the
// schema in memory, never from the database.
const (
	MaxDepth              = 12
	IntrospectionMaxDepth = 20
)

// This file answers, from the document precheck parsed (gqlparser's AST), two questions that
// graph-gophers does not: is a document introspection only (for the depth limit), and where in
// the document is the field an execution error's path names (graph-gophers fills the path of a
// resolver error but not its locations). Anything they cannot tell gives "no" and "unknown";
// graph-gophers remains the one that decides what a document means.

// maxFragmentDepth bounds how deep fragments are followed inside one another: a cycle, which
// graph-gophers refuses, must not loop here.
const maxFragmentDepth = 10

// introspectionOnly reports whether every operation of doc selects only introspection root
// fields (fragments at the root are followed).
func introspectionOnly(doc *ast.QueryDocument) bool {
	if doc == nil || len(doc.Operations) == 0 {
		return false
	}
	for _, op := range doc.Operations {
		fields := rootFields(doc, op.SelectionSet, 0, nil)
		if len(fields) == 0 {
			return false
		}
		for _, f := range fields {
			if !strings.HasPrefix(f, "__") {
				return false
			}
		}
	}
	return true
}

// rootFields appends the names of the fields set selects, inline fragments and fragment spreads
// expanded, to out; past maxFragmentDepth it appends "" (not introspection).
func rootFields(doc *ast.QueryDocument, set ast.SelectionSet, depth int, out []string) []string {
	if depth > maxFragmentDepth {
		return append(out, "")
	}
	for _, sel := range set {
		switch s := sel.(type) {
		case *ast.Field:
			out = append(out, s.Name)
		case *ast.InlineFragment:
			out = rootFields(doc, s.SelectionSet, depth+1, out)
		case *ast.FragmentSpread:
			if f := doc.Fragments.ForName(s.Name); f != nil {
				out = rootFields(doc, f.SelectionSet, depth+1, out)
			}
		}
	}
	return out
}

// locate returns the location of the field that path names in the operation of doc that
// operationName selects, or nil when it cannot tell.
func locate(doc *ast.QueryDocument, operationName string, path []any) []gqlerrors.Location {
	op := gqldoc.Operation(doc, operationName)
	if op == nil {
		return nil
	}
	set := op.SelectionSet
	var field *ast.Field
	for _, seg := range path {
		key, ok := seg.(string)
		if !ok {
			continue // a list index
		}
		field = find(doc, set, key, 0)
		if field == nil {
			return nil
		}
		set = field.SelectionSet
	}
	if field == nil || field.Position == nil {
		return nil
	}
	return []gqlerrors.Location{{Line: field.Position.Line, Column: field.Position.Column}}
}

// find returns the first field of set whose response key is key, looking into inline fragments
// and fragment spreads.
func find(doc *ast.QueryDocument, set ast.SelectionSet, key string, depth int) *ast.Field {
	if depth > maxFragmentDepth {
		return nil
	}
	for _, sel := range set {
		var f *ast.Field
		switch s := sel.(type) {
		case *ast.Field:
			if s.Alias == key {
				f = s
			}
		case *ast.InlineFragment:
			f = find(doc, s.SelectionSet, key, depth+1)
		case *ast.FragmentSpread:
			if frag := doc.Fragments.ForName(s.Name); frag != nil {
				f = find(doc, frag.SelectionSet, key, depth+1)
			}
		}
		if f != nil {
			return f
		}
	}
	return nil
}
