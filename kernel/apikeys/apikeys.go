// Package apikeys is the vocabulary of carehub's API keys that the key store (storage/postgres)
// and the authenticator (api/auth) share: the key format and its hash, the stored key and what
// creating one needs, the rules of a key's life (validation, rotation grace, when it
// authenticates) and the identity it grants. It keeps no keys: storage/postgres.APIKeys does.
package apikeys

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strings"
	"time"

	"carehub/kernel/access"
	"carehub/kernel/fault"
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

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// ErrNotFound is what a key store's lookup by secret returns for a key it does not hold.
var ErrNotFound = errors.New("api key not found")

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

// DisplayStatus is k's status as listings show it at time now: a rotated key past its grace
// period is "expired".
func (k *Key) DisplayStatus(now time.Time) string {
	if k.Status == "rotated" && !k.Usable(now) {
		return "expired"
	}
	return k.Status
}

// Principal returns the identity k grants.
func (k *Key) Principal() *access.Principal {
	return &access.Principal{OrgID: k.OrgID, KeyID: k.ID, Mode: k.Mode, Scopes: k.Scopes, Platform: k.Platform}
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

// Validate checks nk and returns it normalized: scopes sorted and deduplicated, allowlist
// entries in their canonical prefix form. A bad request is a fault.Validation naming its
// fields. The caller's slices are not modified.
func (nk NewKey) Validate() (NewKey, error) {
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
		p, err := ParseCIDR(c)
		if err != nil {
			fields["ipAllowlist"] = fmt.Sprintf("%q is not an IP address or CIDR", c)
			continue
		}
		allowlist[i] = p.String()
	}
	if len(fields) > 0 {
		return nk, fault.Validation("invalid api key request", fields)
	}
	// Copies: the caller's slices are not ours to reorder or rewrite.
	nk.IPAllowlist = allowlist
	nk.Scopes = slices.Clone(nk.Scopes)
	slices.Sort(nk.Scopes)
	nk.Scopes = slices.Compact(nk.Scopes)
	return nk, nil
}

// CreatedKey is a new key with its secret, shown exactly once.
type CreatedKey struct {
	Key
	Secret string `json:"key"`
}

// ParseCIDR parses an allowlist entry: a CIDR or a single address. IPv4-mapped IPv6 entries
// (::ffff:192.0.2.0/120) are stored as the IPv4 prefix they denote, because client addresses are
// unmapped before the check: a dual-stack listener reports IPv4 peers in mapped form.
func ParseCIDR(s string) (netip.Prefix, error) {
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
