package auth

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"carehub/processors/access"
	"carehub/processors/fault"
)

// cacheTTL bounds how long a revocation or rotation expiry takes to reach a node that has the
// key cached. Short enough for security review, long enough that a warm request does no I/O.
const cacheTTL = 5 * time.Second

// TokenVerifier verifies a JWT and returns the id of its parent key and the scopes and mode it
// carries. It is satisfied by *Tokens.
type TokenVerifier interface {
	Verify(ctx context.Context, token string) (*TokenClaims, error)
}

// Authenticator turns an Authorization value into a Principal. Keys are looked up by hash with a
// short-lived cache; JWTs are verified and tied to their parent key, so a token dies with its key.
type Authenticator struct {
	keys   *Keys
	tokens TokenVerifier
	now    func() time.Time

	mu    sync.Mutex
	cache map[string]cachedKey // by key hash (string of bytes) or "id:"+key id
}

type cachedKey struct {
	key     *Key
	fetched time.Time
}

// NewAuthenticator returns an Authenticator over keys; tokens may be nil to accept keys only.
func NewAuthenticator(keys *Keys, tokens TokenVerifier) *Authenticator {
	return &Authenticator{keys: keys, tokens: tokens, now: time.Now, cache: map[string]cachedKey{}}
}

// ErrMissingCredential, ErrMalformedCredential and ErrInvalidCredential distinguish the 401 cases
// for messages; all map to UNAUTHORIZED.
var (
	ErrMissingCredential   = fault.Unauthenticated("missing Authorization header: send 'Authorization: Bearer <API key or token>'")
	ErrMalformedCredential = fault.Unauthenticated("malformed Authorization header: expected 'Bearer <API key or token>'")
	ErrInvalidCredential   = fault.Unauthenticated("invalid, expired or revoked credential")
)

// ParseAuthorization extracts the credential from an Authorization header value. "Bearer" is
// case-insensitive; a bare key (as WebSocket connection params often carry) is accepted too.
func ParseAuthorization(v string) (string, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return "", ErrMissingCredential
	}
	if len(v) > 4096 {
		return "", ErrMalformedCredential
	}
	scheme, rest, found := strings.Cut(v, " ")
	if found {
		if !strings.EqualFold(scheme, "Bearer") {
			return "", ErrMalformedCredential
		}
		v = strings.TrimSpace(rest)
	}
	if v == "" || strings.ContainsAny(v, " \t\r\n") {
		return "", ErrMalformedCredential
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7e {
			return "", ErrMalformedCredential
		}
	}
	return v, nil
}

// Authenticate returns the principal for an Authorization value presented from clientIP.
func (a *Authenticator) Authenticate(ctx context.Context, authorization string, clientIP netip.Addr) (*access.Principal, error) {
	cred, err := ParseAuthorization(authorization)
	if err != nil {
		return nil, err
	}
	var (
		key    *Key
		claims *TokenClaims
	)
	switch {
	case strings.HasPrefix(cred, LivePrefix) || strings.HasPrefix(cred, TestPrefix):
		if !WellFormedKey(cred) {
			return nil, ErrInvalidCredential
		}
		key, err = a.lookup(ctx, "h:"+string(HashKey(cred)), func() (*Key, error) { return a.keys.Lookup(ctx, cred) })
	case strings.Count(cred, ".") == 2 && a.tokens != nil:
		claims, err = a.tokens.Verify(ctx, cred)
		if err != nil {
			return nil, err
		}
		key, err = a.lookup(ctx, "i:"+claims.KeyID, func() (*Key, error) { return a.keys.Get(ctx, "", claims.KeyID) })
	default:
		return nil, ErrInvalidCredential
	}
	if err != nil {
		if errors.Is(err, ErrKeyNotFound) || fault.KindOf(err) == fault.KindNotFound {
			return nil, ErrInvalidCredential
		}
		return nil, fault.Wrap(fault.KindUnavailable, err, "authentication is temporarily unavailable")
	}
	if !key.Usable(a.now()) {
		return nil, ErrInvalidCredential
	}
	if !allowed(key.IPAllowlist, clientIP) {
		return nil, fault.New(fault.KindIPNotAllowed, "requests from this IP address are not allowed for this key")
	}
	p := key.Principal()
	p.ClientIP = clientIP.String()
	if claims != nil {
		if claims.OrgID != key.OrgID || claims.Mode != key.Mode {
			return nil, ErrInvalidCredential
		}
		p.Scopes = intersect(claims.Scopes, key.Scopes, key.Platform)
		p.TokenID = claims.ID
	}
	return p, nil
}

func (a *Authenticator) lookup(ctx context.Context, cacheKey string, fetch func() (*Key, error)) (*Key, error) {
	now := a.now()
	a.mu.Lock()
	c, ok := a.cache[cacheKey]
	a.mu.Unlock()
	if ok && now.Sub(c.fetched) < cacheTTL {
		return c.key, nil
	}
	k, err := fetch()
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	if len(a.cache) > 100_000 {
		clear(a.cache)
	}
	a.cache[cacheKey] = cachedKey{key: k, fetched: now}
	a.mu.Unlock()
	return k, nil
}

// Forget drops cached state so a revocation made on this node applies at once.
func (a *Authenticator) Forget() {
	a.mu.Lock()
	clear(a.cache)
	a.mu.Unlock()
}

func allowed(allowlist []string, ip netip.Addr) bool {
	if len(allowlist) == 0 {
		return true
	}
	ip = ip.Unmap()
	for _, c := range allowlist {
		if p, err := netip.ParsePrefix(c); err == nil && p.Contains(ip) {
			return true
		}
	}
	return false
}

// intersect returns the token's scopes that the parent key still holds: a key whose scopes were
// narrowed cannot be widened by an older token.
func intersect(tokenScopes, keyScopes []string, platform bool) []string {
	if platform {
		return tokenScopes
	}
	out := make([]string, 0, len(tokenScopes))
	for _, s := range tokenScopes {
		for _, k := range keyScopes {
			if s == k {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// ClientIP returns the socket peer address of r. (A --trusted-proxies setting would extend this.)
func ClientIP(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}
