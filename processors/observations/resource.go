package observations

import (
	"bytes"

	"carehub/kernel/jsonwire"
	"carehub/schemas/kafka/observation"
)

// The stored form of a message: the columns of observations and the resource as carehub keeps
// it. insertIncoming (store.go) computes the same in SQL for the staged path; the two must agree
// (TestStoredFormMatchesStagedInsert).

var storedColumns = []string{"id", "org_id", "patient_id", "status", "code", "loinc", "subject", "value", "unit",
	"effective_at", "device_type", "resource", "received_at"}

// storedRow is m as a row of storedColumns: what insertIncoming makes of it.
func storedRow(m *observation.Message) []any {
	code, subject, identifier := topLevel(m.Observation)
	if code == nil {
		code = []byte(`{}`)
	}
	if subject == nil {
		subject = jsonwire.AppendString([]byte(`{"reference":`), "Patient/"+m.PatientID)
		subject = append(subject, '}')
	}
	return []any{m.ID, m.OrgID, m.PatientID, m.Status, code, nullable(m.LOINC), subject, storedValue(m),
		nullable(m.Unit), m.EffectiveAt, nullable(m.DeviceType), storedResource(m, identifier), m.ReceivedAt}
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

// topLevel returns the values of the members code, subject and identifier of the JSON object
// obj (the last of repeated keys, as jsonb keeps), nil for a missing one. obj is valid JSON
// (DecodeMessage checked the whole record); keys are compared exactly, after unescaping, as
// Postgres's -> does.
func topLevel(obj []byte) (code, subject, identifier []byte) {
	_ = jsonwire.Members(obj, func(key, v []byte) error {
		switch string(key) {
		case "code":
			code = v
		case "subject":
			subject = v
		case "identifier":
			identifier = v
		}
		return nil
	})
	return code, subject, identifier
}
