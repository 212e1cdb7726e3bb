package observations

import (
	"carehub/schemas/kafka/observation"
	"encoding/json"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/ingest/outbox"
	"carehub/kernel/events"
	"carehub/storage"
)

// receivedRecords returns the device.observation_received records of stored observations for
// topic, as the outbox relay publishes events (key = project id, value = the envelope, header
// event-id), with ids derived from the observation ids (EventID).
func receivedRecords(topic string, stored []observation.Message, projects map[string]string) ([]*kgo.Record, error) {
	now := events.Now()
	recs := make([]*kgo.Record, len(stored))
	for i := range stored {
		m := &stored[i]
		value, effective := &m.Value, m.EffectiveAt.UTC()
		if m.NoValue { // a panel, a coded value, dataAbsentReason
			value = nil
		}
		payload, err := json.Marshal(events.DeviceObservationReceived{
			ObservationID: m.ID, PatientID: m.PatientID, Code: m.Code, DeviceType: m.DeviceType,
			Value: value, Unit: m.Unit, EffectiveAt: &effective,
		})
		if err != nil {
			return nil, fmt.Errorf("observation event payload: %w", err)
		}
		ev := storage.Event{
			ID: observation.EventID(m.ID), Type: EventType, OrgID: m.OrgID, ProjectID: projects[m.OrgID],
			Source: events.SourceIntegration, Severity: events.SeverityInfo, Payload: payload, CreatedAt: now,
		}
		envelope, err := json.Marshal(ev)
		if err != nil {
			return nil, fmt.Errorf("observation event: %w", err)
		}
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(ev.ProjectID), Value: envelope,
			Headers: []kgo.RecordHeader{{Key: outbox.HeaderEventID, Value: []byte(ev.ID)}}}
	}
	return recs, nil
}
