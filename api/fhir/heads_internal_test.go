package fhir

import (
	"encoding/json"
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
