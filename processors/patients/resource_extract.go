package patients

// The search values of a generic resource, read from it once on write (fhir_resources' columns)
// so that a search is an index lookup: references, the patient, code, category, identifier and
// status tokens, and the date as an interval.

import (
	"strings"
	"time"

	"carehub/kernel/ids"
)

// extracted are the search values of one resource.
type extracted struct {
	refs        []string // every relative reference, Type/id with carehub ids
	entryRefs   []string // every reference to a Bundle entry (urn:uuid:, urn:oid:)
	patientID   string   // the patient it is about ("" when none)
	codes       []string
	categories  []string
	identifiers []string
	status      []string
	dateFrom    *time.Time
	dateTo      *time.Time
}

func extract(t string, doc map[string]any) extracted {
	var x extracted
	walkRefs(doc, func(ref string) string {
		if norm, ok := normalRef(ref); ok {
			x.refs = appendNew(x.refs, norm)
		} else if strings.HasPrefix(ref, "urn:") {
			x.entryRefs = append(x.entryRefs, ref)
		}
		return ref
	})
	x.patientID = patientOf(doc)
	elems := codeElements[t]
	if elems == nil {
		elems = []string{"code"}
	}
	for _, e := range elems {
		x.codes = tokens(x.codes, doc[e], "code")
	}
	x.categories = tokens(nil, doc["category"], "code")
	if t == "Encounter" {
		x.categories = tokens(x.categories, doc["class"], "code")
	}
	x.identifiers = tokens(nil, doc["identifier"], "value")
	for _, e := range statusElements {
		x.status = tokens(x.status, doc[e], "code")
	}
	for _, e := range dateElements {
		if v, ok := doc[e]; ok {
			x.dateFrom, x.dateTo = dateSpan(v)
			if x.dateFrom != nil || x.dateTo != nil {
				break
			}
		}
	}
	return x
}

// walkRefs calls fn with every string under a "reference" key of v, at any depth (Reference
// elements are everywhere: subject, encounter, basedOn, result, contained resources …), and
// replaces it with what fn returns.
func walkRefs(v any, fn func(string) string) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && k == "reference" {
				x[k] = fn(s)
				continue
			}
			walkRefs(e, fn)
		}
	case []any:
		for _, e := range x {
			walkRefs(e, fn)
		}
	}
}

// normalRef is a relative literal reference as Type/id with a carehub id, without a version;
// false for what is not one (urn:uuid:, an absolute URL, a fragment, a conditional reference).
func normalRef(ref string) (string, bool) {
	t, rest, ok := strings.Cut(ref, "/")
	if !ok || t == "" || t[0] < 'A' || t[0] > 'Z' || strings.ContainsAny(t, ":?#") || strings.ContainsAny(rest, "?#") {
		return "", false
	}
	id, _, _ := strings.Cut(rest, "/")
	if id == "" {
		return "", false
	}
	return t + "/" + ids.FromFHIR(id), true
}

// patientOf is the carehub id of the patient doc names first among patientElements.
func patientOf(doc map[string]any) string {
	for _, e := range patientElements {
		var found string
		eachObject(doc[e], func(o map[string]any) {
			ref, _ := o["reference"].(string)
			if norm, ok := normalRef(ref); ok && found == "" && strings.HasPrefix(norm, "Patient/") {
				found = strings.TrimPrefix(norm, "Patient/")
			}
		})
		if found != "" {
			return found
		}
	}
	return ""
}

// eachObject calls fn with v when it is an object, or with each object of v when it is an array.
func eachObject(v any, fn func(map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		fn(x)
	case []any:
		for _, e := range x {
			if o, ok := e.(map[string]any); ok {
				fn(o)
			}
		}
	}
}

// tokens appends the tokens of v: a code (string), a Coding, a CodeableConcept, an Identifier
// (key "value"), or an array of them. Each is "system|code", and "|code" for a search without a
// system.
func tokens(out []string, v any, key string) []string {
	add := func(system, code string) {
		if code == "" {
			return
		}
		if system != "" {
			out = appendNew(out, system+"|"+code)
		}
		out = appendNew(out, "|"+code)
	}
	var one func(any)
	one = func(v any) {
		switch x := v.(type) {
		case string:
			add("", x)
		case map[string]any:
			if codings, ok := x["coding"]; ok {
				eachObject(codings, func(c map[string]any) { one(c) })
				return
			}
			system, _ := x["system"].(string)
			code, _ := x[key].(string)
			add(system, code)
		case []any:
			for _, e := range x {
				one(e)
			}
		}
	}
	one(v)
	return out
}

// TokenValue is the stored form of a search token: system|code, or |code for any system.
func TokenValue(i Identifier) string { return i.System + "|" + i.Value }

// dateSpan is the interval a date, dateTime, instant or Period covers: [from, to), a date of
// lower precision spanning its whole year, month or day; a Period without an end is open.
func dateSpan(v any) (from, to *time.Time) {
	switch x := v.(type) {
	case string:
		f, t, ok := timeSpan(x)
		if ok {
			return &f, &t
		}
	case map[string]any:
		if s, ok := x["start"].(string); ok {
			if f, _, ok := timeSpan(s); ok {
				from = &f
			}
		}
		if e, ok := x["end"].(string); ok {
			if _, t, ok := timeSpan(e); ok {
				to = &t
			}
		}
	}
	return from, to
}

// timeSpan parses a FHIR date, dateTime or instant into the interval its precision covers.
func timeSpan(s string) (from, to time.Time, ok bool) {
	for _, l := range []struct {
		layout string
		span   func(time.Time) time.Time
	}{
		{"2006", func(t time.Time) time.Time { return t.AddDate(1, 0, 0) }},
		{"2006-01", func(t time.Time) time.Time { return t.AddDate(0, 1, 0) }},
		{time.DateOnly, func(t time.Time) time.Time { return t.AddDate(0, 0, 1) }},
		{time.RFC3339Nano, func(t time.Time) time.Time { return t.Add(time.Second) }},
	} {
		if t, err := time.Parse(l.layout, s); err == nil {
			return t, l.span(t), true
		}
	}
	return time.Time{}, time.Time{}, false
}

func appendNew(list []string, s string) []string {
	for _, e := range list {
		if e == s {
			return list
		}
	}
	return append(list, s)
}
