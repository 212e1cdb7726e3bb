package intake

import (
	"math"
	"strings"
)

// UCUMSystem is the coding system of UCUM units. A Quantity with this system is judged by its
// code; its unit is display text (HL7's heart-rate example says "beats/minute", code "/min").
const UCUMSystem = "http://unitsofmeasure.org"

// A small, table-driven UCUM converter limited to the vital signs devices send (DECISIONS §7:
// one UCUM unit per LOINC code). No maintained Go UCUM library fits: the Go ports found either
// need the ucum-essence.xml definitions file at run time (not shipped by any module) or are
// unmaintained single-author parsers; a full UCUM grammar is not needed to accept the dozen units
// vital-signs devices use, and a table is checked exhaustively by its test.
//
// A conversion is canonical = value*factor + offset; the result is rounded to 4 significant
// decimals after a non-identity conversion so that 98.6 [degF] is 37 Cel, not 36.99999….
type conversion struct {
	factor, offset float64
}

// vitalUnit is the canonical UCUM code of a LOINC vital sign and the other UCUM codes converted
// to it.
type vitalUnit struct {
	canonical string
	from      map[string]conversion
}

var identity = conversion{factor: 1}

var (
	perMinute = vitalUnit{canonical: "/min", from: map[string]conversion{"1/min": identity, "min-1": identity}}
	mmHg      = vitalUnit{canonical: "mm[Hg]", from: map[string]conversion{"kPa": {factor: 7.500615758}, "cm[H2O]": {factor: 0.7355591}}}
	percent   = vitalUnit{canonical: "%", from: map[string]conversion{"1": {factor: 100}}} // a fraction: 0.97 1 = 97 %
)

// vitalUnits maps the LOINC codes of the FHIR R4 vital-signs profiles (and the NEWS2 inputs) to
// their units. A code outside it is stored with its quantity as sent.
var vitalUnits = map[string]vitalUnit{
	"8867-4":  perMinute, // heart rate
	"9279-1":  perMinute, // respiratory rate
	"59408-5": percent,   // SpO2 by pulse oximetry
	"2708-6":  percent,   // oxygen saturation in arterial blood
	"8480-6":  mmHg,      // systolic
	"8462-4":  mmHg,      // diastolic
	"8478-0":  mmHg,      // mean arterial pressure
	"8310-5": {canonical: "Cel", from: map[string]conversion{ // body temperature
		"[degF]": {factor: 5.0 / 9, offset: -32 * 5.0 / 9}, "K": {factor: 1, offset: -273.15}}},
	"29463-7": {canonical: "kg", from: map[string]conversion{ // body weight
		"[lb_av]": {factor: 0.45359237}, "g": {factor: 0.001}, "[oz_av]": {factor: 0.028349523125}}},
	"8302-2": {canonical: "cm", from: map[string]conversion{ // body height
		"[in_i]": {factor: 2.54}, "m": {factor: 100}, "mm": {factor: 0.1}, "[ft_i]": {factor: 30.48}}},
	"9843-4":  {canonical: "cm", from: map[string]conversion{"[in_i]": {factor: 2.54}}},                        // head circumference
	"39156-5": {canonical: "kg/m2", from: map[string]conversion{}},                                             // BMI
	"3151-8":  {canonical: "L/min", from: map[string]conversion{"mL/min": {factor: 0.001}, "l/min": identity}}, // inhaled O2 flow
	"9269-2":  {canonical: "{score}", from: map[string]conversion{"1": identity}},                              // GCS total
}

// toCanonical converts value in the UCUM code to the canonical unit of loinc. ok is false when the
// code is not one the table converts; known is false when loinc is not in the table.
func toCanonical(loinc, code string, value float64) (x float64, unit string, known, ok bool) {
	vu, known := vitalUnits[loinc]
	if !known {
		return value, code, false, true
	}
	c := stripAnnotations(code)
	if c == vu.canonical || code == vu.canonical {
		return value, vu.canonical, true, true
	}
	conv, ok := vu.from[c]
	if !ok {
		return 0, vu.canonical, true, false
	}
	if conv == identity {
		return value, vu.canonical, true, true
	}
	x = value*conv.factor + conv.offset
	return math.Round(x*1e4) / 1e4, vu.canonical, true, true
}

// stripAnnotations drops UCUM annotations ({beats}/min is /min, %{HemoglobinSaturation} is %):
// they carry no meaning for conversion. An annotation alone is the unity 1, except {score},
// which is the canonical unit of scores.
func stripAnnotations(code string) string {
	if !strings.Contains(code, "{") || code == "{score}" {
		return code
	}
	var b strings.Builder
	depth := 0
	for _, r := range code {
		switch {
		case r == '{':
			depth++
		case r == '}' && depth > 0:
			depth--
		case depth == 0:
			b.WriteRune(r)
		}
	}
	if b.Len() == 0 {
		return "1"
	}
	return b.String()
}
