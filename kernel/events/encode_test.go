package events_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"carehub/kernel/events"
)

// FuzzEncode checks Encode against encoding/json on any event: Encode refuses exactly what
// Validate refuses, and what it accepts is the JSON json.Marshal writes, up to the HTML
// escaping it does not do (both decode to the same value), and decodes back to the event.
//
//	go test -run '^$' -fuzz FuzzEncode -fuzztime 60s ./kernel/events/
func FuzzEncode(f *testing.F) {
	f.Add("evt_01ke9nk500cmm0mhj9psxg961n", "device.observation_received", "org_1", "prj_1", "integration", "info",
		`{"observationId":"obs_1","value":72.25,"note":"<b>&amp;</b>\u2028"}`, int64(1764049758123456000))
	f.Add("evt_01ke9nk500cmm0mhj9psxg961n", "a.b", "org_\xff", "prj_é", "system", "critical", " {\n \"a\" : [1, 2] }\t", int64(0))
	f.Add("evt_01ke9nk500cmm0mhj9psxg961n", "a.b", "o", "p", "agent", "warning", `[1]`, int64(-62135596800000000000/1000))
	f.Add("evt_x", "A", "", "", "", "", `{`, int64(1))
	f.Fuzz(func(t *testing.T, id, typ, org, project, source, severity, payload string, nanos int64) {
		ev := events.Event{ID: id, Type: typ, OrgID: org, ProjectID: project, Source: source, Severity: severity,
			Payload: json.RawMessage(payload), CreatedAt: time.Unix(0, nanos).UTC()}
		got, err := events.Encode(ev)
		wantErr := events.Validate(ev)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("Encode(%+v): error %v, Validate: %v", ev, err, wantErr)
		}
		if err != nil {
			return
		}
		want, err := json.Marshal(ev)
		if err != nil {
			t.Fatalf("json.Marshal(%+v): %v", ev, err)
		}
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("Encode(%+v) = %s: not JSON: %v", ev, got, err)
		}
		if err := json.Unmarshal(want, &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("Encode(%+v):\n%s\njson.Marshal:\n%s", ev, got, want)
		}
		if bytes.Contains(got, []byte("\n")) && !bytes.Contains(want, []byte(`\n`)) {
			t.Fatalf("Encode(%+v) = %s: not compact", ev, got)
		}
		back, err := events.Decode(got)
		if err != nil {
			t.Fatalf("Decode(Encode(%+v)) = %v", ev, err)
		}
		if !back.CreatedAt.Equal(ev.CreatedAt) || back.ID != ev.ID || back.Type != ev.Type || back.Source != ev.Source || back.Severity != ev.Severity {
			t.Fatalf("Decode(Encode(%+v)) = %+v", ev, back)
		}
	})
}

// BenchmarkEncode compares Encode with Validate and json.Marshal of the same event (std).
func BenchmarkEncode(b *testing.B) {
	ev, err := events.New("device.observation_received", "org_01ke9nk500cmm0mhj9psxg961n", "prj_01ke9nk500cmm0mhj9psxg961n",
		events.SourceIntegration, events.SeverityInfo, json.RawMessage(`{"observationId":"obs_01ke9nk500cmm0mhj9psxg961n",`+
			`"patientId":"pat_01ke9nk500cmm0mhj9psxg961n","code":"8867-4","deviceType":"wearable","value":72.25,"unit":"/min","effectiveAt":"2026-11-01T08:00:00Z"}`))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("hand", func(b *testing.B) {
		for b.Loop() {
			if _, err := events.Encode(ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("std", func(b *testing.B) {
		for b.Loop() {
			if err := events.Validate(ev); err != nil {
				b.Fatal(err)
			}
			if _, err := json.Marshal(ev); err != nil {
				b.Fatal(err)
			}
		}
	})
}
