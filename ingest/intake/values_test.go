package intake

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/ids"
	"carehub/schemas/kafka/observation"
)

func loincCode(code string) map[string]any {
	return map[string]any{"coding": []any{map[string]any{"system": LOINCSystem, "code": code}}}
}

func ucum(v float64, unit, code string) map[string]any {
	return map[string]any{"value": v, "unit": unit, "system": UCUMSystem, "code": code}
}

// TestFHIRValues: UCUM by system and code, the unit conversions devices use, value[x] forms,
// dataAbsentReason, effective[x] and component, each with the element its error names.
func TestFHIRValues(t *testing.T) {
	lim := limits{now: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC), maxFuture: time.Hour}
	vital := func(code string, q map[string]any) func(map[string]any) {
		return func(o map[string]any) { o["code"], o["valueQuantity"] = loincCode(code), q }
	}
	tests := []struct {
		name  string
		edit  func(map[string]any)
		code  string  // "" = valid
		in    string  // the error message names this element
		value float64 // stored, when valid and noValue is false
		unit  string
		none  bool // stored without a value
		parts int
	}{
		{name: "UCUM code decides, unit is display", edit: vital("8867-4", ucum(44, "beats/minute", "/min")), value: 44, unit: "/min"},
		{name: "UCUM annotation", edit: vital("9279-1", ucum(26, "breaths/minute", "{breaths}/min")), value: 26, unit: "/min"},
		{name: "UCUM code wins over a wrong display unit", edit: vital("8867-4", ucum(44, "mm[Hg]", "/min")), value: 44, unit: "/min"},
		{name: "UCUM code that does not fit", edit: vital("8867-4", ucum(44, "beats/minute", "mm[Hg]")), code: CodeInvalidValue, in: "valueQuantity"},
		{name: "UCUM system without code", edit: vital("8867-4", map[string]any{"value": 44, "unit": "/min", "system": UCUMSystem}), code: CodeInvalidValue, in: "valueQuantity.code"},
		{name: "display spelling is not UCUM", edit: vital("8867-4", ucum(44, "bpm", "bpm")), code: CodeInvalidValue, in: "valueQuantity"},
		{name: "another unit system for a vital", edit: vital("8867-4", map[string]any{"value": 44, "system": "urn:acme", "code": "bpm"}), code: CodeInvalidValue, in: "valueQuantity.system"},
		{name: "degF to Cel", edit: vital("8310-5", ucum(98.6, "F", "[degF]")), value: 37, unit: "Cel"},
		{name: "Cel as sent", edit: vital("8310-5", ucum(36.5, "C", "Cel")), value: 36.5, unit: "Cel"},
		{name: "kPa to mm[Hg]", edit: bp(ucum(16, "kPa", "kPa"), ucum(10, "kPa", "kPa")), none: true, parts: 2},
		{name: "lb to kg", edit: vital("29463-7", ucum(185, "lbs", "[lb_av]")), value: 83.9146, unit: "kg"},
		{name: "in to cm", edit: vital("8302-2", ucum(66.9, "in", "[in_i]")), value: 169.926, unit: "cm"},
		{name: "SpO2 %", edit: vital("59408-5", ucum(95, "%", "%")), value: 95, unit: "%"},
		{name: "SpO2 as a fraction", edit: vital("59408-5", ucum(0.95, "", "1")), value: 95, unit: "%"},
		{name: "SpO2 annotated %", edit: vital("59408-5", ucum(97, "%", "%{HemoglobinSaturation}")), value: 97, unit: "%"},
		{name: "SpO2 over 100 %", edit: vital("59408-5", ucum(1.2, "", "1")), code: CodeInvalidValue, in: "valueQuantity"},
		{name: "BMI", edit: vital("39156-5", ucum(16.2, "kg/m2", "kg/m2")), value: 16.2, unit: "kg/m2"},
		{name: "legacy display unit without system", edit: vital("8480-6", map[string]any{"value": 120, "unit": "mmHg"}), value: 120, unit: "mm[Hg]"},
		{name: "unknown code keeps its unit", edit: vital("2339-0", ucum(5.4, "mmol/L", "mmol/L")), value: 5.4, unit: "mmol/L"},
		{name: "BP panel", edit: bp(ucum(107, "mmHg", "mm[Hg]"), ucum(60, "mmHg", "mm[Hg]")), none: true, parts: 2},
		{name: "BP panel with an absent diastolic", edit: func(o map[string]any) {
			bp(ucum(107, "mmHg", "mm[Hg]"), nil)(o)
			c := o["component"].([]any)[1].(map[string]any)
			delete(c, "valueQuantity")
			c["dataAbsentReason"] = map[string]any{"coding": []any{map[string]any{"system": "http://terminology.hl7.org/CodeSystem/data-absent-reason", "code": "not-performed"}}}
		}, none: true, parts: 1},
		{name: "BP component in the wrong unit", edit: bp(ucum(107, "mmHg", "mm[Hg]"), ucum(60, "", "/min")), code: CodeInvalidValue, in: "component[1].valueQuantity"},
		{name: "BP component without a value", edit: bp(ucum(107, "mmHg", "mm[Hg]"), nil), code: CodeInvalidValue, in: "component[1].valueQuantity"},
		{name: "component without code", edit: func(o map[string]any) {
			o["component"] = []any{map[string]any{"valueString": "x"}}
		}, code: CodeMissingCode, in: "component[0].code"},
		{name: "component of the wrong type", edit: func(o map[string]any) { o["component"] = []any{map[string]any{"code": 1}} }, code: CodeInvalidValue, in: "component[0]"},
		{name: "dataAbsentReason without value", edit: func(o map[string]any) {
			delete(o, "valueQuantity")
			o["dataAbsentReason"] = map[string]any{"text": "patient refused"}
		}, none: true},
		{name: "dataAbsentReason with a value", edit: func(o map[string]any) {
			o["dataAbsentReason"] = map[string]any{"text": "patient refused"}
		}, code: CodeInvalidValue, in: "dataAbsentReason"},
		{name: "valueCodeableConcept for a coded observation", edit: func(o map[string]any) {
			delete(o, "valueQuantity")
			o["code"] = loincCode("72166-2") // tobacco smoking status
			o["valueCodeableConcept"] = map[string]any{"coding": []any{map[string]any{"system": "http://snomed.info/sct", "code": "8517006"}}}
		}, none: true},
		{name: "valueString", edit: func(o map[string]any) {
			delete(o, "valueQuantity")
			o["code"] = loincCode("8251-1") // service comment
			o["valueString"] = "patient moving"
		}, none: true},
		{name: "valueCodeableConcept for a quantity vital", edit: func(o map[string]any) {
			delete(o, "valueQuantity")
			o["valueCodeableConcept"] = map[string]any{"text": "fast"}
		}, code: CodeInvalidValue, in: "valueQuantity"},
		{name: "two value[x]", edit: func(o map[string]any) { o["valueString"] = "72" }, code: CodeInvalidValue, in: "value[x]"},
		{name: "effectivePeriod", edit: func(o map[string]any) {
			delete(o, "effectiveDateTime")
			o["effectivePeriod"] = map[string]any{"start": "2026-11-01T08:00:00Z", "end": "2026-11-01T08:30:00Z"}
		}, value: 72.5, unit: "/min"},
		{name: "effectivePeriod without start or end", edit: func(o map[string]any) {
			delete(o, "effectiveDateTime")
			o["effectivePeriod"] = map[string]any{}
		}, code: CodeInvalidEffective, in: "effectivePeriod"},
		{name: "effectiveInstant", edit: func(o map[string]any) {
			delete(o, "effectiveDateTime")
			o["effectiveInstant"] = "2026-11-01T08:30:00.123Z"
		}, value: 72.5, unit: "/min"},
		{name: "effectiveInstant of a date", edit: func(o map[string]any) {
			delete(o, "effectiveDateTime")
			o["effectiveInstant"] = "2026-11-01"
		}, code: CodeInvalidEffective, in: "effectiveInstant"},
		{name: "effectiveTiming", edit: func(o map[string]any) {
			delete(o, "effectiveDateTime")
			o["effectiveTiming"] = map[string]any{}
		}, code: CodeInvalidEffective, in: "effectiveTiming"},
		{name: "two effective[x]", edit: func(o map[string]any) { o["effectiveInstant"] = "2026-11-01T08:30:00Z" }, code: CodeInvalidEffective, in: "effective[x]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := base()
			tt.edit(o)
			raw, err := json.Marshal(o)
			if err != nil {
				t.Fatal(err)
			}
			p, e := parseEntry(raw, lim)
			switch {
			case tt.code == "" && e != nil:
				t.Fatalf("rejected %s: %s", e.Code, e.Message)
			case tt.code != "" && e == nil:
				t.Fatalf("accepted; want %s", tt.code)
			case tt.code != "" && (e.Code != tt.code || !strings.Contains(e.Message, tt.in)):
				t.Fatalf("%s %q; want %s naming %s", e.Code, e.Message, tt.code, tt.in)
			case tt.code != "":
				return
			}
			m := p.msg
			if m.NoValue != tt.none || !tt.none && (m.Value != tt.value || m.Unit != tt.unit) {
				t.Fatalf("stored value %v %q (noValue %v); want %v %q (noValue %v)", m.Value, m.Unit, m.NoValue, tt.value, tt.unit, tt.none)
			}
			if len(p.parts) != tt.parts {
				t.Fatalf("%d parts; want %d", len(p.parts), tt.parts)
			}
		})
	}
}

