package rest

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// FuzzExportedEventJSON holds ExportedEvent.AppendJSON to json.Marshal: both fail or neither,
// and what both write decodes to the same value.
//
//	go test -run '^$' -fuzz FuzzExportedEventJSON -fuzztime 60s ./api/rest/
func FuzzExportedEventJSON(f *testing.F) {
	f.Add("evt_1", "a.b", "prj_1", "system", `{"patientId": "pat_1", "note": "<b>&</b>\u2028"}`, "info", int64(1764049758123456000), false, "MS4x")
	f.Add("evt_\xff", "a.b\n\"", "", "", ``, "", int64(0), true, "")
	f.Add("e", "t", "p", "s", `[1, 2`, "x", int64(-1), false, "c")
	f.Fuzz(func(t *testing.T, id, typ, project, source, payload, severity string, nanos int64, redacted bool, cursor string) {
		e := ExportedEvent{Event: Event{ID: id, Type: typ, ProjectID: project, Source: source, Severity: severity,
			CreatedAt: time.Unix(0, nanos).UTC(), Redacted: redacted}, Cursor: cursor}
		if payload != "" {
			e.Payload = json.RawMessage(payload)
		}
		want, wantErr := json.Marshal(e)
		got, err := e.AppendJSON([]byte("x"))
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("AppendJSON(%+v): error %v, json.Marshal: %v", e, err, wantErr)
		}
		if err != nil {
			return
		}
		if got[0] != 'x' {
			t.Fatalf("AppendJSON did not append: %q", got)
		}
		var g, w any
		if err := json.Unmarshal(got[1:], &g); err != nil {
			t.Fatalf("AppendJSON(%+v) = %s: not JSON: %v", e, got[1:], err)
		}
		if err := json.Unmarshal(want, &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("AppendJSON(%+v):\n%s\njson.Marshal:\n%s", e, got[1:], want)
		}
	})
}
