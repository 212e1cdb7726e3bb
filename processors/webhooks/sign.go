package webhooks

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"carehub/kernel/events"
	"carehub/kernel/jsonwire"
)

// userAgent identifies carehub's deliveries to receivers.
const userAgent = "carehub-webhooks/1"

// deliveredEvent is the body a receiver gets (the spec's delivered shape, DECISIONS §4).
type deliveredEvent struct {
	Event     string          `json:"event"`
	Timestamp string          `json:"timestamp"`
	OrgID     string          `json:"org_id"`
	ProjectID string          `json:"project_id"`
	Payload   json.RawMessage `json:"payload"`
	// Redacted is true when the payload's patient data was removed for the subscription (phi.go).
	Redacted bool `json:"redacted,omitempty"`
}

// Body returns the bytes delivered for ev: {event, timestamp, org_id, project_id, payload}, with
// timestamp the event's createdAt in RFC 3339 UTC. It writes what json.Marshal writes of a
// deliveredEvent, without reflection and without escaping <, > and & for HTML (the two decode
// alike, as events.Encode's envelope does): every delivery's body is made here, and
// json.Marshal was a fiftieth of the node's CPU at stream speed. It fails as json.Marshal
// does, when the payload is not JSON.
func Body(ev events.Event) ([]byte, error) {
	payload := ev.Payload
	if len(payload) == 0 {
		payload = json.RawMessage(`{}`)
	}
	if !utf8.ValidString(ev.Type) || !utf8.ValidString(ev.OrgID) || !utf8.ValidString(ev.ProjectID) {
		// Not what a decoded event holds: encoding/json says what it makes of them.
		return json.Marshal(deliveredEvent{Event: ev.Type, Timestamp: ev.CreatedAt.UTC().Format(time.RFC3339Nano),
			OrgID: ev.OrgID, ProjectID: ev.ProjectID, Payload: payload})
	}
	b := make([]byte, 0, len(payload)+len(ev.Type)+len(ev.OrgID)+len(ev.ProjectID)+96)
	b = jsonwire.AppendString(append(b, `{"event":`...), ev.Type)
	b = ev.CreatedAt.UTC().AppendFormat(append(b, `,"timestamp":"`...), time.RFC3339Nano)
	b = jsonwire.AppendString(append(b, `","org_id":`...), ev.OrgID)
	b = jsonwire.AppendString(append(b, `,"project_id":`...), ev.ProjectID)
	b, err := jsonwire.AppendCompact(append(b, `,"payload":`...), payload)
	if err != nil {
		return nil, fmt.Errorf("the payload is not JSON: %w", err)
	}
	return append(b, '}'), nil
}

// BatchIDPrefix starts the webhook-id of a batched POST (an ordered subscription with batchSize
// above 1).
const BatchIDPrefix = "whb_"

// BatchBody is the webhook-id and body of one POST carrying several events (ids[i] with its
// Body bodies[i]): a JSON array of {"id": the webhook-id the event has alone, "body": the body it
// has alone}; the id is derived from the events' ids, so the same batch sent again has the same
// one.
func BatchBody(ids []string, bodies [][]byte) (string, []byte) {
	h := sha256.New()
	size := 2
	for i, id := range ids {
		h.Write([]byte(id))
		h.Write([]byte{0})
		size += len(bodies[i]) + len(id) + 20
	}
	out := make([]byte, 0, size)
	out = append(out, '[')
	for i, id := range ids {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"id":`...)
		out = strconv.AppendQuote(out, id)
		out = append(out, `,"body":`...)
		out = append(out, bodies[i]...)
		out = append(out, '}')
	}
	out = append(out, ']')
	return BatchIDPrefix + hex.EncodeToString(h.Sum(nil)[:16]), out
}
