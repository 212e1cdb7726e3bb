package webhooks

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
	"unicode/utf8"

	"carehub/kernel/events"
)

// TestBodyIsWhatEncodingJSONWrites: Body's bytes decode to what json.Marshal wrote of the same
// delivered event, compacted, and a payload that is not JSON fails as it did there.
func TestBodyIsWhatEncodingJSONWrites(t *testing.T) {
	at := time.Date(2026, 12, 6, 3, 4, 5, 123456000, time.FixedZone("x", 3600))
	for _, ev := range []events.Event{
		{Type: "device.observation_received", OrgID: "org_1", ProjectID: "prj_1", CreatedAt: at,
			Payload: json.RawMessage(`{ "patientId" : "pat_1", "value": 72.5, "note": "<a> & \"b\" \u00e9 \ud83d\ude00\n" }`)},
		{Type: "a.b", OrgID: "org_\"quoted\\", ProjectID: "", CreatedAt: at.UTC().Truncate(time.Second), Payload: json.RawMessage(`{}`)},
		{Type: "a.b", OrgID: "org_1", ProjectID: "prj_1", CreatedAt: at},                                              // no payload: {}
		{Type: "a.b", OrgID: "org_\xff", ProjectID: "prj_1", CreatedAt: at, Payload: json.RawMessage(`{"a":[1, 2]}`)}, // not UTF-8
	} {
		got, err := Body(ev)
		if err != nil {
			t.Fatalf("%+v: %v", ev, err)
		}
		payload := ev.Payload
		if len(payload) == 0 {
			payload = json.RawMessage(`{}`)
		}
		want, err := json.Marshal(deliveredEvent{Event: ev.Type, Timestamp: ev.CreatedAt.UTC().Format(time.RFC3339Nano),
			OrgID: ev.OrgID, ProjectID: ev.ProjectID, Payload: payload})
		if err != nil {
			t.Fatal(err)
		}
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("%s: %v", got, err)
		}
		if err := json.Unmarshal(want, &w); err != nil || !reflect.DeepEqual(g, w) {
			t.Errorf("Body wrote\n%s\nencoding/json\n%s", got, want)
		}
		if compact, err := json.Marshal(g); utf8.ValidString(ev.OrgID) && (err != nil || len(got) > len(compact)) { // no more than a compact one
			t.Errorf("Body not compact: %s", got)
		}
	}
	if _, err := Body(events.Event{Type: "a.b", Payload: json.RawMessage(`{"a":}`)}); err == nil {
		t.Error("a payload that is not JSON: no error")
	}
}
