// Package spectest checks a GraphQL schema against the contract that
// spec/clinical-ai-platform-api.md states in its tables.
//
// ParseSpec reads the spec's markdown tables (scalars, enumerations, states, object types, input
// types, Query, Mutation and Subscription fields) into a Model. Compare holds that Model against
// the introspection result of a schema, either one parsed from SDL (IntrospectSDL) or a live
// server's (FetchIntrospection), and reports every difference a client could notice. Additive
// extensions (extra types, fields, optional arguments, enum values) are tolerated; Extensions
// lists them.
//
// Type references are written in SDL notation throughout: "String!", "[String!]", "[Event!]!".
package spectest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// SpecFile is the file name of the API specification, in shared/spec/ beside the repository and in
// this package's testdata/ as a checked-in copy.
const SpecFile = "clinical-ai-platform-api.md"

// Model is the GraphQL contract stated by the spec, in the spec's order.
type Model struct {
	Scalars      []string // custom scalars, e.g. DateTime and JSON
	Enums        []Enum
	Objects      []Object
	Inputs       []Input
	Query        []Field
	Mutation     []Field
	Subscription []Field
}

// Enum is an enumeration and its values.
type Enum struct {
	Name   string
	Values []string
}

// Object is an output object type.
type Object struct {
	Name   string
	Fields []Field
}

// Input is an input object type.
type Input struct {
	Name   string
	Fields []InputValue
}

// Field is a field of an object or root operation type: its arguments and its type in SDL
// notation.
type Field struct {
	Name string
	Args []InputValue
	Type string
}

// InputValue is an argument or an input field with its type in SDL notation.
type InputValue struct {
	Name string
	Type string
}

// Object returns the object type with the given name.
func (m Model) Object(name string) (Object, bool) {
	for _, o := range m.Objects {
		if o.Name == name {
			return o, true
		}
	}
	return Object{}, false
}

// Enum returns the enumeration with the given name.
func (m Model) Enum(name string) (Enum, bool) {
	for _, e := range m.Enums {
		if e.Name == name {
			return e, true
		}
	}
	return Enum{}, false
}

// Input returns the input type with the given name.
func (m Model) Input(name string) (Input, bool) {
	for _, in := range m.Inputs {
		if in.Name == name {
			return in, true
		}
	}
	return Input{}, false
}

// Field returns the field with the given name.
func (o Object) Field(name string) (Field, bool) { return findField(o.Fields, name) }

// Arg returns the argument with the given name.
func (f Field) Arg(name string) (InputValue, bool) { return findValue(f.Args, name) }

// Field returns the input field with the given name.
func (in Input) Field(name string) (InputValue, bool) { return findValue(in.Fields, name) }

func findField(fs []Field, name string) (Field, bool) {
	for _, f := range fs {
		if f.Name == name {
			return f, true
		}
	}
	return Field{}, false
}

func findValue(vs []InputValue, name string) (InputValue, bool) {
	for _, v := range vs {
		if v.Name == name {
			return v, true
		}
	}
	return InputValue{}, false
}

// LoadSpec reads and parses the spec at path. An empty path means the spec found by LocateSpec
// from the working directory.
func LoadSpec(path string) (Model, error) {
	if path == "" {
		wd, err := os.Getwd()
		if err != nil {
			return Model{}, fmt.Errorf("load spec: %w", err)
		}
		if path, err = LocateSpec(wd); err != nil {
			return Model{}, fmt.Errorf("load spec: %w", err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Model{}, fmt.Errorf("load spec: %w", err)
	}
	m, err := ParseSpec(b)
	if err != nil {
		return Model{}, fmt.Errorf("load spec %s: %w", path, err)
	}
	return m, nil
}

// LocateSpec finds the spec for the module containing dir: shared/spec/SpecFile beside the
// repository root when it exists (the authoritative copy), else the checked-in copy in
// api/graphql/spectest/testdata/.
func LocateSpec(dir string) (string, error) {
	root, err := ModuleRoot(dir)
	if err != nil {
		return "", err
	}
	for _, p := range []string{sharedSpecPath(root), checkedInSpecPath(root)} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no %s in %s or %s", SpecFile, sharedSpecPath(root), checkedInSpecPath(root))
}

// ModuleRoot returns the nearest directory at or above dir that holds a go.mod.
func ModuleRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above " + dir)
		}
		dir = parent
	}
}

