package intake

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
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

// FuzzReadDocumentMatchesEncodingJSON: readDocument reads any body as the encoding/json decoder
// it replaced did: the same resourceType, type, entries (each resource's bytes, each entry's
// error) and limit, and a 400 for the same bodies, with the same message where the body is JSON.
func FuzzReadDocumentMatchesEncodingJSON(f *testing.F) {
	obs := `{"resourceType":"Observation","status":"final"}`
	for _, s := range []string{obs,
		`{"resourceType":"Bundle","type":"batch","entry":[{"resource":` + obs + `},{"resource":null},{"request":{"method":"POST","url":"Observation"},"resource":` + obs + `}]}`,
		`{"resourceType":"Bundle","type":"transaction","entry":null}`, `{"resourceType":"Bundle","entry":{}}`, `{"entry":"x"}`,
		` { "Resource\u0054ype" : "Bundle" , "entry" : [ null , 1 , "x" , [] , { "RESOURCE" : { } , "request" : null } , {"request":{"method":"GET"},"resource":{}} ] } `,
		`{"entry":[{"request":{"method":1},"resource":{}},{"request":"x","resource":{}},{"request":{"method":"POST"},"request":{"url":"a/Observation"},"resource":{}}]}`,
		`{"entry":[{"resource":{"a":1}},{"resource":{"a":2}},{"resource":{"a":3}},{"resource":{"a":4}}]}`,
		`{"resourceType":1,"type":null,"resourceType":"Bundle"}`, `{}`, `[]`, `{} {}`, `{"a":}`, "\xff", "", `"x"`, `{"entry":[{"resource":"\xff"}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := readDocument(data, 3)
		want, wantErr := readDocumentEncodingJSON(data, 3)
		switch {
		case (err == nil) != (wantErr == nil):
			t.Fatalf("%q: error %v, encoding/json's %v", data, err, wantErr)
		case err != nil && json.Valid(data) && err.Error() != wantErr.Error():
			t.Fatalf("%q: error %v, encoding/json's %v", data, err, wantErr)
		case err == nil && !reflect.DeepEqual(got, want):
			t.Fatalf("%q:\n%+v\nencoding/json's:\n%+v", data, got, want)
		}
	})
}

// readDocumentEncodingJSON is readDocument as it was up to 2026-11-27, on encoding/json's
// streaming decoder: the reference FuzzReadDocumentMatchesEncodingJSON holds readDocument to.
func readDocumentEncodingJSON(data []byte, maxEntries int) (document, error) {
	var doc document
	bad := func(err error) (document, error) {
		msg := "the body must be a FHIR Observation or Bundle as a JSON object"
		if err != nil {
			msg += ": " + strings.TrimPrefix(err.Error(), "json: ")
		}
		return document{}, fault.Invalid("%s", msg)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return bad(err)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return bad(err)
		}
		switch tok {
		case "resourceType":
			err = dec.Decode(&doc.resourceType)
		case "type":
			err = dec.Decode(&doc.bundleType)
		case "entry":
			err = readEntriesEncodingJSON(dec, &doc, maxEntries)
		default:
			var skip json.RawMessage
			err = dec.Decode(&skip)
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && (tok == "resourceType" || tok == "type") {
			err = nil // a non-string resourceType or type is judged below, like a wrong one
		}
		if err != nil {
			return bad(err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return bad(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return bad(errors.New("data after the object"))
	}
	return doc, nil
}

// bundleEntryEncodingJSON is one element of Bundle.entry.
type bundleEntryEncodingJSON struct {
	Resource json.RawMessage `json:"resource"`
	Request  *struct {
		Method string `json:"method"`
		URL    string `json:"url"`
	} `json:"request"`
}

// readEntries reads the entry array, one entry at a time; past maxEntries it only skips.
func readEntriesEncodingJSON(dec *json.Decoder, doc *document, maxEntries int) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		return nil // "entry": null
	}
	if tok != json.Delim('[') {
		return errors.New("Bundle.entry must be an array")
	}
	for i := 0; dec.More(); i++ {
		if i >= maxEntries {
			doc.tooMany = true
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return err
			}
			continue
		}
		var e bundleEntryEncodingJSON
		err := dec.Decode(&e)
		var te *json.UnmarshalTypeError
		if err != nil && !errors.As(err, &te) {
			return err
		}
		x := entry{index: i}
		switch {
		case err != nil:
			x.err = entryErr(CodeInvalidEntry, "the entry must be an object with a resource (and optionally a request)")
		case len(e.Resource) == 0 || string(e.Resource) == "null":
			x.err = entryErr(CodeInvalidEntry, "the entry has no resource")
		case e.Request != nil && (e.Request.Method != http.MethodPost || !(e.Request.URL == "Observation" || strings.HasSuffix(e.Request.URL, "/Observation"))):
			x.err = entryErr(CodeInvalidEntry, "only POST Observation entries are accepted")
		default:
			x.raw = e.Resource
		}
		doc.entries = append(doc.entries, x)
	}
	_, err = dec.Token() // the closing bracket
	return err
}

// BenchmarkReadDocument reads a Bundle of 100 device observations (what the load test's devices
// send) with readDocument and with the encoding/json decoder it replaced.
func BenchmarkReadDocument(b *testing.B) {
	obs := `{"resourceType":"Observation","status":"final","category":[{"coding":[{"system":"http://terminology.hl7.org/CodeSystem/observation-category","code":"vital-signs"}]}],` +
		`"code":{"coding":[{"system":"http://loinc.org","code":"8867-4","display":"Heart rate"}]},"subject":{"reference":"Patient/pat_01ke9nk500cmm0mhj9psxg961n"},` +
		`"device":{"display":"bedside monitor 12"},"effectiveDateTime":"2026-11-01T08:30:00Z","valueQuantity":{"value":72,"unit":"/min","system":"http://unitsofmeasure.org","code":"/min"}}`
	entries := make([]string, 100)
	for i := range entries {
		entries[i] = `{"resource":` + obs + `,"request":{"method":"POST","url":"Observation"}}`
	}
	body := []byte(`{"resourceType":"Bundle","type":"batch","entry":[` + strings.Join(entries, ",") + `]}`)
	for _, read := range []struct {
		name string
		fn   func([]byte, int) (document, error)
	}{{"jsonwire", readDocument}, {"encoding-json", readDocumentEncodingJSON}} {
		b.Run(read.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if doc, err := read.fn(body, 1000); err != nil || len(doc.entries) != 100 {
					b.Fatal(err)
				}
			}
		})
	}
}
