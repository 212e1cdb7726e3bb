package observations

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/ingest/outbox"
	"carehub/kernel/events"
	"carehub/kernel/jsonwire"
	"carehub/schemas/kafka/observation"
)

// receivedRecords returns the device.observation_received records of stored observations for
// topic, as the outbox relay publishes events (key = project id, value = the envelope, header
// event-id), with ids derived from the observation ids (EventID).
func receivedRecords(topic string, stored []observation.Message, projects map[string]string) []*kgo.Record {
	created := events.Now()
	recs := make([]*kgo.Record, len(stored))
	for i := range stored {
		m := &stored[i]
		id := observation.EventID(m.ID)
		project := projects[m.OrgID]
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(project), Value: appendEvent(make([]byte, 0, 512), m, id, project, created),
			Headers: []kgo.RecordHeader{{Key: outbox.HeaderEventID, Value: []byte(id)}}}
	}
	return recs
}

// appendEvent appends the event of m as json.Marshal encodes a storage.Event whose payload is
// an events.DeviceObservationReceived (TestEventMatchesEncodingJSON), without reflection: one
// event per stored observation made encoding the writer's second largest cost.
func appendEvent(b []byte, m *observation.Message, id, project string, created time.Time) []byte {
	b = append(b, `{"id":`...)
	b = jsonwire.AppendString(b, id)
	b = append(b, `,"type":`...)
	b = jsonwire.AppendString(b, EventType)
	b = append(b, `,"orgId":`...)
	b = jsonwire.AppendString(b, m.OrgID)
	b = append(b, `,"projectId":`...)
	b = jsonwire.AppendString(b, project)
	b = append(b, `,"source":`...)
	b = jsonwire.AppendString(b, events.SourceIntegration)
	b = append(b, `,"severity":`...)
	b = jsonwire.AppendString(b, events.SeverityInfo)

	b = append(b, `,"payload":{"observationId":`...)
	b = jsonwire.AppendString(b, m.ID)
	b = append(b, `,"patientId":`...)
	b = jsonwire.AppendString(b, m.PatientID)
	b = append(b, `,"code":`...)
	b = jsonwire.AppendString(b, m.Code)
	if m.DeviceType != "" {
		b = append(b, `,"deviceType":`...)
		b = jsonwire.AppendString(b, m.DeviceType)
	}
	if !m.NoValue { // a panel, a coded value or dataAbsentReason has none
		b = append(b, `,"value":`...)
		b = jsonwire.AppendFloat(b, m.Value)
	}
	if m.Unit != "" {
		b = append(b, `,"unit":`...)
		b = jsonwire.AppendString(b, m.Unit)
	}
	b = append(b, `,"effectiveAt":"`...)
	b = m.EffectiveAt.UTC().AppendFormat(b, time.RFC3339Nano)

	b = append(b, `"},"createdAt":"`...)
	b = created.AppendFormat(b, time.RFC3339Nano)
	return append(b, `"}`...)
}
