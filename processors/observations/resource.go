package observations

import (
	"carehub/kernel/jsonwire"
	"carehub/schemas/kafka/observation"
	"carehub/storage/postgres/pgcopy"
)

// The stored form of a message: the columns of observations and the resource as carehub keeps
// it. Both ways of storing (the COPY of copyNew and the staged insert) store these rows.

var storedColumns = []string{"id", "org_id", "patient_id", "status", "loinc", "value", "unit",
	"effective_at", "device_type", "resource", "received_at"}

// appendStored appends m to rows as a row of storedColumns. The columns code and subject stay
// null: readers take them from the resource (schemas/postgres 0023).
func appendStored(rows *pgcopy.Rows, m *observation.Message) {
	rows.Row()
	rows.Texts(m.ID, m.OrgID, m.PatientID, m.Status)
	rows.TextOrNull(m.LOINC)
	if m.NoValue {
		rows.Null()
	} else {
		rows.Float8(m.Value)
	}
	rows.TextOrNull(m.Unit)
	rows.Timestamptz(m.EffectiveAt)
	rows.TextOrNull(m.DeviceType)
	rows.Append(func(b []byte) []byte { return appendStoredResource(b, m) })
	rows.Timestamptz(m.ReceivedAt)
}

// storedRows is msgs as the body of a COPY into storedColumns, in order (the indexes of msgs;
// nil: as they stand).
func storedRows(msgs []observation.Message, order []int) *pgcopy.Rows {
	size := 0
	for i := range msgs {
		size += len(msgs[i].Observation) + rowOverhead
	}
	rows := pgcopy.New(len(storedColumns), size)
	for i := range msgs {
		if order != nil {
			i = order[i]
		}
		appendStored(rows, &msgs[i])
	}
	return rows
}

// rowOverhead is about a row's bytes in a binary COPY beside the client's resource: the field
// count and lengths, the ids, times, value and codes, and carehub's id in the resource.
const rowOverhead = 320

// appendStoredResource appends to b the resource as stored, in a json column (schemas/postgres
// 0024), so as the text it is read back: the client's members in their order, compacted, each
// key once (the last of repeated keys, as jsonb and encoding/json keep), with carehub's id in
// place of the client's (after resourceType), and, when the client sent an id, that id appended
// to identifier as {system: ClientIDSystem, value}. m.Observation is a valid JSON object
// (DecodeMessage checked the whole record); keys are compared exactly, after unescaping, as
// Postgres's -> does.
func appendStoredResource(b []byte, m *observation.Message) []byte {
	type member struct {
		key        []byte
		start, end int  // in m.Observation
		drop       bool // the client's id or identifier, or a key repeated later
	}
	members := make([]member, 0, 16)
	var identifier []byte // the client's, when it sent an id
	typed := false
	_ = jsonwire.MemberSpans(m.Observation, func(key, v []byte, start, end int) error {
		for i := range members {
			if string(members[i].key) == string(key) {
				members[i].drop = true
			}
		}
		mb := member{key: key, start: start, end: end}
		switch string(key) {
		case "id":
			mb.drop = true
		case "identifier":
			if m.ClientID != "" {
				identifier, mb.drop = v, true
			}
		case "resourceType":
			typed = true
		}
		members = append(members, mb)
		return nil
	})
	open := len(b)
	b = append(b, '{')
	appendID := func() {
		if len(b) > open+1 {
			b = append(b, ',')
		}
		b = jsonwire.AppendString(append(b, `"id":`...), m.ID)
	}
	if !typed {
		appendID()
	}
	for _, mb := range members {
		if mb.drop {
			continue
		}
		if len(b) > open+1 {
			b = append(b, ',')
		}
		b = jsonwire.AppendCompactValid(b, m.Observation[mb.start:mb.end])
		if string(mb.key) == "resourceType" {
			appendID()
		}
	}
	if m.ClientID != "" {
		b = append(b, `,"identifier":[`...)
		if n := len(b); len(identifier) > 0 && identifier[0] == '[' { // its elements, then ours
			if b = jsonwire.AppendCompactValid(b, identifier[1:len(identifier)-1]); len(b) > n {
				b = append(b, ',')
			}
		}
		b = append(b, `{"system":`...)
		b = jsonwire.AppendString(b, ClientIDSystem)
		b = append(b, `,"value":`...)
		b = jsonwire.AppendString(b, m.ClientID)
		b = append(b, "}]"...)
	}
	return append(b, '}')
}