// bp makes an Observation a blood-pressure panel whose systolic and diastolic components have
// the given valueQuantity (nil: none).
func bp(sys, dia map[string]any) func(map[string]any) {
	return func(o map[string]any) {
		delete(o, "valueQuantity")
		o["code"] = loincCode("85354-9")
		o["component"] = []any{
			map[string]any{"code": loincCode("8480-6"), "valueQuantity": sys},
			map[string]any{"code": loincCode("8462-4"), "valueQuantity": dia},
		}
	}
}

// TestPartMessages: a BP panel's systolic and diastolic are stored as observations of their own,
// in mm[Hg], derived from the panel, with ids that depend only on the panel's.
func TestPartMessages(t *testing.T) {
	o := base()
	bp(ucum(16, "kPa", "kPa"), ucum(60, "mmHg", "mm[Hg]"))(o)
	raw, _ := json.Marshal(o)
	p, e := parseEntry(raw, limits{now: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC), maxFuture: time.Hour})
	if e != nil {
		t.Fatal(e.Message)
	}
	p.msg.ID, p.msg.OrgID, p.msg.ReceivedAt = "obs_01ke9nk500cmm0mhj9psxg961n", "org_1", time.Now()
	parts, err := partMessages(&p.msg, p.parts)
	if err != nil || len(parts) != 2 {
		t.Fatalf("%d parts, %v", len(parts), err)
	}
	again, _ := partMessages(&p.msg, p.parts)
	for i, want := range []struct {
		loinc string
		value float64
	}{{"8480-6", 120.0099}, {"8462-4", 60}} {
		m := parts[i]
		if m.LOINC != want.loinc || m.Code != want.loinc || m.Value != want.value || m.Unit != "mm[Hg]" || m.NoValue || m.ClientID != "" {
			t.Fatalf("part %d: %+v", i, m)
		}
		if m.ID == p.msg.ID || m.ID != again[i].ID {
			t.Fatalf("part %d id %s: not derived from the panel's", i, m.ID)
		}
		var r struct {
			ResourceType string `json:"resourceType"`
			Status       string `json:"status"`
			Code         concept
			Subject      reference
			Effective    string `json:"effectiveDateTime"`
			DerivedFrom  []reference
		}
		if err := json.Unmarshal(m.Observation, &r); err != nil {
			t.Fatal(err)
		}
		if r.ResourceType != "Observation" || r.Status != "final" || r.Code.Coding[0].Code != want.loinc || r.Subject.Reference != "Patient/pat_01ke9nk500cmm0mhj9psxg961n" ||
			r.Effective == "" || len(r.DerivedFrom) != 1 || r.DerivedFrom[0].Reference != "Observation/"+p.msg.ID {
			t.Fatalf("part %d resource %s", i, m.Observation)
		}
		if _, err := observation.DecodeMessage(m.AppendJSON(nil)); err != nil {
			t.Fatalf("part %d: %v", i, err)
		}
	}
}

