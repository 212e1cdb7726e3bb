// Package auth authenticates callers (API keys and the JWTs exchanged for them), checks IP
// allowlists and rate limits, establishes the access.Principal every service checks, and writes
// the HIPAA audit record of every live-key call and of refused credentials. One identity path
// serves REST, GraphQL and WebSocket alike.
//
// File map:
//
//	keys.go           API keys: format, hashing, create, rotate (24 h grace), revoke, allowlists
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
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/storage/idempotency"
)

// Key prefixes (DECISIONS §2): the prefix tells live from test keys at a glance.
const (
	LivePrefix = "chk_live_"
	TestPrefix = "chk_test_"
	keyBodyLen = 32
)

// RotationGrace is how long a rotated key keeps working (spec: 24 hours).
const RotationGrace = 24 * time.Hour

// Bounds on what a key carries.
const (
	maxKeyName   = 200
	maxAllowlist = 64
)

// lastUsedResolution is how stale api_keys.last_used_at may get: the authenticator refreshes it
// at most this often per key, so authentication does not write on every request.
const lastUsedResolution = time.Minute

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// GenerateKey returns a new random API key of mode (access.Live or access.Test).
func GenerateKey(mode string) (string, error) {
	prefix := TestPrefix
	if mode == access.Live {
		prefix = LivePrefix
	}
	var b strings.Builder
	b.WriteString(prefix)
	max := big.NewInt(int64(len(base62)))
	for range keyBodyLen {
		n, err := rand.Int(rand.Reader, max)
		if err != nil {
			return "", fmt.Errorf("generate key: %w", err)
		}
		b.WriteByte(base62[n.Int64()])
	}
	return b.String(), nil
}

// WellFormedKey reports whether s has the shape of an API key, so obviously bad input is
// rejected before any lookup.
func WellFormedKey(s string) bool {
	var body string
	switch {
	case strings.HasPrefix(s, LivePrefix):
		body = s[len(LivePrefix):]
	case strings.HasPrefix(s, TestPrefix):
		body = s[len(TestPrefix):]
	default:
		return false
	}
	if len(body) != keyBodyLen {
		return false
	}
	for i := 0; i < len(body); i++ {
		if strings.IndexByte(base62, body[i]) < 0 {
			return false
		}
	}
	return true
}

// HashKey returns the SHA-256 of key: the only form of a key carehub stores.
func HashKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// Key is a stored API key, never with its secret.
type Key struct {
	ID          string     `json:"id"`
	OrgID       string     `json:"orgId,omitempty"`
	Platform    bool       `json:"platform"`
	Name        string     `json:"name"`
	Mode        string     `json:"mode"`
	Prefix      string     `json:"prefix"`
	Last4       string     `json:"last4"`
	Masked      string     `json:"masked"` // prefix…last4, what listings show instead of the key
	Scopes      []string   `json:"scopes"`
	IPAllowlist []string   `json:"ipAllowlist"`
	Status      string     `json:"status"` // active, rotated, revoked, expired
	RotatedAt   *time.Time `json:"rotatedAt,omitempty"`
	ExpiresAt   *time.Time `json:"expiresAt,omitempty"`
	ReplacedBy  string     `json:"replacedBy,omitempty"`
	RevokedAt   *time.Time `json:"revokedAt,omitempty"`
	LastUsedAt  *time.Time `json:"lastUsedAt,omitempty"`
	CreatedAt   time.Time  `json:"createdAt"`
}

// Usable reports whether k authenticates at time now.
func (k *Key) Usable(now time.Time) bool {
	switch k.Status {
	case "active":
		return true
	case "rotated":
		return k.ExpiresAt != nil && now.Before(*k.ExpiresAt)
	}
	return false
}

// displayStatus folds a rotated key past its grace period into "expired".
func (k *Key) displayStatus(now time.Time) string {
	if k.Status == "rotated" && !k.Usable(now) {
		return "expired"
	}
	return k.Status
}

// NewKey is what creating a key needs.
type NewKey struct {
	OrgID       string // required unless Platform
	Platform    bool
	Name        string
	Mode        string
	Scopes      []string
	IPAllowlist []string // CIDRs or single addresses
}

// CreatedKey is a new key with its secret, shown exactly once.
type CreatedKey struct {
	Key
	Secret string `json:"key"`
}

// Keys manages API keys in Postgres.
type Keys struct {
	pool *pgxpool.Pool
	now  func() time.Time
}

