package events

import (
	"encoding/json"
	"testing"
	"time"
)

// Encode sizes its buffer for the whole record up front (encodedLen), whatever the lengths of
// the event's strings and however its time is written (nanoseconds, a zone offset): growing it
// at the createdAt was 6 % of what a node allocated under arrays of events. A record no longer
// than encodedLen was written without growing the buffer.
func TestEncodedLenHoldsTheRecord(t *testing.T) {
	west, east := time.FixedZone("", -7*3600-30*60), time.FixedZone("", 14*3600)
	for _, ev := range []Event{
		{ID: "evt_01ke9nk500cmm0mhj9psxg961n", Type: "eventload.r4de936dbf2.bulk", OrgID: "org_01ke9nk500cmm0mhj9psxg961n",
			ProjectID: "prj_01ke9nk500cmm0mhj9psxg961n", Source: SourceIntegration, Severity: SeverityInfo,
			Payload: json.RawMessage(`{"n":1}`), CreatedAt: time.Date(2026, 11, 29, 8, 0, 0, 123456789, west)},
		{ID: "evt_01ke9nk500cmm0mhj9psxg961n", Type: TypeAgentRunCompleted, OrgID: "org_1", ProjectID: "prj_1",
			Source: SourceAgent, Severity: SeverityWarning, Payload: json.RawMessage(`{ "spaced" : [ 1, 2 ] }`),
			CreatedAt: time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)},
		{ID: "evt_01ke9nk500cmm0mhj9psxg961n", Type: TypeDeviceObservationReceived, OrgID: "o", ProjectID: "p",
			Source: SourceIntegration, Severity: SeverityInfo, Payload: json.RawMessage(`{}`),
			CreatedAt: time.Date(9999, 12, 31, 23, 59, 59, 999999999, east)},
	} {
		b, err := Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > encodedLen(ev) {
			t.Errorf("Encode wrote %d bytes of a %s event into a buffer of %d: %s", len(b), ev.Type, encodedLen(ev), b)
		}
	}
}
