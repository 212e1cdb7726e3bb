package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SigningKey is a row of jwt_signing_keys: an Ed25519 key the JWTs of every node are signed
// with (the active one, RetiredAt nil) or still verified with (a retired one).
type SigningKey struct {
	KID       string // the RFC 7638 thumbprint of Public
	Seed      []byte // the private key's seed (ed25519.SeedSize)
	Public    []byte // ed25519.PublicKeySize
	RetiredAt *time.Time
}

// SigningKeys is the store of the JWT signing keys every node shares (table jwt_signing_keys,
// schemas/postgres/0001_core.sql; at most one active, 0005_auth.sql). Safe for concurrent use.
type SigningKeys struct {
	pool *pgxpool.Pool
}

// NewSigningKeys returns the signing key store in pool's database (migrated).
func NewSigningKeys(pool *pgxpool.Pool) *SigningKeys { return &SigningKeys{pool: pool} }

// Create inserts k as the active key unless there is one already; then it does nothing. The
// partial unique index jwt_signing_keys_one_active makes this race-safe between nodes.
func (s *SigningKeys) Create(ctx context.Context, k SigningKey) error {
	if _, err := s.pool.Exec(ctx, `insert into jwt_signing_keys (kid, private_key, public_key) values ($1, $2, $3) on conflict do nothing`,
		k.KID, k.Seed, k.Public); err != nil {
		return fmt.Errorf("create signing key: %w", err)
	}
	return nil
}

// Load returns the active key and the keys retired within the last retiredWithin, oldest first.
func (s *SigningKeys) Load(ctx context.Context, retiredWithin time.Duration) ([]SigningKey, error) {
	rows, err := s.pool.Query(ctx, `select kid, private_key, public_key, retired_at from jwt_signing_keys
		where retired_at is null or retired_at > now() - $1::interval order by created_at`, interval(retiredWithin))
	if err != nil {
		return nil, fmt.Errorf("load signing keys: %w", err)
	}
	defer rows.Close()
	var out []SigningKey
	for rows.Next() {
		var k SigningKey
		if err := rows.Scan(&k.KID, &k.Seed, &k.Public, &k.RetiredAt); err != nil {
			return nil, fmt.Errorf("load signing keys: %w", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load signing keys: %w", err)
	}
	return out, nil
}
