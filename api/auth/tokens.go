package auth

import (
	"context"
	"time"
)

// TokenClaims are the verified claims of a carehub JWT (DECISIONS §2).
type TokenClaims struct {
	ID        string // jti
	KeyID     string // sub: the parent API key
	OrgID     string
	Mode      string
	Scopes    []string
	IssuedAt  time.Time
	ExpiresAt time.Time
}

// Tokens issues and verifies JWTs. (Ed25519 signing keys live in Postgres.)
type Tokens struct{}

// Verify is completed by the JWT exchange work; until then no token verifies.
func (t *Tokens) Verify(ctx context.Context, token string) (*TokenClaims, error) {
	return nil, ErrInvalidCredential
}
