package intake

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"carehub/kernel/ids"
)

func base() map[string]any {
	return map[string]any{
		"resourceType": "Observation",
		"id":           "device-7.reading-42",
		"status":       "final",
		"category": []any{map[string]any{"coding": []any{map[string]any{
			"system": "http://terminology.hl7.org/CodeSystem/observation-category", "code": "vital-signs"}}}},
		"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4"}}},
		"subject":           map[string]any{"reference": "Patient/pat_01ke9nk500cmm0mhj9psxg961n"},
		"effectiveDateTime": "2026-11-01T08:30:00.250+01:00",
		"valueQuantity":     map[string]any{"value": 72.5, "unit": "/min"},
		"device":            map[string]any{"display": "wearable"},
	}
}

func TestParseObservation(t *testing.T) {
	lim := limits{now: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC), maxFuture: time.Hour}
	set := func(path string, v any) func(map[string]any) {
		return func(o map[string]any) {
			parts := strings.Split(path, ".")
			m := o
			for _, p := range parts[:len(parts)-1] {
				m = m[p].(map[string]any)
			}
			if v == nil {
				delete(m, parts[len(parts)-1])
			} else {
				m[parts[len(parts)-1]] = v
			}
		}
	}
	tests := []struct {
		name string
		edit func(map[string]any)
		raw  string // used instead of the edited base when set
		code string // "" = valid
	}{
		{name: "valid", edit: func(map[string]any) {}},
		{name: "fahrenheit temperature converts and passes", edit: func(o map[string]any) {
			o["code"] = map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8310-5"}}}
			o["valueQuantity"] = map[string]any{"value": 98.6, "unit": "[degF]"}
		}},
		{name: "unknown LOINC code is not range-checked", edit: func(o map[string]any) {
			o["code"] = map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "2339-0"}}}
			o["valueQuantity"] = map[string]any{"value": 12000, "unit": "mg/dL"}
		}},
		{name: "non-vital code without LOINC", edit: func(o map[string]any) {
			delete(o, "category")
			o["code"] = map[string]any{"coding": []any{map[string]any{"system": "urn:device:acme", "code": "steps"}}}
			o["valueQuantity"] = map[string]any{"value": 4000, "code": "{steps}"}
		}},
		{name: "every status of the value set", edit: set("status", "entered-in-error")},
		{name: "malformed JSON", raw: `{"resourceType":"Observation",`, code: CodeInvalidJSON},
		{name: "not an object", raw: `[1,2]`, code: CodeInvalidJSON},
		{name: "NUL escape", raw: `{"resourceType":"Observation","note":[{"text":"a\u0000b"}]}`, code: CodeInvalidJSON},
		{name: "lone surrogate", raw: `{"resourceType":"Observation","note":[{"text":"\ud800x"}]}`, code: CodeInvalidJSON},
		{name: "invalid UTF-8", raw: "{\"resourceType\":\"Observation\",\"x\":\"\xff\"}", code: CodeInvalidJSON},
		{name: "too large", raw: `{"resourceType":"Observation","x":"` + strings.Repeat("a", MaxEntryBytes) + `"}`, code: CodeEntryTooLarge},
		{name: "another resource type", edit: set("resourceType", "Patient"), code: CodeInvalidResource},
		{name: "missing resource type", edit: set("resourceType", nil), code: CodeInvalidResource},
		{name: "identifier not an array", edit: set("identifier", "x"), code: CodeInvalidResource},
		{name: "id not a FHIR id", edit: set("id", "has spaces"), code: CodeInvalidID},
		{name: "id of another type", edit: set("id", 7), code: CodeInvalidID},
		{name: "missing status", edit: set("status", nil), code: CodeInvalidStatus},
		{name: "status outside the value set", edit: set("status", "done"), code: CodeInvalidStatus},
		{name: "status of another type", edit: set("status", 1), code: CodeInvalidStatus},
		{name: "missing code", edit: set("code", nil), code: CodeMissingCode},
		{name: "empty coding", edit: set("code", map[string]any{"coding": []any{}}), code: CodeMissingCode},
		{name: "coding without code", edit: set("code", map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org"}}}), code: CodeMissingCode},
		{name: "vital signs without LOINC", edit: set("code", map[string]any{"coding": []any{map[string]any{"system": "urn:x", "code": "hr"}}}), code: CodeMissingCode},
		{name: "vital LOINC code under another system", edit: func(o map[string]any) {
			delete(o, "category")
			o["code"] = map[string]any{"coding": []any{map[string]any{"system": "urn:x", "code": "8867-4"}}}
		}, code: CodeMissingCode},
		{name: "missing subject", edit: set("subject", nil), code: CodeInvalidSubject},
		{name: "subject not a patient", edit: set("subject.reference", "Group/1"), code: CodeInvalidSubject},
		{name: "absolute subject reference", edit: set("subject.reference", "https://ehr.example/fhir/Patient/1"), code: CodeInvalidSubject},
		{name: "subject of another type", edit: set("subject", "Patient/1"), code: CodeInvalidSubject},
		{name: "missing effective", edit: set("effectiveDateTime", nil), code: CodeInvalidEffective},
		{name: "effective without time zone", edit: set("effectiveDateTime", "2026-11-01T08:30:00"), code: CodeInvalidEffective},
		{name: "effective date only (vital-signs profile precision)", edit: set("effectiveDateTime", "2026-11-01")},
		{name: "effective year and month only", edit: set("effectiveDateTime", "2026-11"), code: CodeInvalidEffective},
		{name: "effective in the future", edit: set("effectiveDateTime", "2026-11-01T14:00:00Z"), code: CodeInvalidEffective},
		{name: "effective before 1900", edit: set("effectiveDateTime", "1899-12-31T23:59:59Z"), code: CodeInvalidEffective},
		{name: "missing valueQuantity", edit: set("valueQuantity", nil), code: CodeInvalidValue},
		{name: "value not a number", edit: set("valueQuantity.value", "72"), code: CodeInvalidValue},
		{name: "value missing", edit: set("valueQuantity.value", nil), code: CodeInvalidValue},
		{name: "no unit", edit: set("valueQuantity.unit", nil), code: CodeInvalidValue},
		{name: "implausible heart rate", edit: set("valueQuantity.value", 400), code: CodeInvalidValue},
		{name: "wrong unit for heart rate", edit: set("valueQuantity.unit", "mm[Hg]"), code: CodeInvalidValue},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := []byte(tt.raw)
			if tt.raw == "" {
				o := base()
				tt.edit(o)
				var err error
				if raw, err = json.Marshal(o); err != nil {
					t.Fatal(err)
				}
			}
			p, e := parseObservation(raw, lim)
			switch {
			case tt.code == "" && e != nil:
				t.Fatalf("rejected %s: %s", e.Code, e.Message)
			case tt.code != "" && e == nil:
				t.Fatalf("accepted; want %s", tt.code)
			case tt.code != "" && e.Code != tt.code:
				t.Fatalf("code %s (%s); want %s", e.Code, e.Message, tt.code)
			case tt.code != "" && e.Message == "":
				t.Fatal("no message")
			}
			if tt.code == "" && string(p.Observation) != string(raw) {
				t.Fatal("the observation is not kept byte for byte")
			}
		})
	}
}

