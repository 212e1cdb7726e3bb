package observation

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"carehub/storage/ids"
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
	b = AppendString(b, m.ID)
	b = append(b, `,"orgId":`...)
	b = AppendString(b, m.OrgID)
	b = append(b, `,"patientId":`...)
	b = AppendString(b, m.PatientID)
	b = append(b, `,"receivedAt":"`...)
	b = m.ReceivedAt.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","observation":`...)
	b = append(b, m.Observation...)
	b = append(b, `,"status":`...)
	b = AppendString(b, m.Status)
	if m.LOINC != "" {
		b = append(b, `,"loinc":`...)
		b = AppendString(b, m.LOINC)
	}
	b = append(b, `,"code":`...)
	b = AppendString(b, m.Code)
	b = append(b, `,"value":`...)
	b = strconv.AppendFloat(b, m.Value, 'g', -1, 64)
	if m.NoValue {
		b = append(b, `,"noValue":true`...)
	}
	b = append(b, `,"unit":`...)
	b = AppendString(b, m.Unit)
	b = append(b, `,"effectiveAt":"`...)
	b = m.EffectiveAt.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	if m.DeviceType != "" {
		b = append(b, `,"deviceType":`...)
		b = AppendString(b, m.DeviceType)
	}
	if m.ClientID != "" {
		b = append(b, `,"clientId":`...)
		b = AppendString(b, m.ClientID)
	}
	return append(b, '}')
}

// AppendString appends s as a JSON string. s is valid UTF-8 (it came out of a JSON decoder);
// only the characters JSON requires escaping are escaped.
func AppendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// DecodeMessage parses and checks one record value. It checks what storing needs (ids, an
// object resource, a status and an effective time); the FHIR rules were applied at intake.
func DecodeMessage(value []byte) (Message, error) {
	var m Message
	if err := json.Unmarshal(value, &m); err != nil {
		return Message{}, fmt.Errorf("%w: %v", ErrInvalidMessage, err)
	}
	switch {
	case !ids.Valid(ids.Observation, m.ID):
		return Message{}, fmt.Errorf("%w: id %q", ErrInvalidMessage, m.ID)
	case m.OrgID == "" || m.PatientID == "":
		return Message{}, fmt.Errorf("%w: no orgId or patientId", ErrInvalidMessage)
	case len(m.Observation) == 0 || m.Observation[0] != '{':
		return Message{}, fmt.Errorf("%w: observation is not an object", ErrInvalidMessage)
	case m.Status == "" || m.Code == "":
		return Message{}, fmt.Errorf("%w: no status or code", ErrInvalidMessage)
	case m.EffectiveAt.IsZero() || m.ReceivedAt.IsZero():
		return Message{}, fmt.Errorf("%w: no effectiveAt or receivedAt", ErrInvalidMessage)
	case !utf8.ValidString(m.Unit):
		return Message{}, fmt.Errorf("%w: unit", ErrInvalidMessage)
	}
	return m, nil
}

// EventID is the id of the device.observation_received event of observation obsID: the same
// ULID under the evt_ prefix. Deterministic, so however often an observation's event is queued
// or published it carries one id, and consumers that deduplicate by event id see it once.
func EventID(obsID string) string {
	return ids.Event + obsID[len(ids.Observation):]
}
