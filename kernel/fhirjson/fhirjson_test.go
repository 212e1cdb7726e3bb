package fhirjson

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
)

// rewriteByDecoding is what Rewrite did before it was one pass: decode, tidy the tree, encode.
// It is the reference the one-pass Rewrite must agree with.
func rewriteByDecoding(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	v, _ = tidyTree(v)
	return v, nil
}

func tidyTree(v any) (any, bool) {
	switch x := v.(type) {
	case nil:
		return nil, false
	case map[string]any:
		_, isResource := x["resourceType"]
		for k, e := range x {
			t, keep := tidyTree(e)
			if !keep {
				delete(x, k)
				continue
			}
			if s, ok := t.(string); ok && (k == "id" && isResource || k == "reference") {
				t = Ref(s, k == "id")
			}
			x[k] = t
		}
		return x, len(x) > 0
	case []any:
		out := x[:0]
		for _, e := range x {
			if t, keep := tidyTree(e); keep {
				out = append(out, t)
			}
		}
		return out, len(out) > 0
	}
	return v, true
}

// decodeNumbers decodes JSON as rewriteByDecoding does, for comparing.
func decodeNumbers(t testing.TB, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("Rewrite wrote what is not JSON: %v\n%s", err, b)
	}
	return v
}

var rewriteSeeds = []string{
	`{"resourceType":"Observation","id":"obs_1","subject":{"reference":"Patient/pat_2"},"note":[],"x":null,"meta":{"tag":[{}]}}`,
	`{"id":"pat_1","resourceType":"Patient","name":[{"family":"A\u00e9","given":[null,"B"]}],"link":[{"other":{"reference":"Patient/pat_3/_history/2"}}]}`,
	`{"resourceType":"Bundle","type":"searchset","entry":[{"fullUrl":"x","resource":{"resourceType":"Encounter","id":"enc_9","subject":{"reference":"urn:uuid:abc"}}}]}`,
	`{"id":"not_a_resource","reference":"Patient/pat_1","a":{"b":{"c":[[],{}]}}}`,
	`{"resourceType":"Patient","id":7,"reference":{"id":"x"}, "n": 1.50e3 , "s":" spaced \"q\" "}`,
	`{"resourceType":"Patient","identifier":[{"value":"\ud83d\ude00"}],"k\"ey":true}`,
	`{}`, `[]`, `null`, `[null,{}]`, `"pat_1"`, `12`,
}

// TestRewriteAgreesWithDecoding: the one-pass Rewrite gives what decoding, tidying and encoding
// gave, with resourceType first.
func TestRewriteAgreesWithDecoding(t *testing.T) {
	for _, s := range rewriteSeeds {
		checkRewrite(t, []byte(s))
	}
	// Synthea's patients, when they are here: every entry of real-world shape.
	files, _ := filepath.Glob(filepath.Join(os.Getenv("HOME"), ".cache", "carehub", "synthea", "fhir", "*.json"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		checkRewrite(t, b)
	}
}

func FuzzRewrite(f *testing.F) {
	for _, s := range rewriteSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		valid, validErr := AppendRewriteValid(nil, b) // on any input: no panic, no endless loop
		if !json.Valid(b) {
			if _, err := Rewrite(b); err == nil {
				t.Fatalf("Rewrite took what is not JSON: %q", b)
			}
			return
		}
		if !jsontext.Value(b).IsValid() {
			// Valid JSON that the stores never hold: invalid UTF-8 (decoding replaces it) or a
			// repeated key (decoding keeps the last; Rewrite keeps each).
			return
		}
		if got, err := Rewrite(b); validErr != nil || err != nil || !bytes.Equal(valid, got) {
			t.Fatalf("AppendRewriteValid(%.200s) = %s, %v; Rewrite = %s, %v", b, valid, validErr, got, err)
		}
		checkRewrite(t, b)
	})
}

func checkRewrite(t *testing.T, b []byte) {
	t.Helper()
	want, err := rewriteByDecoding(b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Rewrite(b)
	if err != nil {
		t.Fatalf("Rewrite(%.200s): %v", b, err)
	}
	if want == nil { // a null, or an empty top level that encoded as {} or []
		want = decodeNumbers(t, mustMarshal(t, want))
	}
	if g := decodeNumbers(t, got); !reflect.DeepEqual(g, want) {
		t.Fatalf("Rewrite(%.300s)\n got %.300s\nwant %.300s", b, got, mustMarshal(t, want))
	}
	if bytes.HasPrefix(got, []byte(`{`)) && bytes.Contains(got, []byte(`"resourceType"`)) {
		if m, ok := want.(map[string]any); ok && m["resourceType"] != nil && !bytes.HasPrefix(got, []byte(`{"resourceType":`)) {
			t.Fatalf("resourceType is not first: %.200s", got)
		}
	}
}

func mustMarshal(t testing.TB, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BenchmarkRewrite: a Synthea patient's Bundle, one pass against decoding it.
func BenchmarkRewrite(b *testing.B) {
	files, _ := filepath.Glob(filepath.Join(os.Getenv("HOME"), ".cache", "carehub", "synthea", "fhir", "[A-Z]*.json"))
	if len(files) == 0 {
		b.Skip("no Synthea patients: make synthea-deps")
	}
	doc, err := os.ReadFile(files[0])
	if err != nil {
		b.Fatal(err)
	}
	doc, _ = json.Marshal(json.RawMessage(doc)) // compact, as the stores give it
	b.Run("one-pass", func(b *testing.B) {
		b.SetBytes(int64(len(doc)))
		for b.Loop() {
			if _, err := Rewrite(doc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("one-pass-valid", func(b *testing.B) { // the input known valid: no validation pass
		b.SetBytes(int64(len(doc)))
		out := make([]byte, 0, len(doc))
		for b.Loop() {
			if _, err := AppendRewriteValid(out, doc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decoding", func(b *testing.B) {
		b.SetBytes(int64(len(doc)))
		for b.Loop() {
			v, _ := rewriteByDecoding(doc)
			if _, err := json.Marshal(v); err != nil {
				b.Fatal(err)
			}
		}
	})
}
