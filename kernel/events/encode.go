package events

import (
	"bytes"
	"encoding/json"
	"time"
	"unicode/utf8"

	"carehub/kernel/jsonwire"
)

// Encode validates ev and returns its envelope as it travels on carehub.events.v1: the JSON
// json.Marshal writes of a Event, without reflection, and with the payload compacted but
// not HTML-escaped (<, > and & as themselves; the two decode alike). Decode reads it back
// (FuzzEncode checks both).
//
// Every published event is encoded once; json.Marshal scanned the payload twice (validity, then
// compaction) after Validate had scanned it once: three passes where compaction alone validates.
func Encode(ev Event) ([]byte, error) {
	if err := validateFields(ev); err != nil {
		return nil, err
	}
	if p := bytes.TrimLeft(ev.Payload, " \t\r\n"); len(p) == 0 || p[0] != '{' {
		return nil, errPayload
	}
	if !utf8.ValidString(ev.OrgID) || !utf8.ValidString(ev.ProjectID) || (ev.CreatedAt.Year() < 0 || ev.CreatedAt.Year() > 9999) {
		// Not what an event made by New holds: let encoding/json say what it makes of them.
		if !json.Valid(ev.Payload) {
			return nil, errPayload
		}
		return json.Marshal(ev)
	}
	b := make([]byte, 0, encodedLen(ev))
	b = append(b, `{"id":`...)
	b = jsonwire.AppendString(b, ev.ID)
	b = append(b, `,"type":`...)
	b = jsonwire.AppendString(b, ev.Type)
	b = append(b, `,"orgId":`...)
	b = jsonwire.AppendString(b, ev.OrgID)
	b = append(b, `,"projectId":`...)
	b = jsonwire.AppendString(b, ev.ProjectID)
	b = append(b, `,"source":`...)
	b = jsonwire.AppendString(b, ev.Source)
	b = append(b, `,"severity":`...)
	b = jsonwire.AppendString(b, ev.Severity)
	b = append(b, `,"payload":`...)
	b, err := jsonwire.AppendCompact(b, ev.Payload) // validates as it compacts
	if err != nil {
		return nil, errPayload
	}
	b = append(b, `,"createdAt":"`...)
	b = ev.CreatedAt.AppendFormat(b, time.RFC3339Nano)
	return append(b, `"}`...), nil
}

// encodedLen is the length of Encode's output for ev when its strings need no escape: its
// buffer's capacity, so that the record is written without growing it. The fixed part is the
// member names, the punctuation and the quotes around the six strings and the time, and the
// longest time RFC3339Nano writes.
func encodedLen(ev Event) int {
	const fixed = len(`{"id":"","type":"","orgId":"","projectId":"","source":"","severity":"","payload":,"createdAt":""}`)
	const longestTime = len("2006-01-02T15:04:05.999999999-07:00")
	return fixed + longestTime + len(ev.ID) + len(ev.Type) + len(ev.OrgID) + len(ev.ProjectID) + len(ev.Source) +
		len(ev.Severity) + len(ev.Payload)
}
