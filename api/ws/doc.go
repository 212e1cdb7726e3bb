// Package ws serves GraphQL over WebSocket on /graphql: subscriptions, and queries and
// mutations too, in both wire protocols clients use today.
//
// The protocol is chosen by the Sec-WebSocket-Protocol header:
//
//   - "graphql-transport-ws": the GraphQL over WebSocket protocol of enisdenjo/graphql-ws
//     (the graphql-ws npm package, Apollo Client's GraphQLWsLink). Preferred when a client
//     offers both.
//   - "graphql-ws": the legacy protocol of apollographql/subscriptions-transport-ws.
//
// A client that offers neither is accepted and closed at once with 4406 "Subprotocol not
// acceptable", as the graphql-ws server does.
//
// # Authentication
//
// The connection_init payload carries the credential under "Authorization" (an API key or a
// JWT, with or without "Bearer "). Executor.Authenticate turns it into a context that every
// operation on the socket then runs under: an operation never re-authenticates, and a socket
// whose init failed never runs one. When that context ends while the socket is open (the
// executor may give it the credential's expiry as deadline) the socket is closed with 4403
// "Forbidden: credential expired", and the client reconnects with a fresh one.
//
// A credential can also be withdrawn while the socket is open: an API key revoked (on any
// node), rotated past its grace, its scopes or allowlist narrowed. An Executor that is a
// Rechecker is asked every RecheckInterval whether the credential still stands; when it no
// longer does, the socket is closed with 4403 "Forbidden: credential no longer valid" and every
// operation on it ends.
//
// # Close codes
//
// graphql-transport-ws, as its PROTOCOL.md and the graphql-ws server define them:
//
//	4400 <reason>                              invalid message (bad JSON, unknown type, bad payload)
//	4401 Unauthorized                          subscribe before connection_ack
//	4403 Forbidden: <why>                      connection_init with no credential ("payload has
//	                                           no "Authorization"") or a bad one ("invalid API
//	                                           key or token"), or the credential expired or was
//	                                           withdrawn (both protocols)
//	4406 Subprotocol not acceptable            neither subprotocol offered (both protocols)
//	4408 Connection initialisation timeout     no successful connection_init within InitTimeout
//	4409 Subscriber for <id> already exists    subscribe with the id of an active operation
//	4429 Too many initialisation requests      a second connection_init
//	4500 Internal server error                 the server failed handling a message (a panic)
//
// The legacy protocol answers bad JSON with connection_error and unknown types with error,
// and keeps the socket open (its PROTOCOL.md); a failed init is connection_error followed by
// close 4403, a second init connection_error and 4429, no init within InitTimeout 4408.
// A start with the id of an active operation replaces it, as the reference server does, but
// silently: the old operation's messages and its complete are not sent, so the client cannot
// mistake them for the new one's. A server failure while handling a message closes with 1011.
//
// Chosen by this package, for both protocols:
//
//	4008 Subscriber too slow   the connection's send queue stayed full for SlowConsumerTimeout,
//	                           or the executor's event source dropped an operation (CloseSlow)
//	4013 Too many sockets for this credential
//	                           connection_init of a credential that holds Limits.SocketsPerKey
//	                           sockets already (legacy: connection_error first)
//	1009 (message too big)     an incoming message larger than MaxMessageBytes
//	1001 Going away            the server is shutting down (Handler.Shutdown)
//
// 4008 and 4013 sit in the private range beside graphql-ws's own codes and collide with none of
// them (4000 plus 1008 Policy Violation, 1013 Try Again Later); graphql-ws clients treat them as
// retryable (unlike 1008), so a client that fell behind, or whose key holds too many sockets,
// reconnects with back-off instead of giving up. A socket whose peer does not answer the
// keep-alive ping within KeepAlive is dropped without a close frame: nobody is there to read it.
//
// # Limits
//
// Beside MaxOperationsPerConn, Limits cap the operations one credential runs over all its sockets
// (with an Executor that is an Owner) and those of the whole node: a subscribe past any of them
// is answered, for that operation only, with an error message RATE_LIMITED whose extensions name
// the limit ("per": connection, key or node). Sockets per credential are counted from a
// successful connection_init; unauthenticated sockets are bounded by InitTimeout and the HTTP
// server's connection cap.
//
// # Concurrency and backpressure
//
// Each connection has exactly these goroutines, all owned by its reader, which waits for every
// one of them before it ends (the timed duties' too); Handler.Shutdown waits for the readers:
//
//   - the reader, started by the ServeHTTP call that accepted the socket, which then returns:
//     reads and handles client messages in order;
//     connection_init is authenticated inline, so nothing runs before the ack.
//   - while a ping waits for operations to start (below), one goroutine that answers it.
//   - while something is queued, the writer: the only goroutine that writes data frames. It
//     drains the send queue, one frame at a time, each under WriteTimeout, and ends when the
//     queue is empty; the next message queued starts it again. It performs the close handshake
//     at the end.
//   - while a timed duty runs, its timer's goroutine: the init timeout, the protocol keep-alive
//     (legacy "ka") with a WebSocket ping (the goroutine waits for the pong), and the
//     credential re-check (Rechecker). Between duties a socket has no goroutine for them: an
//     idle subscriber costs its reader goroutine only.
//   - one per operation: runs Executor.Execute and turns its responses into messages. Results
//     that are a Notifier (the GraphQL layer's shared subscriptions) hold it only while a
//     response is there to send: a subscriber waiting for its next event holds none.
//
// Every outgoing message goes through one bounded queue per connection (SubscriberBuffer
// messages and Limits.QueueBytes bytes, held as one count of bytes in which a message weighs at
// least QueueBytes/SubscriberBuffer; the queue holds memory only while something waits in it).
// An operation that finds the queue full, in either,
// waits at most SlowConsumerTimeout for room and then closes the connection with 4008; memory
// per connection is thus bounded by the queue plus one pending message per operation, and a slow client stalls nothing but its own
// operations. Closing a connection, for whatever reason, cancels the context of all its
// operations and waits for their goroutines.
//
// # Ping as a barrier
//
// In graphql-transport-ws a ping is answered once every operation subscribed before it has
// started: Executor.Execute has returned, so a subscription's source holds it and the events
// from then on reach it. A client that must not miss the next event (a script that subscribes in
// the background and then causes the event, as the README tour does with carehub subscribe
// --ready-file) sends ping after subscribe and waits for the pong. The reader does not wait: the
// pong is sent by a goroutine, one for all the pings owed at a time, so a long query holds up
// only the pongs sent after it.
//
// # Files
//
//	handler.go    Executor, Rechecker, Request, Response, Config, Handler (upgrade, shutdown)
//	conn.go       one socket: reader, send queue, writer, timed duties, operations, closing
//	limits.go     Owner, Limits: sockets and operations per credential and per node
//	transport.go  graphql-transport-ws messages
//	legacy.go     subscriptions-transport-ws messages
//	message.go    envelope and payload parsing, encoding
//	metrics.go    Prometheus collectors
//	adapt.go      ResponsesFrom, for executors built on graph-gophers' Schema.Subscribe
//	slow.go       CloseSlow, for executors whose event source drops a subscriber that fell behind
//	wstest/       a minimal graphql-transport-ws client for black-box tests
//	nodetest/     the real graphql-ws and subscriptions-transport-ws clients, run by node_test.go
package ws
