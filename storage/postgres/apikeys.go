package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/apikeys"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/storage/idempotency"
)

// lastUsedResolution is how stale api_keys.last_used_at may get: AuthLookup refreshes it at
// most this often per key, so authentication does not write on every request.
const lastUsedResolution = time.Minute

// APIKeys is the API key store (table api_keys, schemas/postgres/0001_core.sql): only a key's
// hash is kept, never its secret. Rotate and Revoke announce the key they change on
// KeyChangesChannel. Its writes are steps of the request's idempotency claim
// (storage/idempotency). Safe for concurrent use.
type APIKeys struct {
	pool *pgxpool.Pool
	now  func() time.Time // the clock of DisplayStatus
}

// NewAPIKeys returns the key store in pool's database (migrated).
func NewAPIKeys(pool *pgxpool.Pool) *APIKeys { return &APIKeys{pool: pool, now: time.Now} }

// Create makes a key and returns it with its secret.
func (s *APIKeys) Create(ctx context.Context, nk apikeys.NewKey) (*apikeys.CreatedKey, error) {
	nk, err := nk.Validate()
	if err != nil {
		return nil, err
	}
	var created *apikeys.CreatedKey
	err = idempotency.Tx(ctx, s.pool, &created, func(tx pgx.Tx) error {
		var err error
		created, err = insertKey(ctx, tx, nk)
		return err
	})
	return created, err
}

// insertKey inserts a key for nk, which is valid, and returns it with its secret.
func insertKey(ctx context.Context, tx pgx.Tx, nk apikeys.NewKey) (*apikeys.CreatedKey, error) {
	if !nk.Platform {
		var exists bool
		if err := tx.QueryRow(ctx, `select exists(select 1 from organizations where id = $1)`, nk.OrgID).Scan(&exists); err != nil {
			return nil, fmt.Errorf("check organization: %w", err)
		}
		if !exists {
			return nil, fault.NotFound("organization", nk.OrgID)
		}
	}
	secret, err := apikeys.GenerateKey(nk.Mode)
	if err != nil {
		return nil, err
	}
	k := apikeys.Key{ID: ids.New(ids.APIKey), OrgID: nk.OrgID, Platform: nk.Platform, Name: nk.Name, Mode: nk.Mode,
		Prefix: secret[:len(apikeys.LivePrefix)], Last4: secret[len(secret)-4:], Scopes: nk.Scopes,
		IPAllowlist: nk.IPAllowlist, Status: "active"}
	k.Masked = k.Prefix + "…" + k.Last4
	if k.Scopes == nil {
		k.Scopes = []string{}
	}
	if k.IPAllowlist == nil {
		k.IPAllowlist = []string{}
	}
	var org *string
	if !nk.Platform {
		org = &nk.OrgID
	}
	err = tx.QueryRow(ctx, `insert into api_keys (id, org_id, platform, name, mode, prefix, last4, hash, scopes, ip_allowlist)
		values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::cidr[]) returning created_at`,
		k.ID, org, k.Platform, k.Name, k.Mode, k.Prefix, k.Last4, apikeys.HashKey(secret), k.Scopes, k.IPAllowlist).Scan(&k.CreatedAt)
	if err != nil {
		return nil, fmt.Errorf("insert api key: %w", err)
	}
	return &apikeys.CreatedKey{Key: k, Secret: secret}, nil
}

const keyColumns = `id, coalesce(org_id, ''), platform, name, mode, prefix, last4, scopes, ip_allowlist::text[], status,
	rotated_at, expires_at, coalesce(replaced_by, ''), revoked_at, last_used_at, created_at`

func scanKey(row pgx.Row) (*apikeys.Key, error) {
	var k apikeys.Key
	err := row.Scan(&k.ID, &k.OrgID, &k.Platform, &k.Name, &k.Mode, &k.Prefix, &k.Last4, &k.Scopes, &k.IPAllowlist,
		&k.Status, &k.RotatedAt, &k.ExpiresAt, &k.ReplacedBy, &k.RevokedAt, &k.LastUsedAt, &k.CreatedAt)
	if err != nil {
		return nil, err
	}
	k.Masked = k.Prefix + "…" + k.Last4
	return &k, nil
}

// Lookup finds the key whose secret is key, whatever its state; apikeys.ErrNotFound if none.
func (s *APIKeys) Lookup(ctx context.Context, key string) (*apikeys.Key, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `select `+keyColumns+` from api_keys where hash = $1`, apikeys.HashKey(key)))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, apikeys.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("look up api key: %w", err)
	}
	return k, nil
}

