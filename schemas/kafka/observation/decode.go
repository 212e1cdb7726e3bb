package observation

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"carehub/kernel/ids"
	"carehub/kernel/jsonwire"
)

// DecodeMessage parses and checks one record value. It checks what storing needs (ids, an
// object resource without string escapes Postgres cannot read back, a status and an effective
// time); the FHIR rules were applied at intake.
//
// It decodes as json.Unmarshal into a Message does (FuzzDecodeMessage checks it against
// encoding/json), without reflection (jsonwire): decoding was the observation writer's largest
// cost. A record is checked and read in one pass (jsonwire.ValidMembers); only one with an
// escaped key or deep nesting is checked whole first.
func DecodeMessage(value []byte) (Message, error) {
	var m Message
	ok, err := jsonwire.ValidMembers(value, m.set)
	if !ok { // an escaped key, deep nesting, or not valid
		if !jsonwire.Valid(value) {
			return Message{}, fmt.Errorf("%w: not valid JSON", ErrInvalidMessage)
		}
		m = Message{}
		err = jsonwire.Members(value, m.set)
	}
	if err != nil {
		return Message{}, fmt.Errorf("%w: %v", ErrInvalidMessage, err)
	}
	if err := m.check(); err != nil {
		return Message{}, err
	}
	return m, nil
}

// check reports what makes m impossible to store.
func (m *Message) check() error {
	switch {
	case !ids.Valid(ids.Observation, m.ID):
		return fmt.Errorf("%w: id %q", ErrInvalidMessage, m.ID)
	case m.OrgID == "" || m.PatientID == "":
		return fmt.Errorf("%w: no orgId or patientId", ErrInvalidMessage)
	case len(m.Observation) == 0 || m.Observation[0] != '{':
		return fmt.Errorf("%w: observation is not an object", ErrInvalidMessage)
	case m.Status == "" || m.Code == "":
		return fmt.Errorf("%w: no status or code", ErrInvalidMessage)
	case m.EffectiveAt.IsZero() || m.ReceivedAt.IsZero():
		return fmt.Errorf("%w: no effectiveAt or receivedAt", ErrInvalidMessage)
	case !utf8.ValidString(m.Unit):
		return fmt.Errorf("%w: unit", ErrInvalidMessage)
	}
	if msg := jsonwire.UnstorableEscape(m.Observation); msg != "" {
		return fmt.Errorf("%w: observation: %s", ErrInvalidMessage, msg)
	}
	return nil
}

// messageKeys are Message's JSON names, for the case-insensitive match encoding/json makes when
// no key matches exactly.
var messageKeys = []string{"id", "orgId", "patientId", "receivedAt", "observation", "status", "loinc", "code",
	"value", "unit", "noValue", "effectiveAt", "deviceType", "clientId"}

// set decodes the member key of a record into m. v is one valid JSON value.
func (m *Message) set(key, v []byte) error {
	switch string(key) {
	case "id":
		return jsonwire.String(v, &m.ID)
	case "orgId":
		return jsonwire.String(v, &m.OrgID)
	case "patientId":
		return jsonwire.String(v, &m.PatientID)
	case "receivedAt":
		return jsonwire.Time(v, &m.ReceivedAt)
	case "observation":
		m.Observation = append(json.RawMessage(nil), v...)
		return nil
	case "status":
		return jsonwire.String(v, &m.Status)
	case "loinc":
		return jsonwire.String(v, &m.LOINC)
	case "code":
		return jsonwire.String(v, &m.Code)
	case "value":
		return jsonwire.Float(v, &m.Value)
	case "unit":
		return jsonwire.String(v, &m.Unit)
	case "noValue":
		return jsonwire.Bool(v, &m.NoValue)
	case "effectiveAt":
		return jsonwire.Time(v, &m.EffectiveAt)
	case "deviceType":
		return jsonwire.String(v, &m.DeviceType)
	case "clientId":
		return jsonwire.String(v, &m.ClientID)
	}
	if name := jsonwire.Fold(key, messageKeys); name != "" {
		return m.set([]byte(name), v)
	}
	return nil // not a member of Message: ignored, as encoding/json does
}
