// Package gqldoc reads GraphQL request documents for both the GraphQL handler (api/graphql) and
// the audit log (api/auth), which imports it without importing api/graphql: the one parse of a
// request's document, with gqlparser (Parse), and the operation name the audit log records,
// read from that parse (OperationName). graph-gophers/graphql-go, which executes the document,
// parses it on its own.
package gqldoc

import (
	"slices"
	"strings"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/parser"
)

// Parse parses a query document with gqlparser; nil and the parser's error when it does not
// parse. The document returned is shared with the other callers that send the same text and must
// not be modified.
//
// Documents of at most maxCachedDoc bytes are remembered (the cacheSize parsed last): a client
// sends the same few documents again and again, with other variables, and a request whose
// document is read before the GraphQL handler runs (the idempotency middleware's mutation test)
// then does not parse it twice. Failures are not remembered.
func Parse(query string) (*ast.QueryDocument, error) {
	cache := len(query) <= maxCachedDoc
	if cache {
		if doc, ok := docs.Get(query); ok {
			return doc, nil
		}
	}
	doc, err := parser.ParseQuery(&ast.Source{Input: query})
	if err != nil {
		return nil, err
	}
	if cache {
		docs.Add(query, doc)
	}
	return doc, nil
}

// cacheSize and maxCachedDoc bound what Parse remembers, so that it stays small whatever
// clients send.
const (
	cacheSize    = 512
	maxCachedDoc = 4 << 10
)

var docs = func() *lru.Cache[string, *ast.QueryDocument] {
	c, err := lru.New[string, *ast.QueryDocument](cacheSize)
	if err != nil {
		panic(err) // only for a size ≤ 0
	}
	return c
}()

// Unparsed names a GraphQL call whose document could not be read, or whose operation could not
// be chosen.
const Unparsed = "graphql unparsed"

// MaxOperationLen bounds an operation name (the operation string of an audit record).
const MaxOperationLen = 512

// Operation returns the operation of doc that a request naming operationName runs: the one of
// that name, or the document's only operation when operationName is empty; nil when there is
// none.
func Operation(doc *ast.QueryDocument, operationName string) *ast.OperationDefinition {
	switch {
	case doc == nil:
		return nil
	case operationName != "":
		return doc.Operations.ForName(operationName)
	case len(doc.Operations) == 1:
		return doc.Operations[0]
	}
	return nil
}

// OperationName names a GraphQL request for the audit log: "graphql <type> <root fields>", the
// operation type (query, mutation, subscription) and the distinct root field names, sorted and
// comma-joined, aliases resolved and fragments at the root expanded: "graphql query patient",
// "graphql mutation runAgent", "graphql query organizations,patients". __typename counts only
// when it is the only root field. operationName selects among several operations as GraphQL
// does; when no operation can be chosen (or doc is nil: it could not be parsed) the request is
// Unparsed. Validating the document is the GraphQL handler's job, not this one's.
func OperationName(doc *ast.QueryDocument, operationName string) string {
	op := Operation(doc, operationName)
	if op == nil {
		return Unparsed
	}
	fields := map[string]bool{}
	collect(doc, op.SelectionSet, fields, map[string]bool{})
	delete(fields, "__typename")
	names := make([]string, 0, len(fields))
	for f := range fields {
		names = append(names, f)
	}
	if len(names) == 0 {
		names = append(names, "__typename")
	}
	slices.Sort(names)
	name := "graphql " + string(op.Operation) + " " + strings.Join(names, ",")
	if len(name) > MaxOperationLen {
		name = name[:MaxOperationLen]
	}
	return name
}

// collect adds the names of the fields of set, of its inline fragments and of the fragments it
// spreads (each once; an undefined one adds nothing) to out.
func collect(doc *ast.QueryDocument, set ast.SelectionSet, out, seen map[string]bool) {
	for _, sel := range set {
		switch s := sel.(type) {
		case *ast.Field:
			out[s.Name] = true
		case *ast.InlineFragment:
			collect(doc, s.SelectionSet, out, seen)
		case *ast.FragmentSpread:
			if seen[s.Name] {
				continue
			}
			seen[s.Name] = true
			if f := doc.Fragments.ForName(s.Name); f != nil {
				collect(doc, f.SelectionSet, out, seen)
			}
		}
	}
}
