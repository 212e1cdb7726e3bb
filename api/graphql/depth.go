package graphql

import (
	"unicode/utf8"

	gqlerrors "github.com/graph-gophers/graphql-go/errors"
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

// This file holds a small lexical reader of GraphQL documents, enough for two questions that
// graph-gophers does not answer: is an operation introspection only (for the depth limit), and
// where in the document is the field an execution error's path names (graph-gophers fills the
// path of a resolver error but not its locations). Anything it does not understand gives "no"
// and "unknown"; graph-gophers remains the parser that decides what a document means.

type token struct {
	text      string // names and punctuators as written; "s" for a string, "0" for a number
	line, col int    // 1-based, columns in characters
}

// lexTokens splits a document into tokens, dropping white space, commas and comments. It returns
// nil for an unterminated string.
func lexTokens(s string) []token {
	var out []token
	line, lineStart := 1, 0
	col := func(i int) int { return utf8.RuneCountInString(s[lineStart:i]) + 1 }
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '\n' || (c == '\r' && (i+1 >= len(s) || s[i+1] != '\n')):
			i++
			line, lineStart = line+1, i
		case c == ' ' || c == '\t' || c == '\r' || c == ',':
			i++
		case c == 0xEF && i+2 < len(s) && s[i+1] == 0xBB && s[i+2] == 0xBF: // BOM
			i += 3
		case c == '#':
			for i < len(s) && s[i] != '\n' && s[i] != '\r' {
				i++
			}
		case c == '"':
			t := token{"s", line, col(i)}
			if len(s) >= i+3 && s[i:i+3] == `"""` {
				j := i + 3
				for ; j+2 < len(s) && s[j:j+3] != `"""`; j++ {
					if s[j] == '\\' && len(s) >= j+4 && s[j+1:j+4] == `"""` {
						j += 3
					} else if s[j] == '\n' {
						line, lineStart = line+1, j+1
					}
				}
				if j+2 >= len(s) {
					return nil
				}
				i = j + 3
			} else {
				j := i + 1
				for ; j < len(s) && s[j] != '"'; j++ {
					if s[j] == '\\' {
						j++
					} else if s[j] == '\n' {
						return nil
					}
				}
				if j >= len(s) {
					return nil
				}
				i = j + 1
			}
			out = append(out, t)
		case c == '.' && len(s) >= i+3 && s[i:i+3] == "...":
			out = append(out, token{"...", line, col(i)})
			i += 3
		case isNameStart(c):
			j := i + 1
			for j < len(s) && (isNameStart(s[j]) || (s[j] >= '0' && s[j] <= '9')) {
				j++
			}
			out = append(out, token{s[i:j], line, col(i)})
			i = j
		case c == '-' || (c >= '0' && c <= '9'):
			j := i + 1
			for j < len(s) && ((s[j] >= '0' && s[j] <= '9') || s[j] == '.' || s[j] == 'e' || s[j] == 'E' || s[j] == '+' || s[j] == '-') {
				j++
			}
			out = append(out, token{"0", line, col(i)})
			i = j
		default:
			_, size := utf8.DecodeRuneInString(s[i:])
			out = append(out, token{s[i : i+size], line, col(i)})
			i += size
		}
	}
	return out
}

