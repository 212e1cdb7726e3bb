package auth

import (
	"slices"
	"strings"

	lru "github.com/hashicorp/golang-lru/v2"
)

// unparsedOperation names a GraphQL call whose document could not be read (the call is recorded
// all the same; the GraphQL handler answers it with its own error).
const unparsedOperation = "graphql unparsed"

// maxOperationLen bounds the operation string of an audit record.
const maxOperationLen = 512

// GraphQLOperation names a GraphQL request for the audit log: "graphql <type> <root fields>",
// the operation type (query, mutation, subscription) and the distinct root field names, sorted
// and comma-joined, aliases resolved and fragments at the root expanded: "graphql query patient",
// "graphql mutation runAgent", "graphql query organizations,patients". operationName selects
// among several operations as GraphQL does. A document it cannot read, or whose operation
// cannot be chosen, is "graphql unparsed". It only reads the document's outline; validating it
// is the GraphQL handler's job.
func GraphQLOperation(query, operationName string) string {
	if len(query) > maxRememberedQuery {
		return graphQLOperation(query, operationName)
	}
	k := opKey{query, operationName}
	if name, ok := operations.Get(k); ok {
		return name
	}
	name := graphQLOperation(query, operationName)
	operations.Add(k, name)
	return name
}

// operations remembers the names of the documents GraphQLOperation read last: a client sends the
// same few again and again, and reading one was a tenth of a publishEvent call's CPU. Only short
// documents are kept (at most 1,024 of maxRememberedQuery bytes), so that what it holds stays
// small whatever a client sends.
var operations = func() *lru.Cache[opKey, string] {
	c, err := lru.New[opKey, string](1024)
	if err != nil {
		panic(err) // only for a size ≤ 0
	}
	return c
}()

type opKey struct{ query, operationName string }

const maxRememberedQuery = 4 << 10

func graphQLOperation(query, operationName string) string {
	doc, ok := parseOutline(query)
	if !ok {
		return unparsedOperation
	}
	var op *outlineOp
	for i := range doc.ops {
		switch {
		case operationName == "" && len(doc.ops) == 1:
			op = &doc.ops[i]
		case operationName != "" && doc.ops[i].name == operationName:
			op = &doc.ops[i]
		}
	}
	if op == nil {
		return unparsedOperation
	}
	fields := map[string]bool{}
	doc.collect(op.sel, fields, map[string]bool{})
	delete(fields, "__typename")
	names := make([]string, 0, len(fields))
	for f := range fields {
		names = append(names, f)
	}
	if len(names) == 0 {
		names = append(names, "__typename")
	}
	slices.Sort(names)
	return truncate("graphql "+op.typ+" "+strings.Join(names, ","), maxOperationLen)
}

// outline is what the audit log needs of a GraphQL document: each operation's root fields and
// fragment spreads, and each fragment's top-level fields and spreads.
type outline struct {
	ops   []outlineOp
	frags map[string]outlineSel
}

type outlineOp struct {
	typ, name string
	sel       outlineSel
}

type outlineSel struct {
	fields  []string
	spreads []string
}

// collect adds the fields of sel, and of the fragments it spreads (each once), to out.
func (d *outline) collect(sel outlineSel, out, seen map[string]bool) {
	for _, f := range sel.fields {
		out[f] = true
	}
	for _, s := range sel.spreads {
		if seen[s] {
			continue
		}
		seen[s] = true
		if f, ok := d.frags[s]; ok {
			d.collect(f, out, seen)
		}
	}
}

// maxInlineDepth bounds nested inline fragments at the root, so a hostile document cannot
// recurse deeply.
const maxInlineDepth = 32

type outlineParser struct {
	lex gqlLexer
	tok gqlToken // the current token
}

func parseOutline(src string) (outline, bool) {
	p := outlineParser{lex: gqlLexer{src: src}}
	doc := outline{frags: map[string]outlineSel{}}
	p.advance()
	for p.tok.kind != tkEOF {
		switch {
		case p.tok.is(tkPunct, "{"):
			p.advance()
			sel, ok := p.selectionSet(0)
			if !ok {
				return doc, false
			}
			doc.ops = append(doc.ops, outlineOp{typ: "query", sel: sel})
		case p.tok.is(tkName, "query"), p.tok.is(tkName, "mutation"), p.tok.is(tkName, "subscription"):
			op := outlineOp{typ: p.tok.text}
			p.advance()
			if p.tok.kind == tkName {
				op.name = p.tok.text
				p.advance()
			}
			if p.tok.is(tkPunct, "(") && !p.skipBalanced() {
				return doc, false
			}
			sel, ok := p.block(0)
			if !ok {
				return doc, false
			}
			op.sel = sel
			doc.ops = append(doc.ops, op)
		case p.tok.is(tkName, "fragment"):
			p.advance()
			if p.tok.kind != tkName {
				return doc, false
			}
			name := p.tok.text
			p.advance()
			if !p.tok.is(tkName, "on") || !p.typeCondition() {
				return doc, false
			}
			sel, ok := p.block(0)
			if !ok {
				return doc, false
			}
			doc.frags[name] = sel
		default:
			return doc, false
		}
	}
	return doc, len(doc.ops) > 0
}

func (p *outlineParser) advance() { p.tok = p.lex.next() }

// typeCondition reads "on Type", at "on".
func (p *outlineParser) typeCondition() bool {
	p.advance()
	if p.tok.kind != tkName {
		return false
	}
	p.advance()
	return true
}

// block reads directives, then a selection set "{ … }" at depth.
func (p *outlineParser) block(depth int) (outlineSel, bool) {
	if !p.skipDirectives() || !p.tok.is(tkPunct, "{") {
		return outlineSel{}, false
	}
	p.advance()
	return p.selectionSet(depth)
}

