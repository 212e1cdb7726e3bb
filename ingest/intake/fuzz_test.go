package intake

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	jsonv1 "github.com/go-json-experiment/json/v1"

	"carehub/kernel/fault"
)

// FuzzIntakeParser feeds arbitrary bytes to the intake's parsers as each body format reads
// them: one Observation, a Bundle (readDocument, then each entry), and NDJSON lines. Nothing
// panics; a malformed document is a 400; and every observation accepted is JSON that Postgres
// stores (UTF-8, no \u0000, no unpaired surrogate) with a FHIR patient id, a finite value and a
// time within the intake's bounds.
func FuzzIntakeParser(f *testing.F) {
	valid := `{"resourceType":"Observation","status":"final","category":[{"coding":[{"system":"http://terminology.hl7.org/CodeSystem/observation-category","code":"vital-signs"}]}],` +
		`"code":{"coding":[{"system":"http://loinc.org","code":"8867-4"}]},"subject":{"reference":"Patient/pat_01ke9nk500cmm0mhj9psxg961n"},` +
		`"effectiveDateTime":"2026-11-01T08:30:00Z","valueQuantity":{"value":72,"unit":"/min"}}`
	for _, s := range []string{valid,
		`{"resourceType":"Bundle","type":"batch","entry":[{"resource":` + valid + `},{"resource":null},{"request":{"method":"POST","url":"Observation"},"resource":` + valid + `}]}`,
		`{"resourceType":"Bundle","type":"transaction","entry":null}`, `{"resourceType":"Bundle","entry":{}}`,
		valid + "\n\n" + valid + "\n", strings.Replace(valid, "72", "1e400", 1), strings.Replace(valid, "final", `fin\u0000al`, 1),
		strings.Replace(valid, "/min", `\ud800`, 1), strings.Replace(valid, "2026-11-01T08:30:00Z", "1899-12-31T23:59:59Z", 1),
		strings.Replace(valid, "2026-11-01T08:30:00Z", "9999-01-01T00:00:00Z", 1), strings.Replace(valid, "pat_01ke9nk500cmm0mhj9psxg961n", "../x", 1),
		`{"resourceType":1}`, `{}`, `[]`, `{} {}`, "\xff", "", `{"resourceType":"Observation","valueQuantity":{"value":"x"}}`} {
		f.Add([]byte(s))
	}
	lim := limits{now: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC), maxFuture: time.Hour}
	check := func(t *testing.T, raw []byte) {
		m, e := parseObservation(raw, lim)
		if e != nil {
			if e.Code == "" || e.Message == "" {
				t.Fatalf("%q: empty entry error %+v", raw, e)
			}
			return
		}
		if msg := unstorableJSON(raw); msg != "" || !json.Valid(raw) {
			t.Fatalf("accepted %q, which Postgres cannot store (%s)", raw, msg)
		}
		if !validFHIRID(m.PatientID) || math.IsNaN(m.Value) || math.IsInf(m.Value, 0) ||
			m.EffectiveAt.Before(earliestEffective) || m.EffectiveAt.After(lim.now.Add(lim.maxFuture)) {
			t.Fatalf("accepted %q as %+v", raw, m)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		check(t, data)

		doc, err := readDocument(data, 50)
		if err != nil {
			if fault.KindOf(err) != fault.KindInvalid {
				t.Fatalf("%q: %v is not a 400", data, err)
			}
		} else if len(doc.entries) > 50 {
			t.Fatalf("%d entries kept past the limit", len(doc.entries))
		}
		for _, e := range doc.entries {
			if e.err == nil {
				check(t, e.raw)
			}
		}

		br := bufio.NewReaderSize(bytes.NewReader(data), MaxEntryBytes+2)
		for {
			line, tooLong, err := readLine(br)
			if line = bytes.TrimSpace(line); len(line) > 0 && !tooLong {
				check(t, line)
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("readLine: %v", err)
			}
		}
	})
}

// FuzzObservationDecodeMatchesEncodingJSON checks the decoder parseEntry uses
// (go-json-experiment's encoding/json-compatible one) against encoding/json itself: for any
// input both accept or both refuse it, and what both accept decodes alike.
func FuzzObservationDecodeMatchesEncodingJSON(f *testing.F) {
	f.Add([]byte(`{"resourceType":"Observation","status":"final","code":{"coding":[{"system":"http://loinc.org","code":"8867-4"}]},` +
		`"subject":{"reference":"Patient/pat_1"},"effectiveDateTime":"2026-11-01T08:30:00Z","valueQuantity":{"value":72,"unit":"/min"},"component":[{}]}`))
	f.Add([]byte(`{"STATUS":"final","status":null,"Code":{"coding":null},"valueQuantity":{"value":"72"},"id":"a\u00e9\ud800","x":[1,{"y":2}]}`))
	f.Add([]byte(`{"resourceType":"Observation","valueQuantity":{"value":1e400}}`))
	f.Add([]byte("{\"status\":\"\xff\",\"identifier\":[{\"value\":1}],\"category\":[{\"text\":\"t\"}]}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var got, want fhirObservation
		err, wantErr := jsonv1.Unmarshal(data, &got), json.Unmarshal(data, &want)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("%q: error %v, encoding/json: %v", data, err, wantErr)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\n%+v\nencoding/json:\n%+v", data, got, want)
		}
	})
}