// AuthLookup is Lookup for the authenticator: it also refreshes last_used_at of a usable key
// when that is older than lastUsedResolution, in the same round trip. (The select sees the row
// as it was before the update, which is all it needs.)
func (s *APIKeys) AuthLookup(ctx context.Context, key string) (*apikeys.Key, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `with touched as (
			update api_keys set last_used_at = now()
			where hash = $1 and status <> 'revoked' and (expires_at is null or expires_at > now())
				and (last_used_at is null or last_used_at < now() - $2::interval)
			returning id)
		select `+keyColumns+` from api_keys where hash = $1`, apikeys.HashKey(key), interval(lastUsedResolution)))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, apikeys.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("look up api key: %w", err)
	}
	return k, nil
}

// interval formats d as a PostgreSQL interval in milliseconds.
func interval(d time.Duration) string { return fmt.Sprintf("%d milliseconds", d.Milliseconds()) }

// Get returns the key with id, visible to an organization filter ("" = any); NOT_FOUND if none.
func (s *APIKeys) Get(ctx context.Context, orgFilter, id string) (*apikeys.Key, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `select `+keyColumns+` from api_keys where id = $1 and ($2 = '' or org_id = $2)`, id, orgFilter))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("api key", id)
	}
	if err != nil {
		return nil, fmt.Errorf("get api key: %w", err)
	}
	k.Status = k.DisplayStatus(s.now())
	return k, nil
}

// List returns the keys of an organization ("" = every key), newest first.
func (s *APIKeys) List(ctx context.Context, orgFilter string) ([]apikeys.Key, error) {
	rows, err := s.pool.Query(ctx, `select `+keyColumns+` from api_keys where ($1 = '' or org_id = $1) order by created_at desc, id desc`, orgFilter)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	defer rows.Close()
	out := []apikeys.Key{}
	now := s.now()
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("list api keys: %w", err)
		}
		k.Status = k.DisplayStatus(now)
		out = append(out, *k)
	}
	return out, rows.Err()
}

// Rotate issues a replacement for key id with the same organization, mode, scopes and allowlist.
// The old key keeps working for apikeys.RotationGrace, so clients switch over without downtime.
func (s *APIKeys) Rotate(ctx context.Context, orgFilter, id string) (*apikeys.CreatedKey, error) {
	var created *apikeys.CreatedKey
	err := idempotency.Tx(ctx, s.pool, &created, func(tx pgx.Tx) error {
		old, err := scanKey(tx.QueryRow(ctx, `select `+keyColumns+` from api_keys where id = $1 and ($2 = '' or org_id = $2) for update`, id, orgFilter))
		if errors.Is(err, pgx.ErrNoRows) {
			return fault.NotFound("api key", id)
		}
		if err != nil {
			return fmt.Errorf("rotate api key: %w", err)
		}
		if old.Status != "active" {
			return fault.Conflict("api key %s is %s; only an active key can be rotated", id, old.DisplayStatus(s.now()))
		}
		created, err = insertKey(ctx, tx, apikeys.NewKey{OrgID: old.OrgID, Platform: old.Platform, Name: old.Name, Mode: old.Mode,
			Scopes: old.Scopes, IPAllowlist: old.IPAllowlist})
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `update api_keys set status = 'rotated', rotated_at = now(), expires_at = now() + $2::interval, replaced_by = $3 where id = $1`,
			id, interval(apikeys.RotationGrace), created.ID)
		if err != nil {
			return err
		}
		return notifyKeyChanged(ctx, tx, id)
	})
	return created, err
}

// Revoke ends key id at once, on every node (KeyChangesChannel); JWTs issued from it die with it.
func (s *APIKeys) Revoke(ctx context.Context, orgFilter, id string) (*apikeys.Key, error) {
	var revoked int64
	err := idempotency.Tx(ctx, s.pool, &revoked, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `update api_keys set status = 'revoked', revoked_at = coalesce(revoked_at, now()) where id = $1 and ($2 = '' or org_id = $2)`, id, orgFilter)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		revoked = tag.RowsAffected()
		return notifyKeyChanged(ctx, tx, id)
	})
	if err != nil {
		return nil, fmt.Errorf("revoke api key: %w", err)
	}
	if revoked == 0 {
		return nil, fault.NotFound("api key", id)
	}
	return s.Get(ctx, orgFilter, id)
}
