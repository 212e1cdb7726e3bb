package intake

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"

	jsonv1 "github.com/go-json-experiment/json/v1"
)

// decodeObservation decodes raw into o exactly as jsonv1.Unmarshal does, and returns its error.
//
// jsonv1's reflection was the largest single cost of the observation path: 3.5 of the 22.7 µs
// of the process's CPU an observation stored (docs/PERFORMANCE.md). A device's observation
// takes a fast path instead: one pass over raw that decodes the FHIR elements carehub reads and
// checks the rest as JSON. The fast path takes only what it decodes as jsonv1 would
// (FuzzFastObservation holds it to that); anything else (an escape in a string, a null or a
// value of another type where an element is read, a member name jsonv1 would match in another
// case, a name given twice, nesting past fastMaxDepth) is left to jsonv1, which also words
// every error.
func decodeObservation(raw []byte, o *fhirObservation) error {
	if fastObservation(raw, o) {
		return nil
	}
	*o = fhirObservation{}
	return jsonv1.Unmarshal(raw, o)
}

// fastMaxDepth bounds the nesting the fast path reads; deeper documents go to jsonv1.
const fastMaxDepth = 32

// fastObservation decodes raw into o and reports whether it could (see decodeObservation). o
// holds garbage when it could not.
func fastObservation(raw []byte, o *fhirObservation) bool {
	r := fastReader{b: raw}
	var seen uint32
	ok := r.object(func(key []byte) bool {
		bit, ok := r.member(&seen, key, observationNames)
		switch {
		case !ok:
			return false
		case bit < 0:
			return r.skip()
		}
		switch observationNames[bit] {
		case "resourceType":
			return r.str(&o.ResourceType)
		case "id":
			return r.strPtr(&o.ID)
		case "identifier":
			o.Identifier, ok = r.raw()
			return ok
		case "status":
			return r.strPtr(&o.Status)
		case "category":
			o.Category = []concept{}
			return r.array(func() bool {
				o.Category = append(o.Category, concept{})
				return r.concept(&o.Category[len(o.Category)-1])
			})
		case "code":
			o.Code = new(concept)
			return r.concept(o.Code)
		case "subject":
			o.Subject = new(reference)
			return r.reference(o.Subject)
		case "device":
			o.Device = new(reference)
			return r.reference(o.Device)
		case "effectiveDateTime":
			return r.strPtr(&o.DateTime)
		case "effectiveInstant":
			return r.strPtr(&o.Instant)
		case "effectivePeriod":
			o.Period = new(period)
			return r.period(o.Period)
		case "effectiveTiming":
			o.Timing = new(struct{})
			return r.peek() == '{' && r.skip()
		case "valueQuantity":
			o.Quantity = new(quantity)
			return r.quantity(o.Quantity)
		case "valueCodeableConcept":
			o.CodeableConcept = new(concept)
			return r.concept(o.CodeableConcept)
		case "valueString":
			return r.strPtr(&o.String)
		case "dataAbsentReason":
			o.DataAbsentReason = new(concept)
			return r.concept(o.DataAbsentReason)
		case "component":
			o.Component = []json.RawMessage{}
			return r.array(func() bool {
				v, ok := r.raw()
				o.Component = append(o.Component, v)
				return ok
			})
		}
		return false
	})
	r.space()
	return ok && r.i == len(r.b)
}

// The JSON names of fhirObservation's fields and of the types it holds, as its tags give them.
var (
	observationNames = []string{"resourceType", "id", "identifier", "status", "category", "code", "subject", "device",
		"effectiveDateTime", "effectiveInstant", "effectivePeriod", "effectiveTiming",
		"valueQuantity", "valueCodeableConcept", "valueString", "dataAbsentReason", "component"}
	conceptNames   = []string{"coding", "text"}
	codingNames    = []string{"system", "code"}
	referenceNames = []string{"reference", "display"}
	quantityNames  = []string{"value", "unit", "system", "code"}
	periodNames    = []string{"start", "end"}
)

