// Package authztest holds black-box tests of authentication and authorization across the whole
// API, run against a complete carehub node (e2e/servertest):
//
//   - matrix_test.go: the authorization matrix. Every GraphQL field of Query, Mutation and
//     Subscription (from schemas.GraphQL) and every REST route (from the routers' own mount
//     functions and schemas/openapi/openapi.json) must have a row stating the scope it needs and
//     whether it names one tenant's resource; each row is exercised with no credential, a key
//     lacking the scope, a key and a JWT holding only the scope, another tenant's key, and
//     (where patients are concerned) a test key. An operation without a row fails the suite.
//   - server_test.go: the auth endpoints (token exchange, JWKS, API keys, audit log) and the
//     HIPAA audit trail through Kafka into the audit store, end to end.
//
// It has no code of its own beyond this comment.
package authztest
