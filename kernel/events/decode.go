package events

import (
	"encoding/json"
	"fmt"

	"carehub/kernel/jsonwire"
)

// Decode parses and validates one envelope as it travels on carehub.events.v1.
//
// Every consumer group (event log, webhooks, triggers) decodes every event, so Decode reads the
// envelope without reflection (jsonwire), as json.Unmarshal into a Event does
// (FuzzDecode checks it against encoding/json), and checks the record's JSON once. It does not
// check that the payload is storable (jsonwire.Storable, which every publishing path checks): a
// record that is not, which only a producer other than carehub's can write, is refused by the
// event log's stores and set aside (consume.DeadLetter); a webhook sends it as it stands.
func Decode(data []byte) (Event, error) {
	var ev Event
	set := func(key, v []byte) error { return setEnvelope(&ev, key, v) }
	// One pass checks and reads a plain envelope; anything else (escaped keys, deep nesting, not
	// valid) is checked, then read, as before. Every consumer of the events decodes every event.
	ok, err := jsonwire.ValidMembers(data, set)
	if !ok {
		if !jsonwire.Valid(data) {
			return Event{}, fmt.Errorf("%w: not valid JSON", ErrInvalidEnvelope)
		}
		ev = Event{}
		err = jsonwire.Members(data, set)
	}
	if err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrInvalidEnvelope, err)
	}
	if err := validateFields(ev); err != nil {
		return Event{}, err
	}
	if len(ev.Payload) == 0 || ev.Payload[0] != '{' { // valid JSON: the whole record was checked
		return Event{}, errPayload
	}
	return ev, nil
}

// envelopeKeys are Event's JSON names, for the case-insensitive match encoding/json
// makes when no key matches exactly.
var envelopeKeys = []string{"id", "type", "orgId", "projectId", "source", "severity", "payload", "createdAt"}

func setEnvelope(ev *Event, key, v []byte) error {
	switch string(key) {
	case "id":
		return jsonwire.String(v, &ev.ID)
	case "type":
		return jsonwire.String(v, &ev.Type)
	case "orgId":
		return jsonwire.String(v, &ev.OrgID)
	case "projectId":
		return jsonwire.String(v, &ev.ProjectID)
	case "source":
		return jsonwire.String(v, &ev.Source)
	case "severity":
		return jsonwire.String(v, &ev.Severity)
	case "payload":
		ev.Payload = append(json.RawMessage(nil), v...)
		return nil
	case "createdAt":
		return jsonwire.Time(v, &ev.CreatedAt)
	}
	if name := jsonwire.Fold(key, envelopeKeys); name != "" {
		return setEnvelope(ev, []byte(name), v)
	}
	return nil // not a member of the envelope: ignored, as encoding/json does
}
