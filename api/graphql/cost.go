package graphql

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/vektah/gqlparser/v2"
	"github.com/vektah/gqlparser/v2/ast"

	"carehub/schemas"
)

// The cost of an operation (DECISIONS §3) estimates how many values its answer can hold, before
// anything runs:
//
//   - every field selected counts 1, aliases and repeated selections each on their own, fragments
//     and inline fragments expanded where they are spread (directives such as @skip are ignored);
//   - a field that returns a list of objects multiplies the cost of its selection by the list's
//     size: the limit argument when given (a literal or a variable; out-of-range values, which
//     the field refuses, count as at most MaxLimit), else the field's default limit (DefaultLimit,
//     or nestedFHIRDefault for FHIRPatient.observations and encounters), else the size the server
//     caps the list at (Agent.sessions, Workflow.runs), else assumedListSize;
//   - a page object (a field returning one object that takes a limit, such as
//     Query.eventHistory) passes its limit, as above, to the lists it holds that take none
//     (EventHistoryPage.events);
//   - introspection lists (__Schema.types, __Type.fields, __Field.args…) count with their average
//     length in this schema, so the full introspection query costs about as many values as its
//     answer holds;
//   - a list of scalars counts 1, like any other leaf.
//
// An operation costing more than the budget (Config.MaxCost, DefaultMaxCost) is refused with
// BAD_USER_INPUT naming both numbers, before any resolver runs.
//
// Figures for DefaultMaxCost: the explorer's default query costs 81, the full introspection
// query of graphql-js about 20 000 (its answer holds about 4 700 values: every ofType level counts
// whether a type nests that deep or not), a page of 100 patients with their newest 100
// observations (4 fields each) 40 201, and 60 aliases of that page — the amplification attack of
// issue 13, a 155 MB answer — 2 412 060.
const (
	DefaultMaxCost  = 100_000
	assumedListSize = 20 // lists without a limit argument whose length the server does not cap
	costCap         = math.MaxInt64 / 4
	// statsRows is what an eventStats answer counts as: its length depends on the data (buckets ×
	// groups, up to 10,080 buckets), so it counts as a day of minutes, or a month of hours for
	// a handful of groups; the store bounds the work, not this estimate.
	statsRows = 1_440
)

// costModel holds what the estimate needs of the schema.
type costModel struct {
	schema       *ast.Schema
	limitDefault map[string]int64 // "Type.field" → its limit's default when not DefaultLimit
	sizes        map[string]int64 // "Type.field" → size of a list without a limit argument
}

func newCostModel() (*costModel, error) {
	s, err := gqlparser.LoadSchema(&ast.Source{Name: "schema.graphql", Input: schemas.GraphQL})
	if err != nil {
		return nil, fmt.Errorf("graphql cost model: %w", err)
	}
	m := &costModel{schema: s,
		limitDefault: map[string]int64{"FHIRPatient.observations": nestedFHIRDefault, "FHIRPatient.encounters": nestedFHIRDefault},
		sizes: map[string]int64{"Agent.sessions": nestedSessions, "Workflow.runs": nestedRuns,
			"Query.eventStats": statsRows},
	}
	var fields, args, inputFields, enumValues, interfaces, possible, dirArgs int
	for _, t := range s.Types {
		if t.Kind == ast.InputObject {
			inputFields += len(t.Fields)
		} else {
			fields += len(t.Fields)
			for _, f := range t.Fields {
				args += len(f.Arguments)
			}
		}
		enumValues += len(t.EnumValues)
		interfaces += len(t.Interfaces)
		possible += len(t.Types)
	}
	for _, d := range s.Directives {
		dirArgs += len(d.Arguments)
	}
	types := len(s.Types)
	for key, n := range map[string][2]int{
		"__Schema.types": {types, 1}, "__Schema.directives": {len(s.Directives), 1},
		"__Type.fields": {fields, types}, "__Type.inputFields": {inputFields, types}, "__Type.enumValues": {enumValues, types},
		"__Type.interfaces": {interfaces, types}, "__Type.possibleTypes": {possible, types},
		"__Field.args": {args, fields}, "__Directive.args": {dirArgs, len(s.Directives)},
	} {
		m.sizes[key] = max(1, int64(math.Ceil(float64(n[0])/float64(max(1, n[1])))))
	}
	return m, nil
}

// errNotCosted says the document could not be read for its cost (an unknown field or type, a
// fragment cycle): graph-gophers' validation is left to say what is wrong.
var errNotCosted = errors.New("the document could not be analysed")

