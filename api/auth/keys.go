// Package auth authenticates callers (API keys and the JWTs exchanged for them), checks IP
// allowlists and rate limits, establishes the access.Principal every service checks, and writes
// the HIPAA audit record of every live-key call and of refused credentials. One identity path
// serves REST, GraphQL and WebSocket alike.
//
// It runs no SQL. An API key's format, validation, rotation grace and the Principal it grants
// are kernel/apikeys'; the keys are kept by storage/postgres: APIKeys (the KeyStore),
// SigningKeys (the JWT signing keys, a SigningKeyStore) and KeyListener, which tells the
// Authenticator of a key revoked or rotated by any node or the CLI.
//
// File map:
//
//	keys.go           KeyStore: where the Authenticator and KeyAdmin find and change API keys
//	keyadmin.go       KeyAdmin: key management for API callers (admin:org, no escalation)
//	tokens.go         Tokens: the EdDSA JWT exchange, verification, signing keys, JWKS
//	authenticator.go  Authenticator: Authorization value → Principal, with a key cache; Recheck
//	                  for long-lived connections (a WebSocket dies with its credential)
//	refusal.go        Refusal: why a credential was refused, and the sampled audit of refusals
//	middleware.go     Authenticator.Middleware (authenticate, rate limit) and LimitBody
//	ratelimit.go      per-credential token buckets and the RateLimit headers
//	clientip.go       the client address: socket peer, or X-Forwarded-For of trusted proxies
//	audit.go          Auditor: the audit middleware (patient data waits for the broker's ack)
//	gqlop.go          GraphQLOperation: names a GraphQL call for the audit log
//	handlers.go       REST: /v1/auth/token, /.well-known/jwks.json, /v1/api-keys, /v1/audit
//
// Middleware order on an authenticated route, outermost first: LimitBody, Auditor.Middleware,
// Authenticator.Middleware, the handler.
package auth

import (
	"context"

	"carehub/kernel/apikeys"
	"carehub/storage/postgres"
)

// KeyStore keeps the API keys: postgres.APIKeys. The Authenticator reads keys from it
// (AuthLookup by secret, Get by id); KeyAdmin manages them through it. Get returns a NOT_FOUND
// fault, AuthLookup apikeys.ErrNotFound, for a key it does not hold.
type KeyStore interface {
	AuthLookup(ctx context.Context, key string) (*apikeys.Key, error)
	Get(ctx context.Context, orgFilter, id string) (*apikeys.Key, error)
	List(ctx context.Context, orgFilter string) ([]apikeys.Key, error)
	Create(ctx context.Context, nk apikeys.NewKey) (*apikeys.CreatedKey, error)
	Rotate(ctx context.Context, orgFilter, id string) (*apikeys.CreatedKey, error)
	Revoke(ctx context.Context, orgFilter, id string) (*apikeys.Key, error)
}

var _ KeyStore = (*postgres.APIKeys)(nil)
