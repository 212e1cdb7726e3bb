package intake

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	jsonv1 "github.com/go-json-experiment/json/v1"

	"carehub/kernel/jsonwire"
)

// fastSeeds are observations in the shapes devices send, each of which the fast path decodes.
func fastSeeds(t testing.TB) []string {
	raw, err := json.Marshal(base())
	if err != nil {
		t.Fatal(err)
	}
	indented, _ := json.MarshalIndent(base(), "", "\t")
	return []string{string(raw), string(indented), " \r\n" + string(raw) + "\n",
		`{"resourceType":"Observation","status":"final","code":{"coding":[{"system":"http://loinc.org","code":"85354-9","display":"Blood pressure"}],"text":"BP"},` +
			`"subject":{"reference":"Patient/pat_1","display":"Ana"},"effectivePeriod":{"start":"2026-11-01T08:30:00Z","end":"2026-11-01T08:31:00Z"},` +
			`"identifier":[{"system":"urn:dev","value":"r-1"}],"meta":{"profile":["http://hl7.org/fhir/StructureDefinition/vitalsigns"]},"issued":"2026-11-01T08:31:00Z",` +
			`"component":[{"code":{"coding":[{"system":"http://loinc.org","code":"8480-6"}]},"valueQuantity":{"value":107,"unit":"mmHg","system":"http://unitsofmeasure.org","code":"mm[Hg]"}},` +
			`{"code":{"coding":[{"system":"http://loinc.org","code":"8462-4"}]},"valueQuantity":{"value":6.0e1,"unit":"mmHg"}}]}`,
		`{"resourceType":"Observation","id":"x","status":"final","code":{"coding":[]},"category":[],"valueCodeableConcept":{"coding":[{"code":"a"}]},` +
			`"effectiveInstant":"2026-11-01T08:30:00.5Z","device":{"reference":"Device/d1"},"note":[{"text":"héllo ✓"}],"text":{"div":"<div xmlns=\"http://www.w3.org/1999/xhtml\">72 \u2665\/min\n</div>"},"extra":[true,false,null,-0.5e-3,{}]}`,
		`{"resourceType":"Observation","status":"unknown","code":{"coding":[{"code":"x"}]},"dataAbsentReason":{"text":"off"},"valueString":"n/a","effectiveTiming":{"repeat":{"count":2}}}`,
		// Every element at once and several of each: codings, concepts, references, each
		// effective[x] and value[x].
		`{"resourceType":"Observation","status":"final","category":[{"coding":[{"system":"s1","code":"c1"},{"system":"s2","code":"c2"},{"system":"s3"}],"text":"t1"},{"text":"t2"},{"coding":[]}],` +
			`"code":{"coding":[{"system":"http://loinc.org","code":"8867-4"},{"code":"hr"}],"text":"HR"},"subject":{"reference":"Patient/p","display":"P"},"device":{"display":"d"},` +
			`"valueCodeableConcept":{"coding":[{"code":"v"}]},"dataAbsentReason":{"coding":[{"system":"s","code":"x"}],"text":"why"},` +
			`"effectivePeriod":{"start":"2026-11-01T08:30:00Z"},"effectiveDateTime":"2026-11-01T08:30:00Z","effectiveInstant":"2026-11-01T08:30:00Z","valueString":"s","id":"i"}`,
		`{}`,
	}
}

// TestFastObservation: the shapes devices send take the fast path and decode as jsonv1 decodes
// them; what the fast path does not take (another case, a name twice, null, an escape, a value
// of another type, nesting, not JSON) decodeObservation leaves to jsonv1, error and all.
func TestFastObservation(t *testing.T) {
	for _, s := range fastSeeds(t) {
		var fast, want fhirObservation
		if !fastObservation([]byte(s), &fast) {
			t.Errorf("not on the fast path: %s", s)
			continue
		}
		if err := jsonv1.Unmarshal([]byte(s), &want); err != nil || !reflect.DeepEqual(fast, want) {
			t.Errorf("%s:\nfast   %+v\njsonv1 %+v (%v)", s, fast, want, err)
		}
	}
	valid := fastSeeds(t)[0]
	for _, s := range []string{
		strings.Replace(valid, `"status"`, `"Status"`, 1),
		strings.Replace(valid, `"status"`, `"sta_tus"`, 1),
		strings.Replace(valid, `"valueQuantity"`, `"valueQuantıty"`, 1),
		strings.Replace(valid, `"status":"final"`, `"status":"final","status":"amended"`, 1),
		strings.Replace(valid, `"status":"final"`, `"status":null`, 1),
		strings.Replace(valid, `"status":"final"`, `"status":7`, 1),
		strings.Replace(valid, `"final"`, `"fin\u0061l"`, 1),
		strings.Replace(valid, `"/min"`, `"\/min"`, 1),
		strings.Replace(valid, `72.5`, `"72.5"`, 1),
		strings.Replace(valid, `72.5`, `1e400`, 1),
		strings.Replace(valid, `72.5`, `072`, 1),
		strings.Replace(valid, `"code":{`, `"code":[{`, 1),
		`{"resourceType":"Observation","x":` + strings.Repeat("[", jsonwire.MaxReaderDepth) + strings.Repeat("]", jsonwire.MaxReaderDepth) + `}`,
		valid + `x`, valid + valid, `{"a":1,}`, `{"a" 1}`, `[]`, `"x"`, ``, `{"a":tru}`, `{"a":-}`, `{"a":1.}`, `{"a":1e}`, "{\"a\":\"\x01\"}",
	} {
		var fast fhirObservation
		if fastObservation([]byte(s), &fast) {
			t.Errorf("fast path took %s", s)
		}
		var o, want fhirObservation
		err, wantErr := decodeObservation([]byte(s), &o), jsonv1.Unmarshal([]byte(s), &want)
		if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() || !reflect.DeepEqual(o, want) {
			t.Errorf("%s: decodeObservation %+v (%v), jsonv1 %+v (%v)", s, o, err, want, wantErr)
		}
	}
}

// FuzzFastObservation holds the fast path to jsonv1: whatever it decodes, jsonv1 decodes
// without error into the same value.
func FuzzFastObservation(f *testing.F) {
	for _, s := range fastSeeds(f) {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"STATUS":"final","status":null,"Code":{"coding":null},"valueQuantity":{"value":"72"},"id":"a\u00e9\ud800","x":[1,{"y":2}]}`))
	f.Add([]byte("{\"status\":\"\xff\",\"identifier\":[{\"value\":1}],\"category\":[{\"text\":\"t\"}]}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var fast, want fhirObservation
		if !fastObservation(data, &fast) {
			return
		}
		if err := jsonv1.Unmarshal(data, &want); err != nil {
			t.Fatalf("%q: the fast path decoded what jsonv1 refuses: %v", data, err)
		}
		if !reflect.DeepEqual(fast, want) {
			t.Fatalf("%q:\nfast   %+v\njsonv1 %+v", data, fast, want)
		}
	})
}
