// Package observation is the wire format of carehub.observations.v1, beside its JSON Schema
// (schemas/kafka/observations.v1.json): Message, how intake encodes it (AppendJSON) and how the
// writer decodes it (DecodeMessage), and the id of the event each observation becomes
// (EventID). The producer (ingest/intake) and the consumer (processors/observations) both
// import it, so neither imports the other.
package observation

// WriterGroup is the default consumer group of the observation writer. It belongs to the
// topic's contract because intake watches that group's lag for backpressure.
const WriterGroup = "carehub-observations"
