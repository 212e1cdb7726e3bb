package events

import (
	"encoding/json"
	"time"
)

// Event is one platform event: the envelope of DECISIONS §4, as it travels on carehub.events.v1
// and as the event log keeps it.
type Event struct {
	ID        string          `json:"id"` // evt_…
	Type      string          `json:"type"`
	OrgID     string          `json:"orgId"`
	ProjectID string          `json:"projectId"`
	Source    string          `json:"source"`   // workflow, agent, integration, deployment, system
	Severity  string          `json:"severity"` // info, warning, error, critical
	Payload   json.RawMessage `json:"payload"`
	CreatedAt time.Time       `json:"createdAt"`
}

// CursorKey is an event's place in the event log's order (storage.TrimPage).
func (e Event) CursorKey() (time.Time, string) { return e.CreatedAt, e.ID }