func TestParseObservationExtracts(t *testing.T) {
	raw, _ := json.Marshal(base())
	m, e := parseObservation(raw, limits{now: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC), maxFuture: time.Hour})
	if e != nil {
		t.Fatal(e.Message)
	}
	want := time.Date(2026, 11, 1, 7, 30, 0, 250e6, time.UTC)
	if m.PatientID != "pat_01ke9nk500cmm0mhj9psxg961n" || m.Status != "final" || m.LOINC != "8867-4" || m.Code != "8867-4" ||
		m.Value != 72.5 || m.Unit != "/min" || !m.EffectiveAt.Equal(want) || m.DeviceType != "wearable" || m.ClientID != "device-7.reading-42" {
		t.Fatalf("extracted %+v", m)
	}
}

func TestUnstorableJSONEscapes(t *testing.T) {
	for raw, bad := range map[string]bool{
		`{"a":"\\u0000"}`:       false, // an escaped backslash, then the text u0000
		`{"a":"\u0000"}`:        true,
		`{"a":"\ud83d\ude00"}`:  false, // a surrogate pair
		`{"a":"\ude00"}`:        true,
		`{"a":"\ud83d\u0041"}`:  true,
		`{"a":"\ud83d"}`:        true,
		`{"a":"\"\\\n\u00e9"}`:  false,
		`{"a":"trailing \\"}`:   false,
		`{"a":"\u12"}`:          false, // malformed: left to the decoder
		`{"a":"x"}`:             false,
		`{"a":"\\\\\u0000"}`:    true,
		`{"a":"\\\\\\u0000"}`:   false,
		`{"a":"\ud83d\\ude00"}`: true,
	} {
		if got := unstorableJSON([]byte(raw)) != ""; got != bad {
			t.Errorf("unstorableJSON(%s) = %v; want %v", raw, got, bad)
		}
	}
}

func TestDerivedID(t *testing.T) {
	a := DerivedID("org_1", "id", "x")
	if a != DerivedID("org_1", "id", "x") {
		t.Fatal("not deterministic")
	}
	for _, other := range []string{DerivedID("org_2", "id", "x"), DerivedID("org_1", "key", "x"), DerivedID("org_1", "id", "y")} {
		if other == a {
			t.Fatalf("%s collides", other)
		}
	}
	if !ids.Valid(ids.Observation, a) {
		t.Fatalf("DerivedID = %q", a)
	}
}

func BenchmarkParseObservation(b *testing.B) {
	raw, _ := json.Marshal(base())
	lim := limits{now: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC), maxFuture: time.Hour}
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if _, e := parseObservation(raw, lim); e != nil {
			b.Fatal(e.Message)
		}
	}
}