// cost returns the cost of the operation graph-gophers will run for operationName; 0 when it
// will run none (it then answers why).
func (m *costModel) cost(doc *ast.QueryDocument, operationName string, vars map[string]any) (int64, error) {
	var op *ast.OperationDefinition
	switch {
	case operationName != "":
		op = doc.Operations.ForName(operationName)
	case len(doc.Operations) == 1:
		op = doc.Operations[0]
	}
	if op == nil {
		return 0, nil
	}
	root := map[ast.Operation]*ast.Definition{ast.Query: m.schema.Query, ast.Mutation: m.schema.Mutation,
		ast.Subscription: m.schema.Subscription}[op.Operation]
	c := &coster{m: m, doc: doc, op: op, vars: vars, fragments: map[string]int64{}}
	return c.set(root, op.SelectionSet)
}

type coster struct {
	m         *costModel
	doc       *ast.QueryDocument
	op        *ast.OperationDefinition
	vars      map[string]any
	fragments map[string]int64 // cost of each fragment's selection set; -1 while being costed
	page      int64            // the enclosing page object's limit, for its lists without one; 0 = none
}

func (c *coster) set(parent *ast.Definition, set ast.SelectionSet) (int64, error) {
	if parent == nil {
		return 0, errNotCosted
	}
	var total int64
	for _, sel := range set {
		var n int64
		var err error
		switch s := sel.(type) {
		case *ast.Field:
			n, err = c.field(parent, s)
		case *ast.InlineFragment:
			t := parent
			if s.TypeCondition != "" {
				t = c.m.schema.Types[s.TypeCondition]
			}
			n, err = c.set(t, s.SelectionSet)
		case *ast.FragmentSpread:
			n, err = c.fragment(s.Name)
		}
		if err != nil {
			return 0, err
		}
		total = add(total, n)
	}
	return total, nil
}

func (c *coster) fragment(name string) (int64, error) {
	if n, ok := c.fragments[name]; ok {
		if n < 0 {
			return 0, errNotCosted // a cycle
		}
		return n, nil
	}
	f := c.doc.Fragments.ForName(name)
	if f == nil {
		return 0, errNotCosted
	}
	c.fragments[name] = -1
	n, err := c.set(c.m.schema.Types[f.TypeCondition], f.SelectionSet)
	if err != nil {
		return 0, err
	}
	c.fragments[name] = n
	return n, nil
}

func (c *coster) field(parent *ast.Definition, f *ast.Field) (int64, error) {
	if f.Name == "__typename" || len(f.SelectionSet) == 0 {
		return 1, nil // a leaf; a leaf list counts 1 too
	}
	def := parent.Fields.ForName(f.Name)
	if def == nil {
		return 0, errNotCosted
	}
	key, page := parent.Name+"."+def.Name, c.page
	c.page = 0
	if def.Type.Elem == nil && def.Arguments.ForName("limit") != nil {
		c.page = c.listSize(key, def, f, 0)
	}
	children, err := c.set(c.m.schema.Types[def.Type.Name()], f.SelectionSet)
	c.page = page
	if err != nil {
		return 0, err
	}
	size := int64(1)
	if def.Type.Elem != nil {
		size = c.listSize(key, def, f, page)
	}
	return add(1, mul(size, children)), nil
}

// listSize returns how many values the list field f counts as; page is the limit of the page
// object holding it (0: none).
func (c *coster) listSize(key string, def *ast.FieldDefinition, f *ast.Field, page int64) int64 {
	if def.Arguments.ForName("limit") == nil {
		if page > 0 {
			return page
		}
		if n, ok := c.m.sizes[key]; ok {
			return n
		}
		return assumedListSize
	}
	if n, ok := c.intArg(f.Arguments.ForName("limit")); ok {
		return min(max(n, 1), MaxLimit)
	}
	if n, ok := c.m.limitDefault[key]; ok {
		return n
	}
	return DefaultLimit
}

// intArg returns the integer value of an argument, following a variable to its value or default.
func (c *coster) intArg(a *ast.Argument) (int64, bool) {
	if a == nil {
		return 0, false
	}
	v := a.Value
	if v.Kind == ast.Variable {
		if x, ok := c.vars[v.Raw]; ok {
			return number(x)
		}
		d := c.op.VariableDefinitions.ForName(v.Raw)
		if d == nil || d.DefaultValue == nil {
			return 0, false
		}
		v = d.DefaultValue
	}
	if v.Kind != ast.IntValue {
		return 0, false
	}
	n, err := strconv.ParseInt(v.Raw, 10, 64)
	return n, err == nil
}

// number reads a variable's value as decoded from JSON (or passed by a Go caller).
func number(x any) (int64, bool) {
	switch n := x.(type) {
	case float64:
		return int64(max(min(n, costCap), -costCap)), true
	case int:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	}
	return 0, false
}

// add and mul saturate at costCap: a document whose fragments spread one another may describe
// more fields than an int64 counts.
func add(a, b int64) int64 { return min(a+b, costCap) }

func mul(a, b int64) int64 {
	if a != 0 && b > costCap/a {
		return costCap
	}
	return a * b
}
