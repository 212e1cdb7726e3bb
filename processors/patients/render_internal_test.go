package patients

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"
)

// withMetaByDecoding is what a stored Observation's rendering did before appendWithMeta:
// decode, set the members, keep a client's own id as an identifier, encode.
func withMetaByDecoding(stored []byte, resourceType, id, version string, updated time.Time) json.RawMessage {
	doc := map[string]any{}
	_ = json.Unmarshal(stored, &doc)
	if clientID, ok := doc["id"].(string); ok && clientID != "" && clientID != id {
		ids, _ := doc["identifier"].([]any)
		doc["identifier"] = append(ids, map[string]any{"system": clientIDSystem, "value": clientID})
	}
	return withMeta(doc, resourceType, id, version, updated)
}

var withMetaSeeds = []string{
	`{"resourceType":"Observation","id":"client-7","status":"final","code":{"coding":[{"system":"http://loinc.org","code":"8867-4"}]},"valueQuantity":{"value":72,"unit":"/min"}}`,
	`{"status": "final", "meta": {"versionId": "9", "tag": [{"code": "x"}], "lastUpdated": "2020-01-01T00:00:00Z"}, "identifier": [{"value": "a"}], "id": "obs_1"}`,
	`{"id":"mine","identifier":{"value":"not a list"},"meta":"not an object"}`,
	`{"id":7,"identifier":[],"meta":null,"note":[{"text":"\u00e9 \"q\""}]}`,
	`{"resourceType":"RiskAssessment","status":"final","prediction":[{"probabilityDecimal":0.25}]}`,
	`{}`,
}

// TestAppendWithMetaAgreesWithDecoding: the one-pass rendering gives what decoding gave.
func TestAppendWithMetaAgreesWithDecoding(t *testing.T) {
	for _, s := range withMetaSeeds {
		checkWithMeta(t, []byte(s))
	}
	if _, err := appendWithMeta(nil, []byte(`[1]`), "Observation", "obs_1", "1", time.Now()); err == nil {
		t.Error("an array rendered as a resource")
	}
}

func FuzzAppendWithMeta(f *testing.F) {
	for _, s := range withMetaSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// What the stores hold: one JSON object, valid UTF-8, no repeated key.
		if !jsontext.Value(b).IsValid() || !bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("{")) {
			return
		}
		checkWithMeta(t, b)
	})
}

func checkWithMeta(t *testing.T, stored []byte) {
	t.Helper()
	updated := time.Date(2026, 12, 4, 9, 0, 0, 123456789, time.FixedZone("x", 3600))
	got, err := appendWithMeta(nil, stored, "Observation", "obs_01abc", "1", updated)
	if err != nil {
		t.Fatalf("appendWithMeta(%s): %v", stored, err)
	}
	want := withMetaByDecoding(stored, "Observation", "obs_01abc", "1", updated)
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("appendWithMeta(%s) wrote what is not JSON: %v\n%s", stored, err, got)
	}
	_ = json.Unmarshal(want, &w)
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("appendWithMeta(%s)\n got %s\nwant %s", stored, got, want)
	}
	if !bytes.HasPrefix(got, []byte(`{"resourceType":"Observation","id":"obs_01abc","meta":{`)) {
		t.Fatalf("resourceType, id and meta are not first: %s", got)
	}
}
