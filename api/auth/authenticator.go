package auth

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/kernel/config"
	"carehub/kernel/fault"
	"carehub/storage/postgres"
)

// DefaultCacheTTL is how long a key lookup is cached. Revocations and rotations made through
// the KeyStore reach every node at once (postgres.KeyListener); the TTL bounds what is not
// announced: a change while a node's listener is reconnecting, a rotated key's grace running
// out, a change made in the database by hand. Short enough for security review, long enough
// that a warm request does no I/O.
const DefaultCacheTTL = 5 * time.Second

// maxCached bounds the key cache; past it, stale entries go first, then random ones.
const maxCached = 100_000

// TokenVerifier verifies a JWT and returns the id of its parent key and the scopes and mode it
// carries. It is satisfied by *Tokens.
type TokenVerifier interface {
	Verify(ctx context.Context, token string) (*TokenClaims, error)
}

// Authenticator turns an Authorization value into a Principal. Keys are looked up by hash with a
// short-lived cache; JWTs are verified and tied to their parent key, so a token dies with its key.
// Its Middleware adds rate limits per credential and per organization. Safe for concurrent use.
type Authenticator struct {
	keys     KeyStore
	tokens   TokenVerifier
	now      func() time.Time
	clientIP func(*http.Request) netip.Addr
	limits   Limits
	wsPath   string
	ttl      time.Duration
	rate     map[Class]*limiter // by credential
	orgRate  map[Class]*limiter // by organization
	inFlight *inFlight

	mu    sync.Mutex
	cache map[string]cachedKey // "h:"+key hash, or "i:"+key id
	// forgets counts Forget and ForgetKey calls: a lookup that read the key before one of them
	// does not cache what it read, which may be the state the forget was meant to drop.
	forgets uint64
}

type cachedKey struct {
	key     *apikeys.Key // nil: no such key (negative entry)
	fetched time.Time
}

// AuthenticatorConfig configures an Authenticator. Zero fields take their defaults.
type AuthenticatorConfig struct {
	// Limits are the rate limits; unset rates take DefaultLimits()'s.
	Limits Limits
	// ClientIP finds a request's client address. Default ClientIP, the socket peer; see
	// TrustedProxies.
	ClientIP func(*http.Request) netip.Addr
	// Clock is the clock for key expiry and rate limits (tests). Default time.Now.
	Clock func() time.Time
	// WebSocketPath names the path whose WebSocket upgrades the middleware lets through
	// unauthenticated, because the credential of a subscription arrives in its connection_init
	// message, which the WebSocket handler authenticates with Authenticate. Default "/graphql".
	WebSocketPath string
	// CacheTTL is how long a key lookup is cached. Default DefaultCacheTTL.
	CacheTTL time.Duration
}