// NewKeys returns the key store on pool.
func NewKeys(pool *pgxpool.Pool) *Keys { return &Keys{pool: pool, now: time.Now} }

// ErrKeyNotFound is returned for an unknown, revoked or expired key.
var ErrKeyNotFound = errors.New("api key not found")

func validateNewKey(nk *NewKey) error {
	fields := map[string]string{}
	if nk.Mode != access.Live && nk.Mode != access.Test {
		fields["mode"] = "must be live or test"
	}
	if !nk.Platform && nk.OrgID == "" {
		fields["orgId"] = "required"
	}
	if len(nk.Name) > maxKeyName {
		fields["name"] = fmt.Sprintf("at most %d characters", maxKeyName)
	}
	if len(nk.IPAllowlist) > maxAllowlist {
		fields["ipAllowlist"] = fmt.Sprintf("at most %d entries", maxAllowlist)
		nk.IPAllowlist = nil
	}
	for _, s := range nk.Scopes {
		if !access.ValidScope(s) {
			fields["scopes"] = fmt.Sprintf("unknown scope %q; valid: %s", s, strings.Join(access.Scopes, ", "))
		}
	}
	allowlist := make([]string, len(nk.IPAllowlist))
	for i, c := range nk.IPAllowlist {
		p, err := parseCIDR(c)
		if err != nil {
			fields["ipAllowlist"] = fmt.Sprintf("%q is not an IP address or CIDR", c)
			continue
		}
		allowlist[i] = p.String()
	}
	if len(fields) > 0 {
		return fault.Validation("invalid api key request", fields)
	}
	// Copies: the caller's slices are not ours to reorder or rewrite.
	nk.IPAllowlist = allowlist
	nk.Scopes = slices.Clone(nk.Scopes)
	slices.Sort(nk.Scopes)
	nk.Scopes = slices.Compact(nk.Scopes)
	return nil
}

// parseCIDR parses an allowlist entry: a CIDR or a single address. IPv4-mapped IPv6 entries
// (::ffff:192.0.2.0/120) are stored as the IPv4 prefix they denote, because client addresses are
// unmapped before the check: a dual-stack listener reports IPv4 peers in mapped form.
func parseCIDR(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return netip.Prefix{}, err
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		if a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%s: zones are not allowed", s)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if a := p.Addr(); a.Is4In6() {
		if p.Bits() < 96 {
			return netip.Prefix{}, fmt.Errorf("%s reaches beyond the IPv4-mapped range", s)
		}
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked(), nil
}

// Create makes a key and returns it with its secret.
func (s *Keys) Create(ctx context.Context, nk NewKey) (*CreatedKey, error) {
	if err := validateNewKey(&nk); err != nil {
		return nil, err
	}
	var created *CreatedKey
	err := idempotency.Tx(ctx, s.pool, &created, func(tx pgx.Tx) error {
		var err error
		created, err = s.insert(ctx, tx, nk)
		return err
	})
	return created, err
}

func (s *Keys) insert(ctx context.Context, tx pgx.Tx, nk NewKey) (*CreatedKey, error) {
	if !nk.Platform {
		var exists bool
		if err := tx.QueryRow(ctx, `select exists(select 1 from organizations where id = $1)`, nk.OrgID).Scan(&exists); err != nil {
			return nil, fmt.Errorf("check organization: %w", err)
		}
		if !exists {
			return nil, fault.NotFound("organization", nk.OrgID)
		}
	}
	secret, err := GenerateKey(nk.Mode)
	if err != nil {
		return nil, err
	}
	k := Key{ID: ids.New(ids.APIKey), OrgID: nk.OrgID, Platform: nk.Platform, Name: nk.Name, Mode: nk.Mode,
		Prefix: secret[:len(LivePrefix)], Last4: secret[len(secret)-4:], Scopes: nk.Scopes,
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
		k.ID, org, k.Platform, k.Name, k.Mode, k.Prefix, k.Last4, HashKey(secret), k.Scopes, k.IPAllowlist).Scan(&k.CreatedAt)
	if err != nil {
		return nil, fmt.Errorf("insert api key: %w", err)
	}
	return &CreatedKey{Key: k, Secret: secret}, nil
}

const keyColumns = `id, coalesce(org_id, ''), platform, name, mode, prefix, last4, scopes, ip_allowlist::text[], status,
	rotated_at, expires_at, coalesce(replaced_by, ''), revoked_at, last_used_at, created_at`

