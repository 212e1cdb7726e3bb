package patients

// What FHIR clients search with beyond the plain parameters (issue 52, docs/FHIR.md "Search
// parameters"): keyset paging, :missing, :exact, quantity search on Observation.value, and
// _has on Patient. Every value reaches SQL as a parameter; the SQL text comes from the fixed
// tables here, never from the request.

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"carehub/kernel/fault"
)

// QuantityBound is one FHIR quantity condition: a prefix (eq, ne, gt, lt, ge, le, ap), the number
// as sent (its precision decides eq's range) and optionally the unit's system and code.
type QuantityBound struct {
	Prefix       string
	Number       string
	System, Code string
}

// HasClause is a reverse chain on Patient (_has:Type:patient:param=tokens): the patients some
// resource of Type with one of the tokens at Param (code, category, status) refers to.
type HasClause struct {
	Type   string
	Param  string
	Tokens []Identifier
}

// sortCol is one ORDER BY key: its expression, the SQL type of its values (to read a cursor's
// values back) and its direction; nulls sort last both ways. A notNull column (a primary key's,
// a not-null timestamp's) is ordered and compared without a word about nulls, so that an index
// on it serves the order and the keyset condition both.
type sortCol struct {
	expr, typ string
	desc      bool
	notNull   bool
}

// tieBreak appends to cols each of ties whose expression cols does not order by already: the
// order ends total (in the id), without a key twice.
func tieBreak(cols []sortCol, ties ...sortCol) []sortCol {
	for _, t := range ties {
		if !slices.ContainsFunc(cols, func(c sortCol) bool { return c.expr == t.expr }) {
			cols = append(cols, t)
		}
	}
	return cols
}

func orderSQL(cols []sortCol) string {
	parts := make([]string, len(cols))
	for i, c := range cols {
		dir := " asc"
		if c.desc {
			dir = " desc"
		}
		if !c.notNull {
			dir += " nulls last"
		}
		parts[i] = c.expr + dir
	}
	return strings.Join(parts, ", ")
}

// cursorSQL is the select expression of a row's position: its sort keys as a JSON array.
func cursorSQL(cols []sortCol) string {
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = c.expr
	}
	return `json_build_array(` + strings.Join(parts, ", ") + `)::text`
}

// after adds the keyset condition: the rows that sort after the row at vals (the cursor of the
// previous page's last row). The order is total (it ends in the id), so a page starts exactly
// after the last row of the one before whatever was written since.
func (w *where) after(cols []sortCol, vals []*string) error {
	if len(vals) != len(cols) {
		return badPage()
	}
	for i, c := range cols {
		if vals[i] == nil {
			continue
		}
		if _, err := time.Parse(time.RFC3339Nano, *vals[i]); err != nil && c.typ == "timestamptz" {
			return badPage()
		}
		if _, err := strconv.ParseFloat(*vals[i], 64); err != nil && c.typ == "float8" {
			return badPage()
		}
	}
	if row, ok := w.rowAfter(cols, vals); ok {
		w.conds = append(w.conds, row)
		return nil
	}
	var ors []string
	for i := range cols {
		if vals[i] == nil { // nulls sort last: nothing sorts after a null at this key
			continue
		}
		var ands []string
		for j := 0; j < i; j++ {
			if vals[j] == nil {
				ands = append(ands, cols[j].expr+` is null`)
			} else {
				ands = append(ands, w.format(cols[j].expr+` = %s::text::`+cols[j].typ, *vals[j]))
			}
		}
		op := ">"
		if cols[i].desc {
			op = "<"
		}
		if cols[i].notNull {
			ands = append(ands, w.format(cols[i].expr+` `+op+` %s::text::`+cols[i].typ, *vals[i]))
		} else {
			ands = append(ands, w.format(`(`+cols[i].expr+` `+op+` %s::text::`+cols[i].typ+` or `+cols[i].expr+` is null)`, *vals[i]))
		}
		ors = append(ors, "("+strings.Join(ands, " and ")+")")
	}
	if len(ors) == 0 {
		ors = []string{"false"}
	}
	w.conds = append(w.conds, "("+strings.Join(ors, " or ")+")")
	return nil
}