// selectionSet reads the selections after "{" up to and including the matching "}".
func (p *outlineParser) selectionSet(depth int) (outlineSel, bool) {
	var sel outlineSel
	if depth > maxInlineDepth {
		return sel, false
	}
	for {
		switch {
		case p.tok.is(tkPunct, "}"):
			p.advance()
			return sel, true
		case p.tok.is(tkPunct, "..."):
			p.advance()
			if p.tok.kind == tkName && p.tok.text != "on" {
				sel.spreads = append(sel.spreads, p.tok.text)
				p.advance()
				if !p.skipDirectives() {
					return sel, false
				}
				continue
			}
			if p.tok.is(tkName, "on") && !p.typeCondition() {
				return sel, false
			}
			inner, ok := p.block(depth + 1)
			if !ok {
				return sel, false
			}
			sel.fields = append(sel.fields, inner.fields...)
			sel.spreads = append(sel.spreads, inner.spreads...)
		case p.tok.kind == tkName:
			name := p.tok.text
			p.advance()
			if p.tok.is(tkPunct, ":") { // alias: the field's name follows
				p.advance()
				if p.tok.kind != tkName {
					return sel, false
				}
				name = p.tok.text
				p.advance()
			}
			if p.tok.is(tkPunct, "(") && !p.skipBalanced() {
				return sel, false
			}
			if !p.skipDirectives() {
				return sel, false
			}
			if p.tok.is(tkPunct, "{") && !p.skipBalanced() {
				return sel, false
			}
			sel.fields = append(sel.fields, name)
		default:
			return sel, false
		}
	}
}

// skipDirectives skips "@name(args)" sequences.
func (p *outlineParser) skipDirectives() bool {
	for p.tok.is(tkPunct, "@") {
		p.advance()
		if p.tok.kind != tkName {
			return false
		}
		p.advance()
		if p.tok.is(tkPunct, "(") && !p.skipBalanced() {
			return false
		}
	}
	return true
}

// skipBalanced skips from an opening bracket to its match, inclusive.
func (p *outlineParser) skipBalanced() bool {
	depth := 0
	for {
		switch {
		case p.tok.kind == tkEOF || p.tok.kind == tkError:
			return false
		case p.tok.is(tkPunct, "("), p.tok.is(tkPunct, "["), p.tok.is(tkPunct, "{"):
			depth++
		case p.tok.is(tkPunct, ")"), p.tok.is(tkPunct, "]"), p.tok.is(tkPunct, "}"):
			depth--
		}
		p.advance()
		if depth == 0 {
			return true
		}
		if depth < 0 {
			return false
		}
	}
}

type tokenKind int

const (
	tkEOF tokenKind = iota
	tkError
	tkPunct
	tkName
	tkValue // string or number: never needed, only skipped
)

type gqlToken struct {
	kind tokenKind
	text string
}

func (t gqlToken) is(k tokenKind, text string) bool { return t.kind == k && t.text == text }

// gqlLexer splits a GraphQL document into tokens (GraphQL spec §2.1), skipping whitespace,
// commas, comments and the byte order mark.
type gqlLexer struct {
	src string
	pos int
}

func (l *gqlLexer) next() gqlToken {
	for l.pos < len(l.src) {
		c := l.src[l.pos]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',':
			l.pos++
		case c == '#':
			for l.pos < len(l.src) && l.src[l.pos] != '\n' && l.src[l.pos] != '\r' {
				l.pos++
			}
		case strings.HasPrefix(l.src[l.pos:], "\ufeff"):
			l.pos += len("\ufeff")
		default:
			return l.token()
		}
	}
	return gqlToken{kind: tkEOF}
}

func (l *gqlLexer) token() gqlToken {
	start := l.pos
	c := l.src[l.pos]
	switch {
	case strings.HasPrefix(l.src[l.pos:], "..."):
		l.pos += 3
		return gqlToken{kind: tkPunct, text: "..."}
	case strings.IndexByte("!$&():=@[]{|}", c) >= 0:
		l.pos++
		return gqlToken{kind: tkPunct, text: l.src[start:l.pos]}
	case c == '_' || isLetter(c):
		for l.pos < len(l.src) && (l.src[l.pos] == '_' || isLetter(l.src[l.pos]) || isDigit(l.src[l.pos])) {
			l.pos++
		}
		return gqlToken{kind: tkName, text: l.src[start:l.pos]}
	case c == '-' || isDigit(c):
		l.pos++
		for l.pos < len(l.src) && strings.IndexByte("0123456789.eE+-", l.src[l.pos]) >= 0 {
			l.pos++
		}
		return gqlToken{kind: tkValue}
	case strings.HasPrefix(l.src[l.pos:], `"""`):
		l.pos += 3
		for l.pos < len(l.src) {
			switch {
			case strings.HasPrefix(l.src[l.pos:], `\"""`):
				l.pos += 4
			case strings.HasPrefix(l.src[l.pos:], `"""`):
				l.pos += 3
				return gqlToken{kind: tkValue}
			default:
				l.pos++
			}
		}
	case c == '"':
		l.pos++
		for l.pos < len(l.src) {
			switch l.src[l.pos] {
			case '\\':
				l.pos += 2
			case '"':
				l.pos++
				return gqlToken{kind: tkValue}
			case '\n', '\r':
				l.pos = len(l.src)
				return gqlToken{kind: tkError}
			default:
				l.pos++
			}
		}
	}
	l.pos = len(l.src)
	return gqlToken{kind: tkError}
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isDigit(c byte) bool  { return c >= '0' && c <= '9' }
