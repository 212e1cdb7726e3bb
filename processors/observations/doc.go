// Package observations is the observation writer: the consumer group ("carehub-observations")
// that stores device observations from carehub.observations.v1 in Postgres and queues one
// device.observation_received event per observation it stores, and the wire format of that
// topic (Message), which ingest/observations produces.
//
// # Effectively once
//
// Intake answers 202 only after the Kafka transaction that holds a request's records commits,
// and the writer reads read-committed, so every record the writer sees was acknowledged to a
// client and nothing from a failed request is ever stored. Delivery to the writer is at least
// once; storing is idempotent by observation id: one Postgres transaction per partition's share
// of a poll (up to Concurrency at once) copies the records into a temporary table, inserts them
// with ON CONFLICT (id) DO NOTHING RETURNING id, and appends to the outbox
// (processors/events.Append) the events of exactly the returned ids. So an observation is stored if and only if its event
// is queued, and a redelivered record stores nothing and queues nothing. The outbox relay
// publishes each row at least once under the event id EventID(observation id), derived rather
// than random, so every copy carries one id and consumers that deduplicate by event id (event
// log, webhooks) see the event once.
//
// Offsets are committed only for stored records (marked after commit; committed then, on
// revoke and on close), and rebalances wait for the batch in hand (kgo.BlockRebalanceOnPoll).
// A writer killed at any point leaves at worst a batch stored but not committed, which its
// successor re-reads and skips.
//
// # Files
//
//	message.go  Message, DecodeMessage, EventID: the topic's records
//	writer.go   Writer: the consumer loop, commits, rebalances
//	store.go    the batch transaction (COPY, insert, events) and the device-event project
//	metrics.go  Prometheus metrics
package observations