// rowAfter is the keyset condition as one row comparison, (a, b) > (x, y), when every column is
// notNull and all go one way: the form a btree index takes as the start of its range.
func (w *where) rowAfter(cols []sortCol, vals []*string) (string, bool) {
	for i, c := range cols {
		if !c.notNull || c.desc != cols[0].desc || vals[i] == nil {
			return "", false
		}
	}
	left, right := make([]string, len(cols)), make([]string, len(cols))
	for i, c := range cols { // format adds each value to w's arguments: only once the form is sure
		left[i], right[i] = c.expr, w.format(`%s::text::`+c.typ, *vals[i])
	}
	op := ">"
	if cols[0].desc {
		op = "<"
	}
	return "(" + strings.Join(left, ", ") + ") " + op + " (" + strings.Join(right, ", ") + ")", true
}

func badPage() error {
	return badSearch("_page", "is not a position this search gave (follow the next link as given, with the same parameters)")
}

// parseCursor reads a row's position as cursorSQL wrote it.
func parseCursor(s string) []*string {
	var raw []any
	_ = json.Unmarshal([]byte(s), &raw)
	out := make([]*string, len(raw))
	for i, v := range raw {
		switch x := v.(type) {
		case nil:
		case string:
			out[i] = &x
		default:
			b, _ := json.Marshal(x)
			s := string(b)
			out[i] = &s
		}
	}
	return out
}

// cursorRows hides the last column (the row's position) from a row's renderer and scans it into
// cursor.
type cursorRow struct {
	pgx.Rows
	cursor *string
}

func (c cursorRow) FieldDescriptions() []pgconn.FieldDescription {
	fd := c.Rows.FieldDescriptions()
	return fd[:len(fd)-1]
}

func (c cursorRow) Scan(dest ...any) error { return c.Rows.Scan(append(dest, c.cursor)...) }

func (c cursorRow) Values() ([]any, error) {
	v, err := c.Rows.Values()
	if err != nil {
		return nil, err
	}
	return v[:len(v)-1], nil
}

func (c cursorRow) RawValues() [][]byte {
	v := c.Rows.RawValues()
	return v[:len(v)-1]
}

// missing adds the :missing conditions of q whose "is missing" expression exprs names; a
// parameter the type does not have is refused.
func (w *where) missing(m map[string]bool, exprs map[string]string) error {
	for param, isMissing := range m {
		e, ok := exprs[param]
		if !ok {
			return badSearch(param+":missing", "is not supported for this type")
		}
		if isMissing {
			w.conds = append(w.conds, "("+e+")")
		} else {
			w.conds = append(w.conds, "not ("+e+")")
		}
	}
	return nil
}

// Missing expressions per type (true when the parameter has no value).
var (
	patientMissing = map[string]string{
		"identifier": `coalesce(jsonb_array_length(case jsonb_typeof(t.resource->'identifier') when 'array' then t.resource->'identifier' else '[]' end), 0) = 0`,
		"gender":     `coalesce(t.gender, '') = ''`,
		"birthdate":  `coalesce(t.birth_date, '') = ''`,
	}
	observationMissing = map[string]string{
		"patient": `false`, "subject": `false`,
		"code":           `coalesce(t.code, (t.resource->'code')::jsonb) is null`,
		"category":       `t.resource->'category' is null`,
		"date":           `t.effective_at is null`,
		"value-quantity": `t.value is null`,
	}
	riskMissing    = map[string]string{"patient": `false`, "subject": `false`, "date": `false`}
	genericMissing = map[string]string{
		"patient": `t.patient_id is null`, "subject": `t.patient_id is null`,
		"encounter":  `not exists (select 1 from unnest(t.refs) r where r like 'Encounter/%')`,
		"code":       `t.codes = '{}'`,
		"category":   `t.categories = '{}'`,
		"status":     `t.status = '{}'`,
		"identifier": `t.identifiers = '{}'`,
		"date":       `t.date_from is null and t.date_to is null`,
	}
)

