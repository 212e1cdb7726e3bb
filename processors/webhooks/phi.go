package webhooks

import (
	"context"
	"encoding/json"
	"fmt"

	"carehub/kernel/events"
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
	var de deliveredEvent
	if err := json.Unmarshal(body, &de); err != nil {
		return nil, fmt.Errorf("delivery body: %w", err)
	}
	evs, err := g.EventsFor(ctx, r, []events.Event{{Type: de.Event, OrgID: de.OrgID, Payload: de.Payload}})
	if err != nil {
		return nil, err
	}
	if !evs[0].Redacted {
		return body, nil
	}
	de.Payload, de.Redacted = evs[0].Payload, true
	return json.Marshal(de)
}
