package events_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"carehub/kernel/events"
	"carehub/kernel/jsonwire"
)

// FuzzDecode checks Decode against encoding/json (json.Unmarshal, then Validate but for the
// payload's storability) on any input: both accept it or both refuse it, and what both accept
// decodes to the same envelope.
//
//	go test -run '^$' -fuzz FuzzDecode -fuzztime 60s ./kernel/events/
func FuzzDecode(f *testing.F) {
	valid := `{"id":"evt_01ke9nk500cmm0mhj9psxg961n","type":"device.observation_received","orgId":"org_1","projectId":"prj_1",` +
		`"source":"integration","severity":"info","payload":{"observationId":"obs_1","value":72.25},"createdAt":"2026-11-25T05:49:18.123456Z"}`
	for _, s := range []string{
		valid,
		strings.Replace(valid, `"type"`, `"TYPE"`, 1),
		strings.Replace(valid, `"payload":{`, `"payload":null,"payload": {`, 1),
		strings.Replace(valid, `"payload":{"observationId":"obs_1","value":72.25}`, `"payload":[1]`, 1),
		strings.Replace(valid, `"orgId":"org_1"`, `"orgId":"org_\u00e9\ud800","extra":{"a":[]}`, 1),
		strings.Replace(valid, `"createdAt":"2026-11-25T05:49:18.123456Z"`, `"createdAt":"yesterday"`, 1),
		strings.Replace(valid, `"severity":"info"`, `"severity":7`, 1),
		` ` + valid + "\n", `[` + valid + `]`, `null`, `{}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		var want events.Event
		wantErr := json.Unmarshal([]byte(data), &want)
		if wantErr == nil {
			wantErr = events.Validate(want)
		}
		if _, unstorable := errors.AsType[*jsonwire.StorableError](wantErr); unstorable {
			wantErr = nil // Decode leaves a payload's storability to the stores (see Decode)
		}
		got, err := events.Decode([]byte(data))
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("Decode(%q): error %v, encoding/json: %v", data, err, wantErr)
		}
		if err != nil {
			return
		}
		if !got.CreatedAt.Equal(want.CreatedAt) {
			t.Fatalf("Decode(%q): createdAt %v, encoding/json %v", data, got.CreatedAt, want.CreatedAt)
		}
		got.CreatedAt, want.CreatedAt = time.Time{}, time.Time{}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Decode(%q):\n%+v\nencoding/json:\n%+v", data, got, want)
		}
	})
}

// BenchmarkDecode compares Decode with json.Unmarshal and Validate of the same envelope (std).
func BenchmarkDecode(b *testing.B) {
	data := []byte(`{"id":"evt_01ke9nk500cmm0mhj9psxg961n","type":"device.observation_received","orgId":"org_01ke9nk500cmm0mhj9psxg961n",` +
		`"projectId":"prj_01ke9nk500cmm0mhj9psxg961n","source":"integration","severity":"info","payload":{"observationId":"obs_01ke9nk500cmm0mhj9psxg961n",` +
		`"patientId":"pat_01ke9nk500cmm0mhj9psxg961n","code":"8867-4","deviceType":"wearable","value":72.25,"unit":"/min","effectiveAt":"2026-11-01T08:00:00Z"},` +
		`"createdAt":"2026-11-25T05:49:18.123456Z"}`)
	b.Run("hand", func(b *testing.B) {
		for b.Loop() {
			if _, err := events.Decode(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("std", func(b *testing.B) {
		for b.Loop() {
			var ev events.Event
			if err := json.Unmarshal(data, &ev); err != nil || events.Validate(ev) != nil {
				b.Fatal(err)
			}
		}
	})
}