func (c *AuthenticatorConfig) defaults() {
	c.Limits = c.Limits.withDefaults()
	if c.ClientIP == nil {
		c.ClientIP = ClientIP
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	config.Default(&c.WebSocketPath, "/graphql")
	config.Default(&c.CacheTTL, DefaultCacheTTL)
}

// NewAuthenticator returns an Authenticator over keys; tokens may be nil to accept keys only.
func NewAuthenticator(keys KeyStore, tokens TokenVerifier, cfg AuthenticatorConfig) *Authenticator {
	cfg.defaults()
	return &Authenticator{keys: keys, tokens: tokens, now: cfg.Clock, clientIP: cfg.ClientIP, limits: cfg.Limits,
		wsPath: cfg.WebSocketPath, ttl: cfg.CacheTTL, cache: map[string]cachedKey{},
		rate: map[Class]*limiter{
			ClassDefault: newLimiter(cfg.Limits.Default, cfg.Limits.MaxTracked),
			ClassIngest:  newLimiter(cfg.Limits.Ingest, cfg.Limits.MaxTracked),
		},
		orgRate: map[Class]*limiter{
			ClassDefault: newLimiter(cfg.Limits.OrgDefault, cfg.Limits.MaxTracked),
			ClassIngest:  newLimiter(cfg.Limits.OrgIngest, cfg.Limits.MaxTracked),
		},
		inFlight: newInFlight(cfg.Limits.InFlight)}
}

// ErrMissingCredential, ErrMalformedCredential and ErrInvalidCredential distinguish the 401 cases
// for messages; all map to UNAUTHORIZED.
var (
	ErrMissingCredential   = fault.Unauthenticated("missing Authorization header: send 'Authorization: Bearer <API key or token>'")
	ErrMalformedCredential = fault.Unauthenticated("malformed Authorization header: expected 'Bearer <API key or token>'")
	ErrInvalidCredential   = fault.Unauthenticated("invalid, expired or revoked credential")
)

// ErrIPNotAllowed is returned for a key with an IP allowlist that excludes the client.
var ErrIPNotAllowed = fault.New(fault.KindIPNotAllowed, "requests from this IP address are not allowed for this key")

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

// Authenticate returns the principal for an Authorization value presented from clientIP. A
// refused credential is a *Refusal wrapping ErrMissingCredential, ErrMalformedCredential or
// ErrInvalidCredential (errors.Is works on it), which says for the audit log what was refused.
// A key whose IP allowlist excludes clientIP returns its principal along with ErrIPNotAllowed,
// so that the audit log can name the key the refused call was made with.
func (a *Authenticator) Authenticate(ctx context.Context, authorization string, clientIP netip.Addr) (*access.Principal, error) {
	cred, err := ParseAuthorization(authorization)
	if err != nil {
		reason := ReasonMalformed
		if errors.Is(err, ErrMissingCredential) {
			reason = ReasonMissing
		}
		return nil, refuse(err, reason, "", nil, clientIP)
	}
	var (
		key    *apikeys.Key
		claims *TokenClaims
		masked string
	)
	switch {
	case strings.HasPrefix(cred, apikeys.LivePrefix) || strings.HasPrefix(cred, apikeys.TestPrefix):
		if !apikeys.WellFormedKey(cred) {
			return nil, refuse(ErrInvalidCredential, ReasonMalformed, "", nil, clientIP)
		}
		masked = maskKey(cred)
		key, err = a.lookup("h:"+string(apikeys.HashKey(cred)), func() (*apikeys.Key, error) { return a.keys.AuthLookup(ctx, cred) })
	case strings.Count(cred, ".") == 2 && a.tokens != nil:
		masked = "jwt"
		claims, err = a.tokens.Verify(ctx, cred)
		if fault.KindOf(err) == fault.KindUnavailable {
			return nil, err
		}
		if err != nil {
			return nil, refuse(ErrInvalidCredential, ReasonInvalidToken, masked, nil, clientIP)
		}
		key, err = a.lookup("i:"+claims.KeyID, func() (*apikeys.Key, error) { return a.keys.Get(ctx, "", claims.KeyID) })
	default:
		return nil, refuse(ErrInvalidCredential, ReasonMalformed, "", nil, clientIP)
	}
	if err != nil {
		return nil, keysUnavailable(err)
	}
	now := a.now()
	switch {
	case key == nil:
		return nil, refuse(ErrInvalidCredential, ReasonUnknownKey, masked, nil, clientIP)
	case key.Status == "revoked":
		return nil, refuse(ErrInvalidCredential, ReasonRevoked, masked, key, clientIP)
	case !key.Usable(now):
		return nil, refuse(ErrInvalidCredential, ReasonExpired, masked, key, clientIP)
	case claims != nil && (claims.OrgID != key.OrgID || claims.Mode != key.Mode):
		return nil, refuse(ErrInvalidCredential, ReasonInvalidToken, masked, key, clientIP)
	}
	p := key.Principal()
	p.ClientIP = clientIP.String()
	if key.Status == "rotated" {
		p.ExpiresAt = *key.ExpiresAt // Usable: set and in the future
	}
	if claims != nil {
		p.Scopes = intersect(claims.Scopes, key.Scopes, key.Platform)
		p.TokenID = claims.ID
		if p.ExpiresAt.IsZero() || claims.ExpiresAt.Before(p.ExpiresAt) {
			p.ExpiresAt = claims.ExpiresAt
		}
	}
	if !allowed(key.IPAllowlist, clientIP) {
		return p, ErrIPNotAllowed
	}
	return p, nil
}

// keysUnavailable is the answer when the key store cannot be read: nothing is known of the key
// either way, so the call is refused as one to retry, naming the store as the other 503s name
// theirs (a client or an operator then knows it is Postgres that is down, not the credential).
func keysUnavailable(err error) error {
	return &fault.Error{Kind: fault.KindUnavailable, Err: err, Message: "authentication is temporarily unavailable",
		Details: map[string]any{"dependency": postgres.Dependency}}
}

// recheckFetchTimeout bounds Recheck's read of the key store on a cache miss; past it the key is
// unknown for now (UNAVAILABLE), and the socket is asked again at its next recheck.
const recheckFetchTimeout = 5 * time.Second

// Recheck reports whether p, a principal this Authenticator returned, still stands: it has not
// expired (a JWT's exp, a rotated key's grace), its key (a JWT's parent key) is neither revoked
// nor expired, still holds every scope p carries and still admits p's client address. Long-lived
// connections (WebSocket) call it periodically, so that revocation, rotation expiry, narrowed
// scopes and allowlists reach them as they reach requests. The key is read through the same
// cache as Authenticate: a revocation or rotation is seen at once (ForgetKey,
// postgres.KeyListener), other changes within the cache TTL, and any number of sockets of one
// key cost one lookup per TTL.
//
// It returns a *Refusal (ErrInvalidCredential), a fault.InsufficientScope, ErrIPNotAllowed, or an
// UNAVAILABLE fault when the key store cannot be read: then nothing is known either way.
func (a *Authenticator) Recheck(ctx context.Context, p *access.Principal) error {
	if p == nil {
		return ErrMissingCredential
	}
	ip, _ := netip.ParseAddr(p.ClientIP)
	now := a.now()
	if !p.ExpiresAt.IsZero() && !now.Before(p.ExpiresAt) {
		return refuse(ErrInvalidCredential, ReasonExpired, "", principalKey(p), ip)
	}
	key, err := a.lookup("i:"+p.KeyID, func() (*apikeys.Key, error) {
		// The key store is read on a cache miss only, so only then is the time bounded: a socket
		// rechecks every second, and a deadline per call would cost a timer per socket per second.
		fctx, cancel := context.WithTimeout(ctx, recheckFetchTimeout)
		defer cancel()
		return a.keys.Get(fctx, "", p.KeyID)
	})
	if err != nil {
		return keysUnavailable(err)
	}
	switch {
	case key == nil:
		return refuse(ErrInvalidCredential, ReasonUnknownKey, "", principalKey(p), ip)
	case key.Status == "revoked":
		return refuse(ErrInvalidCredential, ReasonRevoked, key.Masked, key, ip)
	case !key.Usable(now):
		return refuse(ErrInvalidCredential, ReasonExpired, key.Masked, key, ip)
	}
	if !key.Platform {
		for _, s := range p.Scopes {
			if !slices.Contains(key.Scopes, s) {
				return fault.InsufficientScope(s)
			}
		}
	}
	if !allowed(key.IPAllowlist, ip) {
		return ErrIPNotAllowed
	}
	return nil
}

// lookup returns the cached key under cacheKey, or fetches it. A key that does not exist is
// cached as nil for the TTL too, so a client retrying a dead key does not reach the database on
// every request. Errors other than not-found are not cached.
func (a *Authenticator) lookup(cacheKey string, fetch func() (*apikeys.Key, error)) (*apikeys.Key, error) {
	now := a.now()
	a.mu.Lock()
	c, ok := a.cache[cacheKey]
	forgets := a.forgets
	a.mu.Unlock()
	if ok && now.Sub(c.fetched) < a.ttl && !now.Before(c.fetched) {
		return c.key, nil
	}
	k, err := fetch()
	if errors.Is(err, apikeys.ErrNotFound) || fault.KindOf(err) == fault.KindNotFound {
		k, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if forgets != a.forgets {
		return k, nil
	}
	if len(a.cache) >= maxCached {
		a.evictLocked(now)
	}
	a.cache[cacheKey] = cachedKey{key: k, fetched: now}
	return k, nil
}

// evictLocked drops stale entries, and if that frees less than a tenth of the cache, random
// ones until it does (map iteration order is random), so one sweep serves many inserts.
func (a *Authenticator) evictLocked(now time.Time) {
	for k, c := range a.cache {
		if now.Sub(c.fetched) >= a.ttl {
			delete(a.cache, k)
		}
	}
	for k := range a.cache {
		if len(a.cache) < maxCached-maxCached/10 {
			break
		}
		delete(a.cache, k)
	}
}

// Forget drops cached state so a revocation made on this node applies at once.
func (a *Authenticator) Forget() {
	a.mu.Lock()
	clear(a.cache)
	a.forgets++
	a.mu.Unlock()
}

// ForgetKey drops the cached state of key id (both its hash and its id entries), so a
// revocation or rotation applies here at once: KeyAdmin calls it for changes made on this node,
// postgres.KeyListener for those announced by any node or the CLI.
func (a *Authenticator) ForgetKey(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.forgets++
	delete(a.cache, "i:"+id)
	for k, c := range a.cache {
		if c.key != nil && c.key.ID == id {
			delete(a.cache, k)
		}
	}
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

// ClientIP returns r's client address as this Authenticator sees it (AuthenticatorConfig.ClientIP:
// the socket peer, or the X-Forwarded-For of trusted proxies). The WebSocket handler should use it for the
// address it passes to Authenticate, so allowlists hold behind a proxy there too.
func (a *Authenticator) ClientIP(r *http.Request) netip.Addr { return a.clientIP(r) }
