// Package subscriptiontest drives the GraphQL subscriptions of a whole carehub node from outside,
// as clients do: real nodes (servertest: Postgres, a Kafka-protocol broker, the HTTP server),
// real WebSocket clients in both protocols (graphql-transport-ws through api/ws/wstest, and the
// legacy graphql-ws of subscriptions-transport-ws through a small client here), and the npm
// graphql-ws and subscriptions-transport-ws libraries through api/ws/nodetest/client.mjs.
//
// Every event reaches a subscriber the way production events do: a mutation writes it to the
// outbox, the relay produces it to carehub.events.v1, and the fan-out hub of the node the
// subscriber is connected to reads it from the tail. Nothing is injected into Kafka or the hub.
//
// The package holds only tests; this file exists for its documentation.
//
//	go test ./e2e/subscriptiontest/
//
// Files:
//
//	helpers_test.go      nodes, the two protocol clients, publishing, metrics, latency summaries
//	eventstream_test.go  eventStream: latency, the types filter, tenancy, message shape
//	access_test.go       connection_init refused (4403), scopes (FORBIDDEN), other tenants (NOT_FOUND)
//	entities_test.go     agentSessionUpdated, deploymentStatusChanged, workflowRunUpdated
//	cluster_test.go      two nodes sharing Postgres and Kafka
//	slow_test.go         a client that stops reading does not delay one that reads
//	node_test.go         the npm graphql-ws and subscriptions-transport-ws clients
package subscriptiontest
