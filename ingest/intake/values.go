package intake

import (
	"errors"
	"strings"
	"time"

	"carehub/kernel/clinical"
)

// effective is Observation.effective[x]. effectiveTiming is refused: a device reading happens at
// a time or over a period.
type effective struct {
	DateTime *string   `json:"effectiveDateTime"`
	Instant  *string   `json:"effectiveInstant"`
	Period   *period   `json:"effectivePeriod"`
	Timing   *struct{} `json:"effectiveTiming"`
}

type period struct {
	Start *string `json:"start"`
	End   *string `json:"end"`
}

// at is when the observation applies: effectiveDateTime, effectiveInstant, or the start of
// effectivePeriod (its end when it has no start).
func (f *effective) at(lim limits) (time.Time, *EntryError) {
	n := 0
	for _, set := range []bool{f.DateTime != nil, f.Instant != nil, f.Period != nil, f.Timing != nil} {
		if set {
			n++
		}
	}
	switch {
	case n == 0:
		return time.Time{}, entryErr(CodeInvalidEffective, "effectiveDateTime is required (or effectiveInstant or effectivePeriod)")
	case n > 1:
		return time.Time{}, entryErr(CodeInvalidEffective, "only one effective[x] is allowed")
	case f.Timing != nil:
		return time.Time{}, entryErr(CodeInvalidEffective, "effectiveTiming is not accepted: send effectiveDateTime, effectiveInstant or effectivePeriod")
	case f.Instant != nil:
		return parseTime("effectiveInstant", *f.Instant, false, lim)
	case f.Period != nil && f.Period.Start != nil:
		return parseTime("effectivePeriod.start", *f.Period.Start, true, lim)
	case f.Period != nil && f.Period.End != nil:
		return parseTime("effectivePeriod.end", *f.Period.End, true, lim)
	case f.Period != nil:
		return time.Time{}, entryErr(CodeInvalidEffective, "effectivePeriod needs a start or an end")
	}
	return parseTime("effectiveDateTime", *f.DateTime, true, lim)
}

// parseTime reads a FHIR instant, or with day a dateTime of at least a day (the vital-signs
// profile's precision; DECISIONS §7), a date alone being that day at 00:00 UTC.
func parseTime(element, s string, day bool, lim limits) (time.Time, *EntryError) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil && day && len(s) == len("2006-01-02") {
		t, err = time.Parse(time.DateOnly, s)
	}
	if err != nil {
		want := "an RFC 3339 date-time with a time zone, e.g. 2026-11-01T08:30:00Z"
		if day {
			want += ", or a date, e.g. 2026-11-01"
		}
		return time.Time{}, entryErr(CodeInvalidEffective, "%s must be %s", element, want)
	}
	if t.Before(earliestEffective) {
		return time.Time{}, entryErr(CodeInvalidEffective, "%s %s is before 1900", element, truncate(s))
	}
	if t.After(lim.now.Add(lim.maxFuture)) {
		return time.Time{}, entryErr(CodeInvalidEffective, "%s %s is more than %s in the future", element, truncate(s), lim.maxFuture)
	}
	return t, nil
}

// value is value[x] and dataAbsentReason, of an Observation or of one of its components. Other
// value types (valueBoolean, valueInteger, valueRange…) are not accepted.
type value struct {
	Quantity         *quantity `json:"valueQuantity"`
	CodeableConcept  *concept  `json:"valueCodeableConcept"`
	String           *string   `json:"valueString"`
	DataAbsentReason *concept  `json:"dataAbsentReason"`
}

// reading is the numeric value stored with an observation, in the canonical unit of its code.
type reading struct {
	value float64
	unit  string
	has   bool // false: stored without a value (a coded or text value, a panel, dataAbsentReason)
}

