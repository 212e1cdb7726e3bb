package observation

import (
	"encoding/json"
	"errors"
	"time"

	"carehub/kernel/ids"
	"carehub/kernel/jsonwire"
)

// Message is one record of carehub.observations.v1 (schemas/kafka/observations.v1.json), key =
// patient id. Intake fills every field; the writer stores Observation as the FHIR resource and
// the extracted fields as the columns it is queried by, so it never parses FHIR again.
type Message struct {
	ID          string          `json:"id"` // obs_…
	OrgID       string          `json:"orgId"`
	PatientID   string          `json:"patientId"`
	ReceivedAt  time.Time       `json:"receivedAt"`  // when intake accepted the request
	Observation json.RawMessage `json:"observation"` // the FHIR R4 Observation as the client sent it

	// Extracted at intake from Observation after validation.
	Status      string    `json:"status"`
	LOINC       string    `json:"loinc,omitempty"`   // first coding with system http://loinc.org
	Code        string    `json:"code"`              // LOINC, else the first coding's code
	Value       float64   `json:"value"`             // valueQuantity.value in Unit
	Unit        string    `json:"unit"`              // the canonical UCUM unit of a vital sign, else valueQuantity's code or unit as sent
	NoValue     bool      `json:"noValue,omitempty"` // stored without a value: a panel, a coded or text value, dataAbsentReason
	EffectiveAt time.Time `json:"effectiveAt"`       // effectiveDateTime
	DeviceType  string    `json:"deviceType,omitempty"`
	// ClientID is the Observation.id the client sent, kept as an identifier of the stored
	// resource; ID is derived from it (see ingest/intake).
	ClientID string `json:"clientId,omitempty"`
}

// ErrInvalidMessage is returned by DecodeMessage for a record that can never be stored.
var ErrInvalidMessage = errors.New("invalid observation message")

// AppendJSON appends m as its JSON encoding to b. It is json.Marshal without reflection and
// without re-validating Observation, which intake has already parsed: at tens of thousands of
// observations a second that difference is a core.
func (m *Message) AppendJSON(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = jsonwire.AppendString(b, m.ID)
	b = append(b, `,"orgId":`...)
	b = jsonwire.AppendString(b, m.OrgID)
	b = append(b, `,"patientId":`...)
	b = jsonwire.AppendString(b, m.PatientID)
	b = append(b, `,"receivedAt":"`...)
	b = m.ReceivedAt.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","observation":`...)
	b = append(b, m.Observation...)
	b = append(b, `,"status":`...)
	b = jsonwire.AppendString(b, m.Status)
	if m.LOINC != "" {
		b = append(b, `,"loinc":`...)
		b = jsonwire.AppendString(b, m.LOINC)
	}
	b = append(b, `,"code":`...)
	b = jsonwire.AppendString(b, m.Code)
	b = append(b, `,"value":`...)
	b = jsonwire.AppendFloat(b, m.Value)
	if m.NoValue {
		b = append(b, `,"noValue":true`...)
	}
	b = append(b, `,"unit":`...)
	b = jsonwire.AppendString(b, m.Unit)
	b = append(b, `,"effectiveAt":"`...)
	b = m.EffectiveAt.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	if m.DeviceType != "" {
		b = append(b, `,"deviceType":`...)
		b = jsonwire.AppendString(b, m.DeviceType)
	}
	if m.ClientID != "" {
		b = append(b, `,"clientId":`...)
		b = jsonwire.AppendString(b, m.ClientID)
	}
	return append(b, '}')
}

// EventID is the id of the device.observation_received event of observation obsID: the same
// ULID under the evt_ prefix. Deterministic, so however often an observation's event is queued
// or published it carries one id, and consumers that deduplicate by event id see it once.
func EventID(obsID string) string {
	return ids.Event + obsID[len(ids.Observation):]
}