// quantities adds the value-quantity conditions on an observation's value and unit. eq (the
// default) matches the range the number's precision implies (5.4: [5.35, 5.45)), ne its
// complement, ap within 10% of the number; the system and code, when given, must be the
// valueQuantity's (the code also as the unit carehub stores).
func (w *where) quantities(bounds []QuantityBound) error {
	for _, b := range bounds {
		v, err := strconv.ParseFloat(b.Number, 64)
		if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
			return badSearch("value-quantity", strconv.Quote(b.Number)+" is not a number")
		}
		half := 0.5 // half a unit of the number's last digit
		if digits, _, _ := strings.Cut(strings.ToLower(b.Number), "e"); strings.Contains(digits, ".") {
			_, frac, _ := strings.Cut(digits, ".")
			half = 0.5 * math.Pow(10, -float64(len(frac)))
		}
		lo, hi := v-half, v+half
		switch b.Prefix {
		case "gt":
			w.add(`t.value > %s`, v)
		case "lt":
			w.add(`t.value < %s`, v)
		case "ge":
			w.add(`t.value >= %s`, v)
		case "le":
			w.add(`t.value <= %s`, v)
		case "ne":
			w.add(`(t.value < %s or t.value >= %s)`, lo, hi)
		case "ap":
			d := math.Abs(v) * 0.1
			w.add(`t.value >= %s and t.value <= %s`, v-d, v+d)
		default: // eq
			w.add(`t.value >= %s and t.value < %s`, lo, hi)
		}
		if b.System != "" {
			w.add(`t.resource->'valueQuantity'->>'system' = %s`, b.System)
		}
		if b.Code != "" {
			w.add(`(t.resource->'valueQuantity'->>'code' = %s or (t.resource->'valueQuantity'->>'code' is null and t.unit = %[1]s))`, b.Code)
		}
	}
	return nil
}

// has adds the _has conditions of a Patient search: some resource of the clause's type, of the
// patient (so of its organization and test mode), carries one of the tokens.
func (w *where) has(clauses []HasClause) error {
	for _, c := range clauses {
		if c.Type == "Observation" {
			var parts []string
			for _, tok := range c.Tokens {
				switch c.Param {
				case "code":
					parts = append(parts, w.format(`coalesce(h.code, (h.resource->'code')::jsonb)->'coding' @> %s::jsonb`, tokenJSON(tok, "code")))
				case "category":
					parts = append(parts, w.format(`(h.resource->'category')::jsonb @> %s::jsonb`, `[{"coding":`+tokenJSON(tok, "code")+`}]`))
				default:
					return badSearch("_has", "Observation takes code or category")
				}
			}
			w.conds = append(w.conds, `exists (select 1 from observations h where h.patient_id = t.id and (`+strings.Join(parts, " or ")+`))`)
			continue
		}
		col := map[string]string{"code": "codes", "category": "categories", "status": "status", "identifier": "identifiers"}[c.Param]
		if col == "" || !GenericType(c.Type) || !PatientData(c.Type) {
			return badSearch("_has", c.Type+":"+c.Param+" is not supported")
		}
		toks := make([]string, len(c.Tokens))
		for i, tok := range c.Tokens {
			toks[i] = TokenValue(tok)
		}
		rel := strings.TrimSuffix(genericFrom(c.Type), " t") + " h"
		w.conds = append(w.conds, w.format(`exists (select 1 from `+rel+` where h.type = %s and h.patient_id = t.id and h.org_id = pt.org_id
and not h.deleted and h.`+col+` && %s)`, c.Type, toks))
	}
	return nil
}

// exacts adds the :exact string conditions on a Patient's names: the whole family name (or a given
// name, for name), case and accents as sent.
func (w *where) exacts(names, families []string) {
	anyOf(w, families, func(n string) string {
		return w.format(`exists (select 1 from jsonb_array_elements(t.name) n where n->>'family' = %s)`, n)
	})
	anyOf(w, names, func(n string) string {
		return w.format(`exists (select 1 from jsonb_array_elements(t.name) n where n->>'family' = %[1]s or n->>'text' = %[1]s
or exists (select 1 from jsonb_array_elements_text(case jsonb_typeof(n->'given') when 'array' then n->'given' else '[]' end) g where g = %[1]s))`, n)
	})
}

// badSearch is a 400 naming the search parameter.
func badSearch(param, msg string) error {
	return &fault.Error{Kind: fault.KindInvalid, Message: param + ": " + msg, Details: map[string]any{"fields": map[string]any{param: msg}}}
}

// MissingSupported reports whether type t takes param:missing.
func MissingSupported(t, param string) bool {
	m := genericMissing
	switch t {
	case "Patient":
		m = patientMissing
	case "Observation":
		m = observationMissing
	case "RiskAssessment":
		m = riskMissing
	}
	_, ok := m[param]
	return ok
}