func isNameStart(c byte) bool { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') }

// A document outline: the selection sets of its operations and fragments.
type (
	outline struct {
		operations []operation
		fragments  map[string][]selection
	}
	operation struct {
		name string
		set  []selection
	}
	selection struct {
		key    string // response key (alias or name); "" for fragments
		name   string // field name
		loc    gqlerrors.Location
		set    []selection // the field's or inline fragment's selection set
		spread string      // fragment name of a spread
		inline bool
	}
)

// parseOutline reads a document's outline; ok is false when it does not understand it.
func parseOutline(doc string) (outline, bool) {
	p := outliner{toks: lexTokens(doc)}
	out := outline{fragments: map[string][]selection{}}
	if p.toks == nil {
		return out, false
	}
	for p.i < len(p.toks) {
		switch t := p.toks[p.i].text; t {
		case "{":
			set, ok := p.selectionSet()
			if !ok {
				return out, false
			}
			out.operations = append(out.operations, operation{set: set})
		case "query", "mutation", "subscription":
			p.i++
			name := ""
			if p.i < len(p.toks) && p.toks[p.i].text != "(" && p.toks[p.i].text != "@" && p.toks[p.i].text != "{" {
				name = p.toks[p.i].text
				p.i++
			}
			if !p.skipTo("{") {
				return out, false
			}
			set, ok := p.selectionSet()
			if !ok {
				return out, false
			}
			out.operations = append(out.operations, operation{name: name, set: set})
		case "fragment":
			if p.i+1 >= len(p.toks) {
				return out, false
			}
			name := p.toks[p.i+1].text
			p.i += 2
			if !p.skipTo("{") {
				return out, false
			}
			set, ok := p.selectionSet()
			if !ok {
				return out, false
			}
			out.fragments[name] = set
		default:
			return out, false
		}
	}
	return out, true
}

type outliner struct {
	toks []token
	i    int
}

func (p *outliner) peek() string {
	if p.i < len(p.toks) {
		return p.toks[p.i].text
	}
	return ""
}

// skipTo advances to the next target at bracket depth zero (skipping variable definitions,
// type conditions and directives, whose arguments may hold object values).
func (p *outliner) skipTo(target string) bool {
	depth := 0
	for ; p.i < len(p.toks); p.i++ {
		switch t := p.toks[p.i].text; {
		case depth == 0 && t == target:
			return true
		case t == "(" || t == "[" || t == "{":
			depth++
		case t == ")" || t == "]" || t == "}":
			depth--
		}
	}
	return false
}

// skipGroup skips the bracket group opening at the current token.
func (p *outliner) skipGroup() bool {
	depth := 0
	for ; p.i < len(p.toks); p.i++ {
		switch p.toks[p.i].text {
		case "(", "[", "{":
			depth++
		case ")", "]", "}":
			depth--
			if depth == 0 {
				p.i++
				return true
			}
		}
	}
	return false
}

func (p *outliner) skipDirectives() bool {
	for p.peek() == "@" {
		p.i += 2
		if p.peek() == "(" && !p.skipGroup() {
			return false
		}
	}
	return true
}

// selectionSet reads the set opening at the current "{".
func (p *outliner) selectionSet() ([]selection, bool) {
	p.i++ // {
	var set []selection
	for p.i < len(p.toks) && p.peek() != "}" {
		t := p.toks[p.i]
		if t.text == "..." {
			p.i++
			if p.peek() == "on" || p.peek() == "@" || p.peek() == "{" { // inline fragment
				if !p.skipTo("{") {
					return nil, false
				}
				sub, ok := p.selectionSet()
				if !ok {
					return nil, false
				}
				set = append(set, selection{inline: true, set: sub})
				continue
			}
			set = append(set, selection{spread: p.peek()})
			p.i++
			if !p.skipDirectives() {
				return nil, false
			}
			continue
		}
		f := selection{key: t.text, name: t.text, loc: gqlerrors.Location{Line: t.line, Column: t.col}}
		p.i++
		if p.peek() == ":" { // alias: name
			if p.i+1 < len(p.toks) {
				f.name = p.toks[p.i+1].text
			}
			p.i += 2
		}
		if p.peek() == "(" && !p.skipGroup() {
			return nil, false
		}
		if !p.skipDirectives() {
			return nil, false
		}
		if p.peek() == "{" {
			sub, ok := p.selectionSet()
			if !ok {
				return nil, false
			}
			f.set = sub
		}
		set = append(set, f)
	}
	if p.i >= len(p.toks) {
		return nil, false
	}
	p.i++ // }
	return set, true
}

// introspectionOnly reports whether every operation of a document selects only introspection
// root fields (fragment spreads at the root are followed).
func introspectionOnly(doc string) bool {
	o, ok := parseOutline(doc)
	if !ok || len(o.operations) == 0 {
		return false
	}
	for _, op := range o.operations {
		fields := o.rootFields(op.set, 0)
		if len(fields) == 0 {
			return false
		}
		for _, f := range fields {
			if len(f) < 2 || f[:2] != "__" {
				return false
			}
		}
	}
	return true
}

func (o outline) rootFields(set []selection, depth int) []string {
	if depth > 10 {
		return []string{""}
	}
	var out []string
	for _, s := range set {
		switch {
		case s.inline:
			out = append(out, o.rootFields(s.set, depth+1)...)
		case s.spread != "":
			out = append(out, o.rootFields(o.fragments[s.spread], depth+1)...)
		default:
			out = append(out, s.name)
		}
	}
	return out
}

// locate returns the location of the field that path names in the operation operationName (or
// the document's only operation), or nil when it cannot tell.
func (o outline) locate(operationName string, path []any) []gqlerrors.Location {
	var set []selection
	for _, op := range o.operations {
		if op.name == operationName || (operationName == "" && len(o.operations) == 1) {
			set = op.set
			break
		}
	}
	var loc *gqlerrors.Location
	for _, seg := range path {
		key, ok := seg.(string)
		if !ok {
			continue // a list index
		}
		f := o.find(set, key, 0)
		if f == nil {
			return nil
		}
		l := f.loc
		loc, set = &l, f.set
	}
	if loc == nil {
		return nil
	}
	return []gqlerrors.Location{*loc}
}

func (o outline) find(set []selection, key string, depth int) *selection {
	if depth > 10 {
		return nil
	}
	for i := range set {
		s := &set[i]
		var f *selection
		switch {
		case s.inline:
			f = o.find(s.set, key, depth+1)
		case s.spread != "":
			f = o.find(o.fragments[s.spread], key, depth+1)
		case s.key == key:
			f = s
		}
		if f != nil {
			return f
		}
	}
	return nil
}
