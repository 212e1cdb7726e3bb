package observations

import (
	"bytes"

	"carehub/kernel/jsonwire"
	"carehub/schemas/kafka/observation"
)

// The stored form of a message: the columns of observations and the resource as carehub keeps
// it. insertIncoming (store.go) computes the same in SQL for the staged path; the two must agree
// (TestStoredFormMatchesStagedInsert).

var storedColumns = []string{"id", "org_id", "patient_id", "status", "loinc", "value", "unit",
	"effective_at", "device_type", "resource", "received_at"}

// storedRow is m as a row of storedColumns: what insertIncoming makes of it. The columns code
// and subject stay null: readers take them from the resource (schemas/postgres 0023).
func storedRow(m *observation.Message) []any {
	return []any{m.ID, m.OrgID, m.PatientID, m.Status, nullable(m.LOINC), storedValue(m),
		nullable(m.Unit), m.EffectiveAt, nullable(m.DeviceType), storedResource(m, identifierOf(m.Observation)), m.ReceivedAt}
}

// storedResource is the resource as stored: the client's, with carehub's id, and with the
// client's id appended to identifier when it sent one. The members are appended after the
// client's: jsonb keeps the last of repeated keys, as resource || jsonb_build_object(…) does.
func storedResource(m *observation.Message, identifier []byte) []byte {
	obs := bytes.TrimRight(m.Observation, " \t\r\n")
	b := make([]byte, 0, len(obs)+len(identifier)+len(m.ClientID)+96)
	b = append(b, obs[:len(obs)-1]...) // without its closing brace
	if len(bytes.TrimSpace(b)) > 1 {
		b = append(b, ',')
	}
	b = append(b, `"id":`...)
	b = jsonwire.AppendString(b, m.ID)
	if m.ClientID != "" {
		b = append(b, `,"identifier":[`...)
		if len(identifier) > 0 && identifier[0] == '[' {
			if inner := bytes.TrimSpace(identifier[1 : len(identifier)-1]); len(inner) > 0 {
				b = append(append(b, inner...), ',')
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

// identifierOf returns the value of the member identifier of the JSON object obj (the last of
// repeated keys, as jsonb keeps), nil when there is none. obj is valid JSON (DecodeMessage
// checked the whole record); keys are compared exactly, after unescaping, as Postgres's -> does.
func identifierOf(obj []byte) (identifier []byte) {
	_ = jsonwire.Members(obj, func(key, v []byte) error {
		if string(key) == "identifier" {
			identifier = v
		}
		return nil
	})
	return identifier
}