func scanKey(row pgx.Row) (*Key, error) {
	var k Key
	err := row.Scan(&k.ID, &k.OrgID, &k.Platform, &k.Name, &k.Mode, &k.Prefix, &k.Last4, &k.Scopes, &k.IPAllowlist,
		&k.Status, &k.RotatedAt, &k.ExpiresAt, &k.ReplacedBy, &k.RevokedAt, &k.LastUsedAt, &k.CreatedAt)
	if err != nil {
		return nil, err
	}
	k.Masked = k.Prefix + "…" + k.Last4
	return &k, nil
}

// Lookup finds the key whose secret is key, whatever its state.
func (s *Keys) Lookup(ctx context.Context, key string) (*Key, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `select `+keyColumns+` from api_keys where hash = $1`, HashKey(key)))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrKeyNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("look up api key: %w", err)
	}
	return k, nil
}

// authLookup is Lookup for the authenticator: it also refreshes last_used_at of a usable key when
// that is older than lastUsedResolution, in the same round trip. (The select sees the row as it
// was before the update, which is all it needs.)
func (s *Keys) authLookup(ctx context.Context, key string) (*Key, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `with touched as (
			update api_keys set last_used_at = now()
			where hash = $1 and status <> 'revoked' and (expires_at is null or expires_at > now())
				and (last_used_at is null or last_used_at < now() - $2::interval)
			returning id)
		select `+keyColumns+` from api_keys where hash = $1`, HashKey(key), interval(lastUsedResolution)))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrKeyNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("look up api key: %w", err)
	}
	return k, nil
}

func interval(d time.Duration) string { return fmt.Sprintf("%d milliseconds", d.Milliseconds()) }

// Get returns the key with id, visible to an organization filter ("" = any).
func (s *Keys) Get(ctx context.Context, orgFilter, id string) (*Key, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `select `+keyColumns+` from api_keys where id = $1 and ($2 = '' or org_id = $2)`, id, orgFilter))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("api key", id)
	}
	if err != nil {
		return nil, fmt.Errorf("get api key: %w", err)
	}
	k.Status = k.displayStatus(s.now())
	return k, nil
}

// List returns the keys of an organization ("" = every key), newest first.
func (s *Keys) List(ctx context.Context, orgFilter string) ([]Key, error) {
	rows, err := s.pool.Query(ctx, `select `+keyColumns+` from api_keys where ($1 = '' or org_id = $1) order by created_at desc, id desc`, orgFilter)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	defer rows.Close()
	out := []Key{}
	now := s.now()
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("list api keys: %w", err)
		}
		k.Status = k.displayStatus(now)
		out = append(out, *k)
	}
	return out, rows.Err()
}

// Rotate issues a replacement for key id with the same organization, mode, scopes and allowlist.
// The old key keeps working for RotationGrace, so clients switch over without downtime.
func (s *Keys) Rotate(ctx context.Context, orgFilter, id string) (*CreatedKey, error) {
	var created *CreatedKey
	err := idempotency.Tx(ctx, s.pool, &created, func(tx pgx.Tx) error {
		old, err := scanKey(tx.QueryRow(ctx, `select `+keyColumns+` from api_keys where id = $1 and ($2 = '' or org_id = $2) for update`, id, orgFilter))
		if errors.Is(err, pgx.ErrNoRows) {
			return fault.NotFound("api key", id)
		}
		if err != nil {
			return fmt.Errorf("rotate api key: %w", err)
		}
		if old.Status != "active" {
			return fault.Conflict("api key %s is %s; only an active key can be rotated", id, old.displayStatus(s.now()))
		}
		created, err = s.insert(ctx, tx, NewKey{OrgID: old.OrgID, Platform: old.Platform, Name: old.Name, Mode: old.Mode,
			Scopes: old.Scopes, IPAllowlist: old.IPAllowlist})
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `update api_keys set status = 'rotated', rotated_at = now(), expires_at = now() + $2::interval, replaced_by = $3 where id = $1`,
			id, interval(RotationGrace), created.ID)
		if err != nil {
			return err
		}
		return notifyKeyChanged(ctx, tx, id)
	})
	return created, err
}

// Revoke ends key id at once, on every node (KeyChangesChannel); JWTs issued from it die with it.
func (s *Keys) Revoke(ctx context.Context, orgFilter, id string) (*Key, error) {
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

// Principal returns the identity k grants.
func (k *Key) Principal() *access.Principal {
	return &access.Principal{OrgID: k.OrgID, KeyID: k.ID, Mode: k.Mode, Scopes: k.Scopes, Platform: k.Platform}
}
