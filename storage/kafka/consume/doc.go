// Package consume is the one loop carehub's Kafka consumer groups run (the event log, audit,
// webhook, workflow-trigger and observation consumers): poll, hand the records to a Handler, and
// on failure rewind and retry the batch with backoff. Middleware adds the rest, one concern per
// file, watermill-style: Commit (offsets only after the effect) or Transact's Transaction
// (offsets inside a Kafka transaction), the consumer's metrics, and Decode (poison records are
// skipped, never retried).
//
// # Contract
//
// A Handler receives the records of one poll, in partition order. It returns nil when the effect
// of every record is durable (stored, produced, recorded); then Commit, when the consumer uses
// it, commits the batch. It returns an error when any record's effect may be missing; then the
// runner commits nothing, rewinds every partition of the batch to its first record
// (kgo.Client.SetOffsets), lets a rebalance through, waits Config.Backoff and polls again, so
// the same records come back (here or to the partitions' next owner) until the handler
// succeeds. Handlers are therefore idempotent by a natural key: a batch may be handled again
// after a failure, a crash, or a rebalance that found the batch's commit failed.
//
// # Rebalances
//
// The client must block rebalances while a poll is in hand (kgo.BlockRebalanceOnPoll; GroupOpts
// sets it): from the poll that returns a batch until the batch is handled and committed, the
// group cannot take partitions away. So a consumer never commits a partition it no longer owns,
// and on a clean rebalance hands its partitions over with nothing handled-but-uncommitted (no
// re-processing). The price is that a rebalance waits for the batch in hand, at most one handler
// call. Retrying does not hold it: a failed batch is dropped and rewound before the runner waits,
// so a store that is down for minutes does not keep the group from rebalancing. (Flushing from an
// OnPartitionsRevoked callback instead runs concurrently with the poll loop and needs a lock
// around the batch plus care for records polled just before the revoke; blocking is simpler to
// reason about.) A consumer whose effect becomes durable only after its handler returns (the
// event log writer on Postgres: a batch is visible at once and flushed to disk later) keeps
// blocking, runs its own middleware in place of Commit that queues each batch's commit until
// the effect is durable, and flushes that queue from OnPartitionsRevoked: between polls, so the
// callback never meets a batch in hand (processors/eventlog durable.go).
//
// Overlap holds two polls at times (the webhook consumer begins a poll's attempts while it
// records the poll before). Rebalances stay blocked while either is in hand; the client tells
// the runner when one waits (kgo.OnPartitionsCallbackBlocked), and the runner then ends and
// commits what it holds, lets the rebalance through, and only then polls again.
//
// # Transactions
//
// A consumer that commits its offsets inside a Kafka transaction (produce what it derives and
// commit the input in one step: the observation writer) polls through Transact, a
// kgo.GroupTransactSession, and uses its Transaction middleware instead of Commit: it begins
// a transaction before the handler and ends it after, committing the batch's offsets with what
// the handler produced (through Transact.Publisher, a publish.GroupTxn), or aborting, which
// rewinds the session to the last commit so the batch is read again. No error of ending a transaction is retryable (the transactional id is fenced
// or failed): the middleware closes the session, and after the backoff the runner has Transact
// build a new one with the same transactional id (fencing whatever the old one left open)
// before it polls again. Rebalances are blocked while a batch is in hand, as for any consumer,
// so a transaction never commits offsets of partitions the member lost.
//
// # Not run here
//
// The workflow runner (processors/workflows/runner.go) is a work queue: its records start runs
// that last minutes, executed concurrently, with offsets marked over the finished prefix of each
// partition; blocking rebalances or the next poll on a batch's runs would stall the group. The
// fan-out hub reads every partition from the end without a group: nothing to commit, retry or
// rebalance.
//
// # Files
//
//	runner.go   Config, Runner, Run: the poll loop, rewind and backoff, draining at shutdown
//	overlap.go  Overlap: Run for a consumer whose effect is mostly waiting (webhook attempts): a
//	            poll's effect is begun before the poll before is ended and committed
//	handler.go  Handler, Middleware, GroupOpts
//	commit.go   Commit: commit a batch's offsets after its effect
//	metrics.go  carehub_consumer_* by consumer: records, batches, failures, handler latency, poison
//	poison.go   Decode: records the decoder rejects are logged by position, counted and skipped
//	deadletter.go DeadLetter: a batch failed by a record's own fault is handled by halves and the
//	            records that fail alone go to a dead-letter topic; ReadDeadLettered for replay
//	transact.go Transact: a transactional session as a Source, its Transaction middleware, and
//	            its replacement after a fatal error
package consume