func sharedSpecPath(root string) string {
	return filepath.Join(root, "..", "shared", "spec", SpecFile)
}

func checkedInSpecPath(root string) string {
	return filepath.Join(root, "api", "graphql", "spectest", "testdata", SpecFile)
}

// Markers of the spec sections ParseSpec reads. A spec edit that renames one is a parse error,
// never a silently smaller Model.
const (
	markEnums        = "### Enumerations (GraphQL)"
	markObjects      = "### GraphQL object types"
	markInputPrefix  = "### GraphQL input type "
	markStates       = "## States and transitions"
	markQuery        = "**Query fields**"
	markMutation     = "**Mutation fields**"
	markSubscription = "**Subscription fields**"
	markNotation     = "Notation:"
)

var (
	nameRE    = regexp.MustCompile(`^[_A-Za-z][_0-9A-Za-z]*$`)
	typeRE    = regexp.MustCompile(`^(\[\s*[_A-Za-z][_0-9A-Za-z]*\s*!?\s*\]|[_A-Za-z][_0-9A-Za-z]*)\s*(!?)\s*(.*)$`)
	allButRE  = regexp.MustCompile(`^all but (\w+) nullable$`)
	backtick  = regexp.MustCompile("`([^`]+)`")
	trailNote = regexp.MustCompile(`\s*\([^()]*\)$`)
)

var builtinScalars = map[string]bool{"ID": true, "String": true, "Int": true, "Float": true, "Boolean": true}

// ParseSpec parses the spec markdown into a Model and checks that every type it references is
// defined.
func ParseSpec(markdown []byte) (Model, error) {
	lines, err := readLines(markdown)
	if err != nil {
		return Model{}, err
	}
	var m Model
	if m.Scalars, err = parseScalars(lines); err != nil {
		return Model{}, err
	}
	if m.Enums, err = parseEnums(lines); err != nil {
		return Model{}, err
	}
	if m.Objects, err = parseObjects(lines); err != nil {
		return Model{}, err
	}
	if m.Inputs, err = parseInputs(lines); err != nil {
		return Model{}, err
	}
	for _, op := range []struct {
		mark, result string
		dst          *[]Field
	}{
		{markQuery, "Returns", &m.Query},
		{markMutation, "Returns", &m.Mutation},
		{markSubscription, "Delivers", &m.Subscription},
	} {
		if *op.dst, err = parseRootFields(lines, op.mark, op.result); err != nil {
			return Model{}, err
		}
	}
	if err := m.check(); err != nil {
		return Model{}, err
	}
	return m, nil
}

func readLines(b []byte) ([]string, error) {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, strings.TrimRight(sc.Text(), " \t\r"))
	}
	return lines, sc.Err()
}

// parseScalars reads the backquoted names of the "Scalars:" sentence of the notation paragraph.
func parseScalars(lines []string) ([]string, error) {
	for _, l := range lines {
		if !strings.HasPrefix(l, markNotation) {
			continue
		}
		_, after, ok := strings.Cut(l, "Scalars:")
		if !ok {
			return nil, errors.New("notation paragraph names no scalars")
		}
		if i := strings.Index(after, ". "); i >= 0 {
			after = after[:i]
		}
		var out []string
		for _, mm := range backtick.FindAllStringSubmatch(after, -1) {
			if !nameRE.MatchString(mm[1]) {
				return nil, fmt.Errorf("scalar %q is not a GraphQL name", mm[1])
			}
			out = append(out, mm[1])
		}
		if len(out) == 0 {
			return nil, errors.New("notation paragraph names no scalars")
		}
		return out, nil
	}
	return nil, fmt.Errorf("no line starting %q", markNotation)
}

