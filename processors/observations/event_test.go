package observations

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
	"time"

	"carehub/kernel/events"
	"carehub/schemas/kafka/observation"
)

// stdEvent is the event of m as encoding/json writes it: the reference appendEvent must agree
// with.
func stdEvent(m *observation.Message, id, project string, created time.Time) ([]byte, error) {
	value, effective := &m.Value, m.EffectiveAt.UTC()
	if m.NoValue {
		value = nil
	}
	payload, err := json.Marshal(events.DeviceObservationReceived{ObservationID: m.ID, PatientID: m.PatientID, Code: m.Code,
		DeviceType: m.DeviceType, Value: value, Unit: m.Unit, EffectiveAt: &effective})
	if err != nil {
		return nil, err
	}
	return json.Marshal(events.Event{ID: id, Type: EventType, OrgID: m.OrgID, ProjectID: project, Source: events.SourceIntegration,
		Severity: events.SeverityInfo, Payload: payload, CreatedAt: created})
}

// FuzzEventMatchesEncodingJSON checks appendEvent against json.Marshal for any strings and value:
// the two encodings decode to the same JSON, and are the same bytes where no string holds a
// character encoding/json escapes for HTML.
//
//	go test -run '^$' -fuzz FuzzEventMatchesEncodingJSON -fuzztime 60s ./processors/observations/
func FuzzEventMatchesEncodingJSON(f *testing.F) {
	f.Add("obs_01ke9nk500cmm0mhj9psxg961n", "8867-4", "wearable", "/min", 72.25, false, int64(0))
	f.Add("obs_01ke9nk500cmm0mhj9psxg961n", "8867-4", "", "", 0.0, true, int64(123456789))
	f.Add("obs_\"x\\", "a<b>&c\u2028", "mon\x01itor\t\n", "\xff", 1e21, false, int64(-1))
	f.Add("obs_1", "c", "d", "u", -1.5e-7, false, int64(999))
	f.Add("obs_1", "c", "d", "u", 1e-6, false, int64(1))
	f.Fuzz(func(t *testing.T, id, code, device, unit string, value float64, noValue bool, nanos int64) {
		if math.IsNaN(value) || math.IsInf(value, 0) { // not a JSON number: never decoded
			return
		}
		m := observation.Message{ID: id, OrgID: "org_1", PatientID: "pat_" + code, Code: code, DeviceType: device, Unit: unit,
			Value: value, NoValue: noValue, EffectiveAt: time.Date(2026, 11, 1, 8, 0, 0, int(nanos%1e9+1e9)%1e9, time.FixedZone("x", 3600))}
		created := events.Now()
		want, err := stdEvent(&m, observation.EventID("obs_"+id), "prj_1", created)
		if err != nil {
			t.Fatal(err)
		}
		got := appendEvent(nil, &m, observation.EventID("obs_"+id), "prj_1", created)
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("appendEvent wrote invalid JSON %s: %v", got, err)
		}
		_ = json.Unmarshal(want, &w)
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("appendEvent:\n%s\nencoding/json:\n%s", got, want)
		}
	})
}

func BenchmarkEvent(b *testing.B) {
	m := observation.Message{ID: "obs_01ke9nk500cmm0mhj9psxg961n", OrgID: "org_01ke9nk500cmm0mhj9psxg961n", PatientID: "pat_01ke9nk500cmm0mhj9psxg961n",
		Code: "8867-4", DeviceType: "wearable", Unit: "/min", Value: 72.25, EffectiveAt: time.Now()}
	created := events.Now()
	b.Run("hand", func(b *testing.B) {
		for b.Loop() {
			appendEvent(make([]byte, 0, 512), &m, "evt_01ke9nk500cmm0mhj9psxg961n", "prj_01ke9nk500cmm0mhj9psxg961n", created)
		}
	})
	b.Run("std", func(b *testing.B) {
		for b.Loop() {
			_, _ = stdEvent(&m, "evt_01ke9nk500cmm0mhj9psxg961n", "prj_01ke9nk500cmm0mhj9psxg961n", created)
		}
	})
}
