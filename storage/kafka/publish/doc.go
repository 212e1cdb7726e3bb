// Package publish is carehub's one way of putting records on Kafka (the publishing port):
// every produce of the module's code goes through a route of this package, each named for its
// guarantee, and every route passes the conformance suite in publishtest, on the embedded
// broker and on Apache Kafka.
//
// The routes:
//
//	Acked          single records of an idempotent producer (acks=all), each durable once
//	               acknowledged: All waits for every ack (dead letters, replays), Each
//	               returns each record's outcome (the outbox relay), Within waits at most a
//	               bound (the feed's single events), Go does not wait and drops when the
//	               buffer is full (the audit publisher)
//	Transactional  a pool of transactional clients: a Txn's records are read all or none
//	               (the observation intake, the feed's event batches)
//	GroupTxn       records produced inside a consumer group's transaction, committed or aborted
//	               with its offsets (the observation writer, through consume.Transact)
//
// The routes are thin: each wraps a franz-go client and adds no goroutine, channel or lock per
// record beyond what the call it replaces had, because the intake's and the writer's produce
// run at tens of thousands of records a second. Records are franz-go's *kgo.Record, built by
// the callers.
//
// File map:
//
//	acked.go          Acked
//	transactional.go  Transactional, Txn
//	grouptxn.go       GroupTxn
//	publishtest/      the conformance suite every route runs
//
// TestOnlyThePortProduces fails on a call of Produce, ProduceSync or TryProduce in the module's
// non-test code outside this package.
package publish
