package graphql

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	gqlerrors "github.com/graph-gophers/graphql-go/errors"
	"github.com/vektah/gqlparser/v2/ast"
)

// Strict input (DECISIONS §3): text that holds a NUL byte or is not valid UTF-8 cannot be stored
// (Postgres refuses it with SQLSTATE 22021 or 22P05) and never means anything, so an argument or
// variable carrying it is refused with BAD_USER_INPUT naming it, before any resolver runs. Every
// string counts: String and ID arguments, input object fields, list items, and the strings and
// keys inside JSON values.

// badText reports whether s holds a NUL byte or invalid UTF-8.
func badText(s string) bool { return strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s) }

func badTextError(kind, name string) *gqlerrors.QueryError {
	e := queryError(CodeBadUserInput, "%s %s holds a NUL byte or invalid UTF-8, which text must not", kind, name)
	e.Extensions[kind] = name
	return e
}

// checkVariables checks the request's variables, in name order.
func checkVariables(vars map[string]any) *gqlerrors.QueryError {
	names := make([]string, 0, len(vars))
	for name := range vars {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if path, bad := badJSON(vars[name], "$"+name); bad {
			return badTextError("variable", path)
		}
	}
	return nil
}

// badJSON returns the path of the first bad string in a value decoded from JSON.
func badJSON(v any, path string) (string, bool) {
	switch v := v.(type) {
	case string:
		return path, badText(v)
	case []any:
		for i, x := range v {
			if p, bad := badJSON(x, path+"["+strconv.Itoa(i)+"]"); bad {
				return p, true
			}
		}
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if badText(k) {
				return path + "." + strconv.QuoteToASCII(k), true
			}
			if p, bad := badJSON(v[k], path+"."+k); bad {
				return p, true
			}
		}
	}
	return "", false
}

// checkLiterals checks the literal values of a document: the arguments of every field and
// directive, and the defaults of variables. Arguments are named field(argument.path), the field
// by its path of response keys.
func checkLiterals(doc *ast.QueryDocument) *gqlerrors.QueryError {
	for _, op := range doc.Operations {
		for _, v := range op.VariableDefinitions {
			if path, bad := badValue(v.DefaultValue, ""); bad {
				return badTextError("variable", "$"+v.Variable+path)
			}
		}
		if e := checkSelections(op.SelectionSet, ""); e != nil {
			return e
		}
	}
	for _, f := range doc.Fragments {
		if e := checkSelections(f.SelectionSet, ""); e != nil {
			return e
		}
	}
	return nil
}

func checkSelections(set ast.SelectionSet, path string) *gqlerrors.QueryError {
	for _, sel := range set {
		switch s := sel.(type) {
		case *ast.Field:
			p := s.Alias
			if path != "" {
				p = path + "." + s.Alias
			}
			if e := checkArguments(p, s.Arguments, s.Directives); e != nil {
				return e
			}
			if e := checkSelections(s.SelectionSet, p); e != nil {
				return e
			}
		case *ast.InlineFragment:
			if e := checkArguments(path, nil, s.Directives); e != nil {
				return e
			}
			if e := checkSelections(s.SelectionSet, path); e != nil {
				return e
			}
		case *ast.FragmentSpread:
			if e := checkArguments(path, nil, s.Directives); e != nil {
				return e
			}
		}
	}
	return nil
}

func checkArguments(field string, args ast.ArgumentList, dirs ast.DirectiveList) *gqlerrors.QueryError {
	for _, d := range dirs {
		if e := checkArguments(field+"@"+d.Name, d.Arguments, nil); e != nil {
			return e
		}
	}
	for _, a := range args {
		if path, bad := badValue(a.Value, a.Name); bad {
			return badTextError("argument", fmt.Sprintf("%s(%s)", field, path))
		}
	}
	return nil
}

// badValue returns the path of the first bad string in a literal value; variables are checked
// on their own (checkVariables).
func badValue(v *ast.Value, path string) (string, bool) {
	if v == nil {
		return "", false
	}
	switch v.Kind {
	case ast.StringValue, ast.BlockValue:
		return path, badText(v.Raw)
	case ast.ListValue:
		for i, c := range v.Children {
			if p, bad := badValue(c.Value, path+"["+strconv.Itoa(i)+"]"); bad {
				return p, true
			}
		}
	case ast.ObjectValue:
		for _, c := range v.Children {
			if p, bad := badValue(c.Value, path+"."+c.Name); bad {
				return p, true
			}
		}
	}
	return "", false
}
