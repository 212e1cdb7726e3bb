package observations

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/events"
	"carehub/kernel/jsonwire"
	"carehub/schemas/kafka/observation"
	"carehub/storage/outbox"
)

// receivedRecords returns the device.observation_received records of stored observations for
// topic, as the outbox relay publishes events (key = project id, value = the envelope, header
// event-id), with ids derived from the observation ids (EventID). The records, their headers and
// their bytes are a few allocations for the whole poll, not several for each event: the
// records are produced in one transaction and released together.
func receivedRecords(topic string, stored []observation.Message, projects map[string]string) []*kgo.Record {
	created := events.Now()
	recs := make([]kgo.Record, len(stored))
	out := make([]*kgo.Record, len(stored))
	headers := make([]kgo.RecordHeader, len(stored))
	keys := make(map[string][]byte, 1)
	buf := make([]byte, 0, len(stored)*eventSize)
	for i := range stored {
		m := &stored[i]
		id := observation.EventID(m.ID)
		project := projects[m.OrgID]
		key, ok := keys[project]
		if !ok {
			key = []byte(project)
			keys[project] = key
		}
		start := len(buf)
		buf = append(buf, id...)
		buf = appendEvent(buf, m, id, project, created)
		// Capped: what is appended after cannot reach into this record's bytes.
		headers[i] = kgo.RecordHeader{Key: outbox.HeaderEventID, Value: buf[start : start+len(id) : start+len(id)]}
		recs[i] = kgo.Record{Topic: topic, Key: key, Value: buf[start+len(id) : len(buf) : len(buf)], Headers: headers[i : i+1 : i+1]}
		out[i] = &recs[i]
	}
	return out
}

// eventSize is about the bytes of an event and its id: room enough for most polls' events in
// one buffer.
const eventSize = 560

// appendEvent appends the event of m as json.Marshal encodes a events.Event whose payload is
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