// fastReader reads JSON for the fast path. Each method reports false for what it does not
// take, and then the fast path gives up.
type fastReader struct {
	b     []byte
	i     int
	depth int
}

func (r *fastReader) space() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\r', '\n':
			r.i++
		default:
			return
		}
	}
}

// peek returns the next byte after white space, 0 at the end.
func (r *fastReader) peek() byte {
	r.space()
	if r.i < len(r.b) {
		return r.b[r.i]
	}
	return 0
}

// member finds key among names, which an object's members have seen (a bit each): the
// name's index, or -1 for a name no field has in any case. It reports false for a name seen
// before, and for one jsonv1 may match in another case.
func (r *fastReader) member(seen *uint32, key []byte, names []string) (int, bool) {
	for i, n := range names {
		if string(key) == n {
			if *seen&(1<<i) != 0 {
				return 0, false
			}
			*seen |= 1 << i
			return i, true
		}
	}
	return -1, !foldsToAny(key, names)
}

// foldsToAny reports whether key might match one of names case-insensitively. It errs towards
// yes: it also ignores '-' and '_', and any byte outside ASCII in key counts as a match (Unicode
// folds 'ſ' to 's' and the Kelvin sign to 'k').
func foldsToAny(key []byte, names []string) bool {
	for _, n := range names {
		j := 0
		match := true
		for _, c := range key {
			switch {
			case c >= 0x80:
				return true
			case c == '-' || c == '_':
				continue
			case 'A' <= c && c <= 'Z':
				c += 'a' - 'A'
			}
			if j >= len(n) || c != lower(n[j]) {
				match = false
				break
			}
			j++
		}
		if match && j == len(n) {
			return true
		}
	}
	return false
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// object reads an object, calling member with each key; member reads the value.
func (r *fastReader) object(member func(key []byte) bool) bool {
	if r.peek() != '{' || r.depth == fastMaxDepth {
		return false
	}
	r.i++
	r.depth++
	if r.peek() == '}' {
		r.i++
		r.depth--
		return true
	}
	for {
		key, ok := r.plain()
		if !ok || r.peek() != ':' {
			return false
		}
		r.i++
		if !member(key) {
			return false
		}
		switch r.peek() {
		case ',':
			r.i++
		case '}':
			r.i++
			r.depth--
			return true
		default:
			return false
		}
	}
}

// array reads an array, calling elem to read each element.
func (r *fastReader) array(elem func() bool) bool {
	if r.peek() != '[' || r.depth == fastMaxDepth {
		return false
	}
	r.i++
	r.depth++
	if r.peek() == ']' {
		r.i++
		r.depth--
		return true
	}
	for {
		if !elem() {
			return false
		}
		switch r.peek() {
		case ',':
			r.i++
		case ']':
			r.i++
			r.depth--
			return true
		default:
			return false
		}
	}
}

// plain reads a string without escapes and returns its contents.
func (r *fastReader) plain() ([]byte, bool) {
	if r.peek() != '"' {
		return nil, false
	}
	start := r.i + 1
	ascii := true
	for j := start; j < len(r.b); j++ {
		switch c := r.b[j]; {
		case c == '"':
			r.i = j + 1
			s := r.b[start:j]
			return s, ascii || utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= 0x80:
			ascii = false
		}
	}
	return nil, false
}

func (r *fastReader) str(s *string) bool {
	v, ok := r.plain()
	*s = common(v)
	return ok
}

// common returns v as a string, without allocating one for the values most observations
// repeat.
func common(v []byte) string {
	switch string(v) {
	case "Observation":
		return "Observation"
	case "final":
		return "final"
	case LOINCSystem:
		return LOINCSystem
	case observationCategorySystem:
		return observationCategorySystem
	case vitalSignsCategory:
		return vitalSignsCategory
	case "http://unitsofmeasure.org":
		return "http://unitsofmeasure.org"
	}
	return string(v)
}

func (r *fastReader) strPtr(s **string) bool {
	*s = new(string)
	return r.str(*s)
}

// raw reads any value and returns it as it stands in b.
func (r *fastReader) raw() ([]byte, bool) {
	r.space()
	start := r.i
	ok := r.skip()
	return r.b[start:r.i], ok
}

// skip reads any value, checking it is JSON.
func (r *fastReader) skip() bool {
	switch c := r.peek(); c {
	case '"':
		_, ok := r.plain()
		return ok
	case '{':
		return r.object(func([]byte) bool { return r.skip() })
	case '[':
		return r.array(func() bool { return r.skip() })
	case 't':
		return r.literal("true")
	case 'f':
		return r.literal("false")
	case 'n':
		return r.literal("null")
	}
	_, ok := r.number()
	return ok
}

func (r *fastReader) literal(l string) bool {
	if len(r.b)-r.i < len(l) || string(r.b[r.i:r.i+len(l)]) != l {
		return false
	}
	r.i += len(l)
	return true
}

// number reads a JSON number and returns its text.
func (r *fastReader) number() ([]byte, bool) {
	r.space()
	start := r.i
	b := r.b
	i := r.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(b, i)
	default:
		return nil, false
	}
	if i < len(b) && b[i] == '.' {
		if j := digits(b, i+1); j > i+1 {
			i = j
		} else {
			return nil, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if j := digits(b, i); j > i {
			i = j
		} else {
			return nil, false
		}
	}
	r.i = i
	return b[start:i], true
}

func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

func (r *fastReader) concept(c *concept) bool {
	var seen uint32
	return r.object(func(key []byte) bool {
		bit, ok := r.member(&seen, key, conceptNames)
		switch {
		case !ok:
			return false
		case bit < 0:
			return r.skip()
		case bit == 0: // coding
			c.Coding = []coding{}
			return r.array(func() bool {
				c.Coding = append(c.Coding, coding{})
				return r.coding(&c.Coding[len(c.Coding)-1])
			})
		}
		return r.str(&c.Text)
	})
}

func (r *fastReader) coding(c *coding) bool {
	var seen uint32
	return r.object(func(key []byte) bool {
		bit, ok := r.member(&seen, key, codingNames)
		switch {
		case !ok:
			return false
		case bit < 0:
			return r.skip()
		case bit == 0:
			return r.str(&c.System)
		}
		return r.str(&c.Code)
	})
}

func (r *fastReader) reference(ref *reference) bool {
	var seen uint32
	return r.object(func(key []byte) bool {
		bit, ok := r.member(&seen, key, referenceNames)
		switch {
		case !ok:
			return false
		case bit < 0:
			return r.skip()
		case bit == 0:
			return r.str(&ref.Reference)
		}
		return r.str(&ref.Display)
	})
}

func (r *fastReader) quantity(q *quantity) bool {
	var seen uint32
	return r.object(func(key []byte) bool {
		bit, ok := r.member(&seen, key, quantityNames)
		switch {
		case !ok:
			return false
		case bit < 0:
			return r.skip()
		case bit == 0:
			text, ok := r.number()
			if !ok {
				return false
			}
			f, err := strconv.ParseFloat(string(text), 64)
			q.Value = &f
			return err == nil
		case bit == 1:
			return r.strPtr(&q.Unit)
		case bit == 2:
			return r.strPtr(&q.System)
		}
		return r.strPtr(&q.Code)
	})
}

func (r *fastReader) period(p *period) bool {
	var seen uint32
	return r.object(func(key []byte) bool {
		bit, ok := r.member(&seen, key, periodNames)
		switch {
		case !ok:
			return false
		case bit < 0:
			return r.skip()
		case bit == 0:
			return r.strPtr(&p.Start)
		}
		return r.strPtr(&p.End)
	})
}
