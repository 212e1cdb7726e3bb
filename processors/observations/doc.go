// Package observations is the observation writer: the consumer group ("carehub-observations")
// that stores device observations from carehub.observations.v1 in Postgres and produces one
// device.observation_received event per stored observation to carehub.events.v1. The topic's
// wire format (Message), which ingest/intake produces, is package schemas/kafka/observation,
// beside its JSON Schema.
//
// # Exactly once in effect, in the stream
//
// Intake answers 202 only after the Kafka transaction that holds a request's records commits,
// and every carehub consumer reads committed, so every record the writer sees was acknowledged
// to a client and nothing from a failed request is ever stored. The record is durable on the
// topic, so its event is derived from it in the stream rather than queued again through a
// Postgres outbox row (insert, relay claim, update, cleanup per observation halved the writer).
//
// The loop is storage/kafka/consume's runner on a transactional source (consume.Transact: a
// kgo.GroupTransactSession, rebalances held off while a poll is in hand, replaced when a
// transaction fails beyond retrying). Per poll, in one Kafka transaction:
//
//  1. Store: the poll's records, in chunks of at most ChunkSize, are Postgres transactions,
//     up to Concurrency at once: the chunk's patients are checked (and locked for key share)
//     once, and the rows of patients of their organization are copied straight into
//     observations. An id stored before (a poll read again) fails that COPY, and the chunk then
//     goes through a temporary table and INSERT … ON CONFLICT (id) DO NOTHING, which also
//     returns which rows are in observations now (new or stored before; a patient outside its
//     organization never is).
//  2. Emit: the transaction produces the event of every such observation — not only the
//     new ones, so a poll re-read after a crash still emits what it did not commit — under the
//     id EventID(observation id), and commits the poll's offsets.
//
// A crash before 2 commits aborts the transaction (a restarted writer with the same
// TransactionalID fences it at once; otherwise it times out): its events are never read, the
// offsets stay, and the poll is read again, stores nothing twice and emits the same events in a
// new transaction. A chunk that fails to store (Postgres away) fails the poll the same way
// without a crash: the transaction aborts and the runner reads the poll again after a backoff,
// the group free to rebalance meanwhile. A crash after 2 has nothing to redo. So the events topic holds one committed
// event per observation record; a record that is on the topic twice (a client that sent the
// same observation again) has its event twice under one id, which consumers deduplicate (event
// log: ON CONFLICT (id); webhooks: one delivery per (webhook, event); workflow triggers: one run
// per (workflow, event)).
//
// # Files
//
//	writer.go   Writer: the runner's handler: chunks, their stores, the events of a poll
//	store.go    the batch transaction (COPY, or staged insert) and the device-event project
//	resource.go the stored columns and resource of a message
//	event.go    the device.observation_received records
//	metrics.go  Prometheus metrics
package observations
