package observations

import (
	"slices"

	"carehub/kernel/jsonwire"
	"carehub/schemas/kafka/observation"
)

// The stored form of a message: the columns of observations and the resource as carehub keeps
// it. Both ways of storing (the COPY of copyNew and the staged insert) store these rows.

var storedColumns = []string{"id", "org_id", "patient_id", "status", "loinc", "value", "unit",
	"effective_at", "device_type", "resource", "received_at"}

// storedRow is m as a row of storedColumns. The columns code and subject stay null: readers
// take them from the resource (schemas/postgres 0023).
func storedRow(m *observation.Message) []any {
	return []any{m.ID, m.OrgID, m.PatientID, m.Status, nullable(m.LOINC), storedValue(m),
		nullable(m.Unit), m.EffectiveAt, nullable(m.DeviceType), storedResource(m), m.ReceivedAt}
}

// storedResource is the resource as stored, in a json column (schemas/postgres 0024), so as
// the text it is read back: the client's members in their order, compacted, each key once (the
// last of repeated keys, as jsonb and encoding/json keep), with carehub's id in place of the
// client's (after resourceType), and, when the client sent an id, that id appended to identifier
// as {system: ClientIDSystem, value}. m.Observation is a valid JSON object (DecodeMessage
// checked the whole record); keys are compared exactly, after unescaping, as Postgres's -> does.
func storedResource(m *observation.Message) []byte {
	type member struct {
		key        []byte
		start, end int // in b
	}
	b := make([]byte, 0, len(m.Observation)+len(m.ClientID)+128)
	b = jsonwire.AppendCompactValid(b, m.Observation)
	var (
		members    = make([]member, 0, 16)
		identifier []byte // the client's, when it sent an id
		idAt       = -1   // where carehub's id goes: after resourceType
		rewrite    bool   // a member to drop: the client's id or identifier, or a repeated key
	)
	_ = jsonwire.MemberSpans(b, func(key, v []byte, start, end int) error {
		switch {
		case string(key) == "id":
			rewrite = true
		case string(key) == "identifier" && m.ClientID != "":
			identifier, rewrite = v, true
		case string(key) == "resourceType" && idAt < 0:
			idAt = end
		}
		rewrite = rewrite || slices.ContainsFunc(members, func(earlier member) bool { return string(earlier.key) == string(key) })
		members = append(members, member{key, start, end})
		return nil
	})
	if rewrite { // the uncommon case: copy the members that stay
		kept := make([]byte, 1, len(b)+16)
		kept[0], idAt = '{', -1
		for i, mb := range members {
			switch key := string(mb.key); {
			case key == "id", key == "identifier" && m.ClientID != "":
				continue
			case slices.ContainsFunc(members[i+1:], func(later member) bool { return string(later.key) == key }):
				continue // a later one wins
			case len(kept) > 1:
				kept = append(kept, ',')
			}
			kept = append(kept, b[mb.start:mb.end]...)
			if idAt < 0 && string(mb.key) == "resourceType" {
				idAt = len(kept)
			}
		}
		b = append(kept, '}')
	}
	id := jsonwire.AppendString([]byte(`"id":`), m.ID)
	switch {
	case idAt >= 0:
		b = slices.Insert(b, idAt, append([]byte{','}, id...)...)
	case len(b) > 2: // {…}
		b = slices.Insert(b, 1, append(id, ',')...)
	default: // {}
		b = slices.Insert(b, 1, id...)
	}
	if m.ClientID == "" {
		return b
	}
	b = append(b[:len(b)-1], `,"identifier":[`...)
	if len(identifier) > 2 && identifier[0] == '[' { // not []
		b = append(append(b, identifier[1:len(identifier)-1]...), ',')
	}
	b = append(b, `{"system":`...)
	b = jsonwire.AppendString(b, ClientIDSystem)
	b = append(b, `,"value":`...)
	b = jsonwire.AppendString(b, m.ClientID)
	return append(b, "}]}"...)
}