// read checks value[x] against the LOINC code. at prefixes element names ("component[1].");
// grouped says the observation has components, so it needs no value of its own. A vital sign
// with a unit (heart rate, weight…) needs valueQuantity or dataAbsentReason.
func (v *value) read(loinc, at string, grouped bool) (reading, *EntryError) {
	n := 0
	for _, set := range []bool{v.Quantity != nil, v.CodeableConcept != nil, v.String != nil} {
		if set {
			n++
		}
	}
	_, quantitative := vitalUnits[loinc]
	switch {
	case n > 1:
		return reading{}, entryErr(CodeInvalidValue, "%svalue[x]: only one of valueQuantity, valueCodeableConcept, valueString is allowed", at)
	case v.DataAbsentReason != nil && n > 0:
		return reading{}, entryErr(CodeInvalidValue, "%sdataAbsentReason must not be present with a value[x] (FHIR obs-6)", at)
	case v.DataAbsentReason != nil:
		if len(v.DataAbsentReason.Coding) == 0 && v.DataAbsentReason.Text == "" {
			return reading{}, entryErr(CodeInvalidValue, "%sdataAbsentReason needs a coding or a text", at)
		}
		return reading{}, nil
	case v.Quantity != nil:
		return quantityValue(v.Quantity, loinc, at+"valueQuantity")
	case quantitative && !grouped:
		return reading{}, entryErr(CodeInvalidValue, "%svalueQuantity is required for LOINC %s (or dataAbsentReason when there is no value)", at, loinc)
	case v.String != nil && strings.TrimSpace(*v.String) == "":
		return reading{}, entryErr(CodeInvalidValue, "%svalueString must not be empty", at)
	case n == 0 && !grouped:
		return reading{}, entryErr(CodeInvalidValue, "%svalueQuantity is required (or valueCodeableConcept, valueString, component, dataAbsentReason)", at)
	}
	return reading{}, nil
}

// quantityValue converts a Quantity to the canonical unit of its LOINC code. With the UCUM
// system the code decides and unit is display text only; without a system, the code or else the
// unit is read as UCUM or as one of the spellings devices use (clinical.Normalize). A code
// carehub does not know is stored with its quantity as sent.
func quantityValue(q *quantity, loinc, element string) (reading, *EntryError) {
	if q.Value == nil {
		return reading{}, entryErr(CodeInvalidValue, "%s.value must be a number", element)
	}
	system, code, unit := deref(q.System), strings.TrimSpace(deref(q.Code)), strings.TrimSpace(deref(q.Unit))
	u := code
	switch {
	case system == UCUMSystem && code == "":
		return reading{}, entryErr(CodeInvalidValue, "%s.code is required with system %s", element, UCUMSystem)
	case system != "" && system != UCUMSystem:
		if _, known := vitalUnits[loinc]; known {
			return reading{}, entryErr(CodeInvalidValue, "%s.system must be %s for LOINC %s", element, UCUMSystem, loinc)
		}
	case u == "":
		u = unit
	}
	if u == "" {
		return reading{}, entryErr(CodeInvalidValue, "%s needs a unit (a UCUM code, or unit)", element)
	}
	x, canonical, known, ok := toCanonical(loinc, u, *q.Value)
	if known && !ok && system != UCUMSystem {
		// Not UCUM: a display spelling clinical knows (bpm, mmHg, °F), without a system only.
		var err error
		if x, err = clinical.Normalize(loinc, *q.Value, u); err == nil {
			ok = true
		} else if !errors.Is(err, clinical.ErrUnknownCode) {
			return reading{}, entryErr(CodeInvalidValue, "%s: %s", element, reason(err))
		}
	}
	if known && !ok {
		return reading{}, entryErr(CodeInvalidValue, "%s: unit %q does not fit LOINC %s (want %s)", element, truncate(u), loinc, canonical)
	}
	if _, err := clinical.Normalize(loinc, x, canonical); err != nil && !errors.Is(err, clinical.ErrUnknownCode) {
		return reading{}, entryErr(CodeInvalidValue, "%s: %s", element, reason(err))
	}
	return reading{value: x, unit: canonical, has: true}, nil
}

func reason(err error) string {
	return strings.TrimSuffix(err.Error(), ": "+clinical.ErrInvalidInput.Error())
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
