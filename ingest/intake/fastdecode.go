package intake

import (
	"encoding/json"
	"strconv"

	jsonv1 "github.com/go-json-experiment/json/v1"

	"carehub/kernel/jsonwire"
)

// decodeObservation decodes raw into o exactly as jsonv1.Unmarshal does, and returns its error.
//
// jsonv1's reflection was the largest single cost of the observation path: 3.5 of the 22.7 µs
// of the process's CPU an observation stored (docs/PERFORMANCE.md). A device's observation
// takes a fast path instead: one pass over raw that decodes the FHIR elements carehub reads and
// checks the rest as JSON. The fast path takes only what it decodes as jsonv1 would
// (FuzzFastObservation holds it to that); anything else (an escape in a string it reads, a null
// or a value of another type where it reads an element, a member name jsonv1 would match in
// another case, a name given twice, nesting past jsonwire.MaxReaderDepth, invalid JSON) is
// left to jsonv1, which also words every error.
func decodeObservation(raw []byte, o *fhirObservation) error {
	if fastObservation(raw, o) {
		return nil
	}
	*o = fhirObservation{}
	return jsonv1.Unmarshal(raw, o)
}

// fastObservation decodes raw into o and reports whether it could (see decodeObservation). o
// holds garbage when it could not.
func fastObservation(raw []byte, o *fhirObservation) bool {
	r := fastReader{jsonwire.NewReader(raw)}
	return r.Fields(observationNames, func(i int) bool {
		switch observationNames[i] {
		case "resourceType":
			return r.str(&o.ResourceType)
		case "id":
			return r.strPtr(&o.ID)
		case "identifier":
			var ok bool
			o.Identifier, ok = r.Raw()
			return ok
		case "status":
			return r.strPtr(&o.Status)
		case "category":
			return elements(r, &o.Category, r.concept)
		case "code":
			return ptr(&o.Code, r.concept)
		case "subject":
			return ptr(&o.Subject, r.reference)
		case "device":
			return ptr(&o.Device, r.reference)
		case "effectiveDateTime":
			return r.strPtr(&o.DateTime)
		case "effectiveInstant":
			return r.strPtr(&o.Instant)
		case "effectivePeriod":
			return ptr(&o.Period, r.period)
		case "effectiveTiming":
			o.Timing = new(struct{})
			return r.Peek() == '{' && r.Skip()
		case "valueQuantity":
			return ptr(&o.Quantity, r.quantity)
		case "valueCodeableConcept":
			return ptr(&o.CodeableConcept, r.concept)
		case "valueString":
			return r.strPtr(&o.String)
		case "dataAbsentReason":
			return ptr(&o.DataAbsentReason, r.concept)
		case "component":
			o.Component = []json.RawMessage{}
			return r.Array(func() bool {
				v, ok := r.Raw()
				o.Component = append(o.Component, v)
				return ok
			})
		}
		return false
	}) && r.End()
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

// fastReader reads the types fhirObservation holds as jsonv1 decodes them, each method
// reporting false for what it leaves to jsonv1: a string with an escape (Plain), null, or a
// value of another type.
type fastReader struct{ *jsonwire.Reader }

func (r fastReader) str(s *string) bool {
	v, ok := r.Plain()
	*s = common(v)
	return ok
}

// common returns v as a string, without allocating one for the values most observations
// repeat: the category and code systems, the vital signs' LOINC codes and UCUM units.
func common(v []byte) string {
	if s, ok := commonStrings[string(v)]; ok {
		return s
	}
	return string(v)
}

// commonStrings maps each string common returns without allocating to itself.
var commonStrings = func() map[string]string {
	m := map[string]string{}
	for _, s := range []string{"Observation", "final", vitalSignsCategory,
		LOINCSystem, observationCategorySystem, UCUMSystem} {
		m[s] = s
	}
	for code, u := range vitalUnits {
		m[code], m[u.canonical] = code, u.canonical
	}
	return m
}()

func (r fastReader) strPtr(s **string) bool { return ptr(s, r.str) }

// elements reads an array into a new []T (empty, not nil, for []), each element with read.
func elements[T any](r fastReader, s *[]T, read func(*T) bool) bool {
	*s = []T{}
	return r.Array(func() bool {
		var v T
		*s = append(*s, v)
		return read(&(*s)[len(*s)-1])
	})
}

// ptr reads a *T into a new T.
func ptr[T any](p **T, read func(*T) bool) bool {
	*p = new(T)
	return read(*p)
}

func (r fastReader) concept(c *concept) bool {
	return r.Fields(conceptNames, func(i int) bool {
		if i == 0 {
			return elements(r, &c.Coding, r.coding)
		}
		return r.str(&c.Text)
	})
}

func (r fastReader) coding(c *coding) bool {
	return r.Fields(codingNames, func(i int) bool {
		if i == 0 {
			return r.str(&c.System)
		}
		return r.str(&c.Code)
	})
}

func (r fastReader) reference(ref *reference) bool {
	return r.Fields(referenceNames, func(i int) bool {
		if i == 0 {
			return r.str(&ref.Reference)
		}
		return r.str(&ref.Display)
	})
}

func (r fastReader) quantity(q *quantity) bool {
	return r.Fields(quantityNames, func(i int) bool {
		switch i {
		case 0:
			text, ok := r.Number()
			if !ok {
				return false
			}
			f, err := strconv.ParseFloat(string(text), 64)
			q.Value = &f
			return err == nil
		case 1:
			return r.strPtr(&q.Unit)
		case 2:
			return r.strPtr(&q.System)
		}
		return r.strPtr(&q.Code)
	})
}

func (r fastReader) period(p *period) bool {
	return r.Fields(periodNames, func(i int) bool {
		if i == 0 {
			return r.strPtr(&p.Start)
		}
		return r.strPtr(&p.End)
	})
}
