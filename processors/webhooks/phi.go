package webhooks

import (
	"context"
	"encoding/json"
	"fmt"

	"carehub/kernel/events"
	"carehub/kernel/jsonwire"
	"carehub/kernel/phi"
)

// Patient data in deliveries (DECISIONS §2, kernel/phi). A subscription carries patient data
// only as far as the credential that last configured it could read it: Create and Update record
// that credential's patient scopes and mode on the subscription (patient_scopes, patient_mode).
// A delivery stores the event's full body; what an attempt sends is decided when it is made,
// from the subscription as it is then, so a subscription re-pointed by a credential that may not
// read patient data never sends any, not even of deliveries recorded before the change. A body
// whose patient data was removed has "redacted": true beside its payload.

// servedBody returns a stored delivery body as reader r may see it, touching the patients whose
// data it keeps (for the audit record of an API read; a no-op in the dispatcher).
func servedBody(ctx context.Context, g *phi.Guard, r phi.Reader, body []byte) ([]byte, error) {
	// The body is what Body wrote, so valid JSON: its head is read in place, and only a body whose
	// patient data must go is decoded whole and written again.
	var typ, orgID string
	var payload []byte
	err := jsonwire.Members(body, func(key, value []byte) error {
		switch string(key) {
		case "event":
			return jsonwire.String(value, &typ)
		case "org_id":
			return jsonwire.String(value, &orgID)
		case "payload":
			payload = value
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("delivery body: %w", err)
	}
	return servedEvent(ctx, g, r, events.Event{Type: typ, OrgID: orgID, Payload: payload}, body)
}

// servedEvent is servedBody for ev's body (Body(ev)), which it need not read unless patient data
// must go: the consumer's first attempts, made from the events it reads.
func servedEvent(ctx context.Context, g *phi.Guard, r phi.Reader, ev events.Event, body []byte) ([]byte, error) {
	evs, err := g.EventsFor(ctx, r, []events.Event{ev})
	if err != nil {
		return nil, err
	}
	if !evs[0].Redacted {
		return body, nil
	}
	var de deliveredEvent
	if err := json.Unmarshal(body, &de); err != nil {
		return nil, fmt.Errorf("delivery body: %w", err)
	}
	de.Payload, de.Redacted = evs[0].Payload, true
	return json.Marshal(de)
}
