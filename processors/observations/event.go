package observations

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/ingest/outbox"
	"carehub/processors/events"
	"carehub/storage"
)

// receivedPayload is the payload of device.observation_received (DECISIONS §4).
type receivedPayload struct {
	ObservationID string  `json:"observationId"`
	PatientID     string  `json:"patientId"`
	Code          string  `json:"code"`
	DeviceType    string  `json:"deviceType,omitempty"`
	Value         float64 `json:"value"`
	Unit          string  `json:"unit,omitempty"`
	EffectiveAt   string  `json:"effectiveAt"`
}

// receivedRecords returns the device.observation_received records of stored observations for
// topic, as the outbox relay publishes events (key = project id, value = the envelope, header
// event-id), with ids derived from the observation ids (EventID).
func receivedRecords(topic string, stored []Message, projects map[string]string) ([]*kgo.Record, error) {
	now := events.Now()
	recs := make([]*kgo.Record, len(stored))
	for i := range stored {
		m := &stored[i]
		payload, err := json.Marshal(receivedPayload{
			ObservationID: m.ID, PatientID: m.PatientID, Code: m.Code, DeviceType: m.DeviceType,
			Value: m.Value, Unit: m.Unit, EffectiveAt: m.EffectiveAt.UTC().Format(time.RFC3339Nano),
		})
		if err != nil {
			return nil, fmt.Errorf("observation event payload: %w", err)
		}
		ev := storage.Event{
			ID: EventID(m.ID), Type: EventType, OrgID: m.OrgID, ProjectID: projects[m.OrgID],
			Source: events.SourceIntegration, Severity: events.SeverityInfo, Payload: payload, CreatedAt: now,
		}
		value, err := json.Marshal(ev)
		if err != nil {
			return nil, fmt.Errorf("observation event: %w", err)
		}
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(ev.ProjectID), Value: value,
			Headers: []kgo.RecordHeader{{Key: outbox.HeaderEventID, Value: []byte(ev.ID)}}}
	}
	return recs, nil
}