// TestRecordsHoldEachMessage: the records of a request share their buffers, yet each holds its
// own message under its patient's key, panels' parts (more records than observations, past the
// shared slice of records) included, and what a later record appends leaves earlier ones as
// they were.
func TestRecordsHoldEachMessage(t *testing.T) {
	o := base()
	bp(ucum(120, "mmHg", "mm[Hg]"), ucum(60, "mmHg", "mm[Hg]"))(o)
	panel, _ := json.Marshal(o)
	single, _ := json.Marshal(base())
	lim := limits{now: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC), maxFuture: time.Hour}
	var msgs []parsed
	for i, raw := range [][]byte{panel, single, panel} {
		p, e := parseEntry(raw, lim)
		if e != nil {
			t.Fatal(e.Message)
		}
		p.msg.ID, p.msg.OrgID, p.msg.ReceivedAt = ids.New(ids.Observation), "org_1", time.Now().UTC()
		p.msg.PatientID = []string{"pat_a", "pat_b", "pat_a"}[i]
		msgs = append(msgs, p)
	}
	rq := &request{in: &Intake{cfg: Config{Topic: "observations"}}}
	b := rq.newRecords(msgs)
	var want []observation.Message
	var recs []*kgo.Record
	for i := range msgs {
		parts, err := partMessages(&msgs[i].msg, msgs[i].parts)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range append([]observation.Message{msgs[i].msg}, parts...) {
			want = append(want, m)
			recs = append(recs, b.add(&m))
		}
	}
	if len(recs) != 7 {
		t.Fatalf("%d records, want 7 (two panels of three, one single)", len(recs))
	}
	for i, r := range recs {
		got, err := observation.DecodeMessage(r.Value)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if got.ID != want[i].ID || got.Code != want[i].Code || got.Value != want[i].Value || string(r.Key) != want[i].PatientID || r.Topic != "observations" {
			t.Errorf("record %d: key %s, %+v; want %+v", i, r.Key, got, want[i])
		}
	}
}