func parseEnums(lines []string) ([]Enum, error) {
	var out []Enum
	t, err := tableAfter(lines, markEnums, exact(markEnums))
	if err != nil {
		return nil, err
	}
	c, err := t.cols("Enum", "Values")
	if err != nil {
		return nil, err
	}
	for _, r := range t.rows {
		e, err := parseEnum(r[c[0]], r[c[1]])
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}

	// The status enums are the state sets of "States and transitions" whose label is a GraphQL
	// name, optionally followed by a parenthesised remark; "Webhook status (REST)" is not one.
	t, err = tableAfter(lines, markStates, exact(markStates))
	if err != nil {
		return nil, err
	}
	if c, err = t.cols("State set", "Values"); err != nil {
		return nil, err
	}
	for _, r := range t.rows {
		label := trailNote.ReplaceAllString(r[c[0]], "")
		if !nameRE.MatchString(label) {
			continue
		}
		e, err := parseEnum(label, r[c[1]])
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

func parseEnum(name, values string) (Enum, error) {
	if !nameRE.MatchString(name) {
		return Enum{}, fmt.Errorf("enum name %q is not a GraphQL name", name)
	}
	e := Enum{Name: name}
	for _, v := range strings.Split(values, ",") {
		v = strings.TrimSpace(v)
		if !nameRE.MatchString(v) {
			return Enum{}, fmt.Errorf("enum %s: value %q is not a GraphQL name", name, v)
		}
		e.Values = append(e.Values, v)
	}
	return e, nil
}

func parseObjects(lines []string) ([]Object, error) {
	t, err := tableAfter(lines, markObjects, exact(markObjects))
	if err != nil {
		return nil, err
	}
	c, err := t.cols("Type", "Fields (name: type)")
	if err != nil {
		return nil, err
	}
	var out []Object
	for _, r := range t.rows {
		o, err := parseObject(r[c[0]], r[c[1]])
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

// parseObject reads "name: type, name: type (note), ...". Notes are checked, not trusted:
// "(nullable)" on a non-null type, or a field "all but X nullable" that is non-null, is an error.
func parseObject(name, fields string) (Object, error) {
	if !nameRE.MatchString(name) {
		return Object{}, fmt.Errorf("object type name %q is not a GraphQL name", name)
	}
	o := Object{Name: name}
	allBut := ""
	for _, item := range splitTop(fields) {
		fname, rest, ok := strings.Cut(item, ":")
		fname = strings.TrimSpace(fname)
		if !ok || !nameRE.MatchString(fname) {
			return Object{}, fmt.Errorf("%s: field %q is not \"name: type\"", name, item)
		}
		typ, note, err := parseType(rest)
		if err != nil {
			return Object{}, fmt.Errorf("%s.%s: %w", name, fname, err)
		}
		switch {
		case note == "":
		case note == "nullable":
			if strings.HasSuffix(typ, "!") {
				return Object{}, fmt.Errorf("%s.%s: noted nullable but typed %s", name, fname, typ)
			}
		case allButRE.MatchString(note):
			allBut = allButRE.FindStringSubmatch(note)[1]
		default:
			return Object{}, fmt.Errorf("%s.%s: unknown note %q", name, fname, note)
		}
		o.Fields = append(o.Fields, Field{Name: fname, Type: typ})
	}
	if allBut != "" {
		if _, ok := o.Field(allBut); !ok {
			return Object{}, fmt.Errorf("%s: note names field %q it does not have", name, allBut)
		}
		for _, f := range o.Fields {
			if f.Name != allBut && strings.HasSuffix(f.Type, "!") {
				return Object{}, fmt.Errorf("%s.%s: noted nullable but typed %s", name, f.Name, f.Type)
			}
		}
	}
	return o, nil
}

func parseInputs(lines []string) ([]Input, error) {
	var out []Input
	for _, l := range lines {
		if !strings.HasPrefix(l, markInputPrefix) {
			continue
		}
		name := strings.TrimSpace(strings.TrimPrefix(l, markInputPrefix))
		if !nameRE.MatchString(name) {
			return nil, fmt.Errorf("input type name %q is not a GraphQL name", name)
		}
		t, err := tableAfter(lines, l, exact(l))
		if err != nil {
			return nil, err
		}
		c, err := t.cols("Field", "Type", "Required")
		if err != nil {
			return nil, err
		}
		fc, tc, rc := c[0], c[1], c[2]
		in := Input{Name: name}
		for _, r := range t.rows {
			fname := r[fc]
			if !nameRE.MatchString(fname) {
				return nil, fmt.Errorf("%s: field %q is not a GraphQL name", name, fname)
			}
			typ, note, err := parseType(r[tc])
			if err != nil || note != "" {
				return nil, fmt.Errorf("%s.%s: type %q: %v", name, fname, r[tc], err)
			}
			switch strings.ToLower(r[rc]) {
			case "yes":
				if !strings.HasSuffix(typ, "!") {
					typ += "!"
				}
			case "no":
				if strings.HasSuffix(typ, "!") {
					return nil, fmt.Errorf("%s.%s: not required but typed %s", name, fname, typ)
				}
			default:
				return nil, fmt.Errorf("%s.%s: Required is %q, want yes or no", name, fname, r[rc])
			}
			in.Fields = append(in.Fields, InputValue{Name: fname, Type: typ})
		}
		out = append(out, in)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no heading starting %q", markInputPrefix)
	}
	return out, nil
}

// parseRootFields reads a table of root operation fields: Field, Arguments and the result column.
// The result may carry a free remark in parentheses; "(nullable)" is checked against the type.
func parseRootFields(lines []string, mark, resultCol string) ([]Field, error) {
	t, err := tableAfter(lines, mark, func(l string) bool { return strings.HasPrefix(l, mark) })
	if err != nil {
		return nil, err
	}
	c, err := t.cols("Field", "Arguments", resultCol)
	if err != nil {
		return nil, err
	}
	fc, ac, rc := c[0], c[1], c[2]
	var out []Field
	for _, r := range t.rows {
		f := Field{Name: r[fc]}
		if !nameRE.MatchString(f.Name) {
			return nil, fmt.Errorf("%s: field %q is not a GraphQL name", mark, f.Name)
		}
		typ, note, err := parseType(r[rc])
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", mark, f.Name, err)
		}
		if note == "nullable" && strings.HasSuffix(typ, "!") {
			return nil, fmt.Errorf("%s %s: noted nullable but typed %s", mark, f.Name, typ)
		}
		f.Type = typ
		if args := r[ac]; args != "" && args != "-" && args != "—" && !strings.EqualFold(args, "none") {
			for _, item := range splitTop(args) {
				aname, rest, ok := strings.Cut(item, ":")
				aname = strings.TrimSpace(aname)
				if !ok || !nameRE.MatchString(aname) {
					return nil, fmt.Errorf("%s %s: argument %q is not \"name: type\"", mark, f.Name, item)
				}
				atyp, anote, err := parseType(rest)
				if err != nil || anote != "" {
					return nil, fmt.Errorf("%s %s(%s:): type %q: %v", mark, f.Name, aname, rest, err)
				}
				f.Args = append(f.Args, InputValue{Name: aname, Type: atyp})
			}
		}
		out = append(out, f)
	}
	return out, nil
}

// parseType splits "[String!]! (remark)" into the SDL type "[String!]!" and the remark "remark".
func parseType(s string) (typ, note string, err error) {
	s = strings.TrimSpace(s)
	m := typeRE.FindStringSubmatch(s)
	if m == nil {
		return "", "", fmt.Errorf("%q is not a type", s)
	}
	typ = strings.Join(strings.Fields(m[1]), "") + m[2]
	rest := strings.TrimSpace(m[3])
	if rest == "" {
		return typ, "", nil
	}
	if !strings.HasPrefix(rest, "(") || !strings.HasSuffix(rest, ")") {
		return "", "", fmt.Errorf("%q: text after the type is not a parenthesised note", s)
	}
	return typ, strings.TrimSpace(rest[1 : len(rest)-1]), nil
}

// splitTop splits on commas outside brackets and parentheses.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '[', '(':
			depth++
		case ']', ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	if last := strings.TrimSpace(s[start:]); last != "" {
		out = append(out, last)
	}
	return out
}

type table struct {
	header []string
	rows   [][]string
}

func exact(s string) func(string) bool { return func(l string) bool { return l == s } }

// tableAfter returns the first markdown table after the first line matching mark, before any
// following heading.
func tableAfter(lines []string, label string, mark func(string) bool) (table, error) {
	start := -1
	for i, l := range lines {
		if mark(l) {
			start = i
			break
		}
	}
	if start < 0 {
		return table{}, fmt.Errorf("spec section %q not found", label)
	}
	i := start + 1
	for ; i < len(lines) && !strings.HasPrefix(lines[i], "|"); i++ {
		if strings.HasPrefix(lines[i], "#") {
			return table{}, fmt.Errorf("no table under %q", lines[start])
		}
	}
	if i+1 >= len(lines) {
		return table{}, fmt.Errorf("no table under %q", lines[start])
	}
	t := table{header: cells(lines[i])}
	if !strings.HasPrefix(lines[i+1], "|") || strings.Trim(lines[i+1], "|-: ") != "" {
		return table{}, fmt.Errorf("table under %q has no separator row", lines[start])
	}
	for i += 2; i < len(lines) && strings.HasPrefix(lines[i], "|"); i++ {
		row := cells(lines[i])
		if len(row) != len(t.header) {
			return table{}, fmt.Errorf("table under %q: row %q has %d cells, want %d", lines[start], lines[i], len(row), len(t.header))
		}
		t.rows = append(t.rows, row)
	}
	if len(t.rows) == 0 {
		return table{}, fmt.Errorf("table under %q has no rows", lines[start])
	}
	return t, nil
}

func cells(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(line, "|")
	line = strings.TrimSuffix(line, "|")
	parts := strings.Split(line, "|")
	for i, p := range parts {
		parts[i] = strings.ReplaceAll(strings.TrimSpace(p), "`", "")
	}
	return parts
}

// col returns the index of the column with the given header.
func (t table) col(name string) (int, error) {
	for i, h := range t.header {
		if h == name {
			return i, nil
		}
	}
	return 0, fmt.Errorf("table with header %q lacks column %q", t.header, name)
}

// cols returns the indexes of the columns with the given headers.
func (t table) cols(names ...string) ([]int, error) {
	out := make([]int, len(names))
	for i, n := range names {
		c, err := t.col(n)
		if err != nil {
			return nil, err
		}
		out[i] = c
	}
	return out, nil
}

// check verifies that names are unique and that every referenced type is defined with a kind
// allowed where it is used (output types for fields, input types for arguments).
func (m Model) check() error {
	kind := map[string]string{}
	for n := range builtinScalars {
		kind[n] = "SCALAR"
	}
	def := func(name, k string) error {
		if _, dup := kind[name]; dup {
			return fmt.Errorf("type %s defined twice", name)
		}
		kind[name] = k
		return nil
	}
	for _, s := range m.Scalars {
		if err := def(s, "SCALAR"); err != nil {
			return err
		}
	}
	for _, e := range m.Enums {
		if err := def(e.Name, "ENUM"); err != nil {
			return err
		}
	}
	for _, o := range m.Objects {
		if err := def(o.Name, "OBJECT"); err != nil {
			return err
		}
	}
	for _, in := range m.Inputs {
		if err := def(in.Name, "INPUT_OBJECT"); err != nil {
			return err
		}
	}
	output := func(where, typ string) error {
		switch kind[namedType(typ)] {
		case "SCALAR", "ENUM", "OBJECT":
			return nil
		}
		return fmt.Errorf("%s: %s is not a defined output type", where, typ)
	}
	input := func(where, typ string) error {
		switch kind[namedType(typ)] {
		case "SCALAR", "ENUM", "INPUT_OBJECT":
			return nil
		}
		return fmt.Errorf("%s: %s is not a defined input type", where, typ)
	}
	checkFields := func(owner string, fs []Field) error {
		seen := map[string]bool{}
		for _, f := range fs {
			if seen[f.Name] {
				return fmt.Errorf("%s.%s defined twice", owner, f.Name)
			}
			seen[f.Name] = true
			if err := output(owner+"."+f.Name, f.Type); err != nil {
				return err
			}
			for _, a := range f.Args {
				if err := input(fmt.Sprintf("%s.%s(%s:)", owner, f.Name, a.Name), a.Type); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, o := range m.Objects {
		if err := checkFields(o.Name, o.Fields); err != nil {
			return err
		}
	}
	for _, in := range m.Inputs {
		for _, f := range in.Fields {
			if err := input(in.Name+"."+f.Name, f.Type); err != nil {
				return err
			}
		}
	}
	for _, r := range []struct {
		name string
		fs   []Field
	}{{"Query", m.Query}, {"Mutation", m.Mutation}, {"Subscription", m.Subscription}} {
		if err := checkFields(r.name, r.fs); err != nil {
			return err
		}
	}
	return nil
}

// namedType strips list and non-null wrappers: "[Event!]!" → "Event".
func namedType(typ string) string { return strings.Trim(typ, "[]!") }
