package fhir

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestHeadsReadAsDecodingReads: resourceType and idVersion read in place what decoding the
// resource into a struct read, on the shapes a client or the store may give.
func TestHeadsReadAsDecodingReads(t *testing.T) {
	docs := []string{
		`{"resourceType":"Condition","id":"c1","meta":{"versionId":"3"}}`,
		`{"id":"c1","resourceType":"Condition"}`,
		`{"resourcetype":"Condition","ID":"x","Meta":{"VersionId":"2"}}`,
		`{"resourceType":"Condition","resourceType":"Procedure"}`,
		`{"resourceType":"Con\u0064ition","id":"\u00e9"}`,
		`{"resourceType":null,"meta":null}`,
		`{"resourceType":7}`,
		`{"meta":"not an object","id":"a"}`,
		`{"meta":{"versionId":"2","versionId":"5"}}`,
		`{"contained":[{"resourceType":"Patient","id":"inner"}],"resourceType":"Encounter"}`,
		` {"resourceType" : "Encounter" } `,
		`{}`, `null`, `[]`, `"Condition"`, `12`, `true`,
	}
	for _, doc := range docs {
		var want struct {
			ResourceType string `json:"resourceType"`
		}
		wantOK := json.Unmarshal([]byte(doc), &want) == nil
		var got string
		if ok := resourceType(json.RawMessage(doc), &got); ok != wantOK || (ok && got != want.ResourceType) {
			t.Errorf("resourceType(%s) = %q, %v; decoding gives %q, %v", doc, got, ok, want.ResourceType, wantOK)
		}
		var head struct {
			ID   string `json:"id"`
			Meta struct {
				VersionID string `json:"versionId"`
			} `json:"meta"`
		}
		if json.Unmarshal([]byte(doc), &head) != nil {
			continue // a resource the store would not have written: idVersion's answer is not compared
		}
		if head.Meta.VersionID == "" {
			head.Meta.VersionID = "1"
		}
		if id, version := idVersion(json.RawMessage(doc)); id != head.ID || version != head.Meta.VersionID {
			t.Errorf("idVersion(%s) = %q, %q; decoding gives %q, %q", doc, id, version, head.ID, head.Meta.VersionID)
		}
	}
}

// TestBundlesEncodedAsMarshalled: encodeBundle, which copies the entries' resources as they
// stand, answers byte for byte what encoding/json and the rewrite answered before it, apart from
// the HTML escapes encoding/json adds, on every shape of entry the base writes.
func TestBundlesEncodedAsMarshalled(t *testing.T) {
	total := int64(3)
	res := json.RawMessage(`{ "id": "obs_01", "subject": {"reference": "Patient/pat_01"}, "resourceType": "Observation",
		"note": [], "valueString": null, "text": {"div": "<div>a &amp; b</div>"}}`)
	bundles := []bundle{
		{ResourceType: "Bundle", Type: "searchset"},
		{ResourceType: "Bundle", Type: "searchset", Total: &total, Link: []link{{Relation: "self", URL: "http://x/fhir/R4/Observation?a=b&c=d"}},
			Entry: []entry{{FullURL: "http://x/fhir/R4/Observation/obs_01", Resource: res, Search: &searchMode{Mode: "match"}}}},
		{ResourceType: "Bundle", Type: "transaction-response", Timestamp: "2026-12-05T00:00:00Z", Entry: []entry{
			{FullURL: "http://x/fhir/R4/Observation/obs_01", Resource: res, Response: &entryResponse{Status: "201 Created", Location: "Observation/obs_01/_history/1", Etag: `W/"1"`}},
			{Response: &entryResponse{Status: "201 Created", Location: "Observation/obs_02/_history/1"}},
			{Resource: res},
			{FullURL: "http://x/fhir/R4/Patient/pat_01"},
			{},
			{Response: &entryResponse{Status: "400 Bad Request", Outcome: json.RawMessage(`{"resourceType":"OperationOutcome","issue":[{"severity":"error","code":"invalid","diagnostics":"x < y"}]}`)}},
			{Request: &entryRequest{Method: "GET", URL: "Patient/pat_01"}, Resource: res},
		}},
	}
	for i, b := range bundles {
		got, err := encodeBundle(b)
		if err != nil {
			t.Fatalf("bundle %d: %v", i, err)
		}
		marshalled, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		want, err := fhirJSON(marshalled)
		if err != nil {
			t.Fatal(err)
		}
		unescaped := strings.NewReplacer(`\u003c`, "<", `\u003e`, ">", `\u0026`, "&")
		if g, w := unescaped.Replace(string(got)), unescaped.Replace(string(want)); g != w {
			t.Errorf("bundle %d:\n got %s\nwant %s", i, g, w)
		}
	}
}
