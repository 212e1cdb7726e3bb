// Package idempotency makes a request with an Idempotency-Key take effect once (DECISIONS §3),
// also when the node that ran it dies between committing the effect and recording the answer.
//
// Every route's keys are here, in one table: a key names one request whatever the route. A
// request with a key claims it (Store.Claim) before it runs: the claim row records the
// request's hash and the running request's token and lease. The request carries the Claim in its
// context (With). Services write their effects through Tx, which makes each transaction a step
// of the claim: it locks the claim row, and it commits the step's result (what the transaction
// hands back to its caller, such as the created webhook) in a step row of the same transaction
// as the effect. When the request has answered, the answer is recorded (Claim.Complete) and
// replayed to later requests with the same key and body.
//
// If the node dies after a step committed and before the answer was recorded, the claim row
// keeps its steps. Its lease runs out, and the retry takes the claim over and runs the request
// again: each step that committed before is not run again; Tx returns its recorded result
// instead, so the request goes on from where the first attempt was cut and answers as it
// would have. So the effect happens once, and the retry still gets the answer of the effect.
// (Recording the answer in the effect's own transaction would be simpler, but the answer is
// written by the transport after the service has committed: GraphQL resolves the selection
// of the mutation's result after the resolver returns.)
//
// A request whose body is streamed (the observation intake: up to 16 MiB, hashed as it is read)
// reserves its key instead (Store.Reserve) before it knows its hash, and records the hash with
// its answer (Claim.CompleteFor); a retry reads its body, then asks Prior.Answer with its hash
// for the answer or ErrMismatch. Such a request writes through no Tx: it has no steps.
//
// A request that outlives its lease without renewing it (a node that stalls for longer than
// the lease) is fenced: the retry that took over owns the claim, and the stalled request's
// next step finds the claim gone and fails with ErrClaimLost before it writes anything.
//
// Keys are scoped to the credential (organization and API key id), and a request's hash also
// names the credential's grant (scopes and mode): a replay skips the handler and its scope
// checks, so only a credential that passed the same checks gets it. The key itself is not
// stored: its row is found by a hash derived from it, and the step results and answers are
// sealed (AES-256-GCM) under a key derived from it and from the server sealing key
// (kernel/sealing), which is not in the database: the rows reveal neither patient data nor the
// secrets that some answers carry (API keys, webhook secrets) to a reader of the database, even
// one who guesses the Idempotency-Key. A value that does not open (sealed before the server key
// was part of the seal, or by a node with another key) is ErrUnreadable, a conflict: the request
// is not run again, since its effect may have happened.
//
//	idempotency.go  Claim, With/From, Tx: the step transaction
//	store.go        Store: claim, complete, release, lease renewal, expiry
//	seal.go         key validation, derived keys, sealing and encoding of recorded values
//	hook*.go        the crash tests' kill point (built only with -tags carehub_crashtest)
package idempotency
