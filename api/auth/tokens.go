package auth

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/storage/postgres"
)

// JWT exchange (spec Authentication 6, DECISIONS §2): an API key buys a short-lived EdDSA token
// carrying a subset of its scopes.
const (
	Issuer = "carehub"
	// Audience is the aud of every token carehub issues, and required of every token it
	// accepts: a token minted by the same signing keys for another audience (or by a JWT
	// library's defaults, with none) is not a carehub API credential.
	Audience      = "carehub-api"
	TokenLifetime = time.Hour
	tokenType     = "Bearer"
	// maxTokenLen bounds what Verify parses; carehub's tokens are about 500 bytes.
	maxTokenLen = 4096
	// iatSkew tolerates nodes whose clocks run a little ahead of the verifier's.
	iatSkew = time.Minute
	// keysRefresh is how often the signing and verification keys are re-read, so a key retired
	// in the database stops signing on every node within it.
	keysRefresh = 5 * time.Minute
	// unknownKidReload is the least time between reloads caused by an unknown kid, so random
	// kids cannot turn into database load.
	unknownKidReload = 5 * time.Second
)

// TokenClaims are the verified claims of a carehub JWT (DECISIONS §2).
type TokenClaims struct {
	ID        string // jti
	KeyID     string // sub: the parent API key
	OrgID     string // "" for the platform operator
	Mode      string
	Scopes    []string
	IssuedAt  time.Time
	ExpiresAt time.Time
}

// IssuedToken is the token endpoint's response body (spec Authentication 6).
type IssuedToken struct {
	AccessToken string `json:"access_token"`
	TokenType   string `json:"token_type"`
	ExpiresIn   int    `json:"expires_in"`
	Scope       string `json:"scope"`
	IssuedAt    string `json:"issued_at"` // RFC 3339, UTC, seconds
}

// claims is the JWT payload. Pointers tell a missing claim from an empty one: org is "" for the
// platform operator but must be present.
type claims struct {
	jwt.RegisteredClaims
	Org   *string `json:"org"`
	Scope *string `json:"scope"`
	Mode  string  `json:"mode"`
}

// Validate implements jwt.ClaimsValidator: every carehub claim is required.
func (c *claims) Validate() error {
	switch {
	case !strings.HasPrefix(c.Subject, "key_"):
		return errors.New("sub must be an API key id")
	case c.ID == "":
		return errors.New("missing jti")
	case c.IssuedAt == nil:
		return errors.New("missing iat")
	case c.ExpiresAt == nil:
		return errors.New("missing exp")
	case c.Org == nil:
		return errors.New("missing org")
	case c.Scope == nil:
		return errors.New("missing scope")
	case c.Mode != access.Live && c.Mode != access.Test:
		return errors.New("mode must be live or test")
	case c.ExpiresAt.Sub(c.IssuedAt.Time) > TokenLifetime:
		return errors.New("lifetime longer than carehub issues")
	}
	return nil
}

type signingKey struct {
	kid       string
	private   ed25519.PrivateKey // nil for keys loaded for verification only
	public    ed25519.PublicKey
	retiredAt *time.Time
}

// SigningKeyStore keeps the JWT signing keys every node shares: postgres.SigningKeys. Create
// does nothing when an active key exists already; Load returns the active key and those retired
// within retiredWithin.
type SigningKeyStore interface {
	Create(ctx context.Context, k postgres.SigningKey) error
	Load(ctx context.Context, retiredWithin time.Duration) ([]postgres.SigningKey, error)
}

var _ SigningKeyStore = (*postgres.SigningKeys)(nil)

// Tokens issues and verifies carehub JWTs: EdDSA (Ed25519) with a kid header. Signing keys live
// in a SigningKeyStore, shared by every node: the first node to need one creates it, and the
// others load it. Keys are cached; a token with an unknown kid triggers a reload (at most
// every few seconds), so a key made by another node is found. The zero value and nil verify
// nothing and issue nothing. Safe for concurrent use.
type Tokens struct {
	store  SigningKeyStore // nil: the keys are fixed (tests, fuzzing)
	now    func() time.Time
	parser *jwt.Parser

	loadMu sync.Mutex // serializes loads and key creation

	mu       sync.RWMutex
	signer   *signingKey
	verify   map[string]*signingKey
	loadedAt time.Time // last successful load
	triedAt  time.Time // last load caused by an unknown kid

	// verified caches the claims of tokens that verified, by SHA-256 of the token, until they
	// expire: an Ed25519 verification costs about 50 µs, a hash and a map lookup about 1 µs.
	// Only the signature and claims checks are skipped; the parent key is still checked on
	// every request by the Authenticator.
	vmu      sync.Mutex
	verified map[[sha256.Size]byte]*TokenClaims
}

// maxVerified bounds the verified-token cache; past it, expired entries go first, then random
// ones.
const maxVerified = 100_000

// NewTokens returns the token service with the signing keys of store.
func NewTokens(store SigningKeyStore) *Tokens {
	return newTokens(store, time.Now)
}

func newTokens(store SigningKeyStore, now func() time.Time) *Tokens {
	t := &Tokens{store: store, now: now}
	t.parser = jwt.NewParser(
		jwt.WithValidMethods([]string{jwt.SigningMethodEdDSA.Alg()}),
		jwt.WithIssuer(Issuer),
		jwt.WithAudience(Audience),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(func() time.Time { return t.now() }),
		jwt.WithStrictDecoding(),
	)
	return t
}

// Issue exchanges the API key of p for a token carrying scopes (spec Authentication 6). Only a
// caller authenticated with an API key may exchange (a token cannot mint tokens); every scope
// must be a scope of the spec's table (else VALIDATION_FAILED) held by the key (else
// INSUFFICIENT_SCOPE). Duplicates are dropped; the order is kept.
func (t *Tokens) Issue(ctx context.Context, p *access.Principal, scopes []string) (*IssuedToken, error) {
	if p == nil {
		return nil, ErrMissingCredential
	}
	if p.TokenID != "" {
		return nil, fault.New(fault.KindForbidden, "a token cannot be exchanged: present an API key")
	}
	granted := make([]string, 0, len(scopes))
	for _, s := range scopes {
		if !access.ValidScope(s) {
			return nil, fault.Validation("invalid scope", map[string]string{
				"scope": fmt.Sprintf("unknown scope %q; valid: %s", s, strings.Join(access.Scopes, ", "))})
		}
		if !slices.Contains(granted, s) {
			granted = append(granted, s)
		}
	}
	for _, s := range granted {
		if !p.Has(s) {
			return nil, fault.InsufficientScope(s)
		}
	}
	key, err := t.signingKey(ctx)
	if err != nil {
		return nil, err
	}
	iat := t.now().UTC().Truncate(time.Second)
	scope := strings.Join(granted, " ")
	org := p.OrgID
	c := &claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    Issuer,
			Audience:  jwt.ClaimStrings{Audience},
			Subject:   p.KeyID,
			IssuedAt:  jwt.NewNumericDate(iat),
			ExpiresAt: jwt.NewNumericDate(iat.Add(TokenLifetime)),
			ID:        ids.New("jti_"),
		},
		Org: &org, Scope: &scope, Mode: p.Mode,
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, c)
	tok.Header["kid"] = key.kid
	signed, err := tok.SignedString(key.private)
	if err != nil {
		return nil, fmt.Errorf("sign token: %w", err)
	}
	return &IssuedToken{AccessToken: signed, TokenType: tokenType, ExpiresIn: int(TokenLifetime / time.Second),
		Scope: scope, IssuedAt: iat.Format(time.RFC3339)}, nil
}

// errKeysUnavailable marks a verification that failed because keys could not be loaded, which
// is a 503, not a 401.
type errKeysUnavailable struct{ err error }

func (e errKeysUnavailable) Error() string { return "load signing keys: " + e.err.Error() }
func (e errKeysUnavailable) Unwrap() error { return e.err }

// Verify checks token and returns its claims. Anything but a well-formed, unexpired EdDSA token
// signed by a current carehub key with every claim present (iss carehub, aud Audience, sub, org,
// scope, mode, iat, exp, jti) is ErrInvalidCredential; alg "none", HMAC with the public key as secret and
// every other algorithm are refused before any key is consulted.
func (t *Tokens) Verify(ctx context.Context, token string) (*TokenClaims, error) {
	if t == nil || t.parser == nil || len(token) > maxTokenLen {
		return nil, ErrInvalidCredential
	}
	sum := sha256.Sum256([]byte(token))
	if c := t.cached(sum); c != nil {
		return c, nil
	}
	var c claims
	_, err := t.parser.ParseWithClaims(token, &c, func(tok *jwt.Token) (any, error) {
		kid, _ := tok.Header["kid"].(string)
		if kid == "" {
			return nil, errors.New("missing kid")
		}
		k, err := t.verificationKey(ctx, kid)
		if err != nil {
			return nil, err
		}
		return k.public, nil
	})
	if err != nil {
		var ku errKeysUnavailable
		if errors.As(err, &ku) {
			return nil, keysUnavailable(err)
		}
		return nil, ErrInvalidCredential
	}
	if c.IssuedAt.After(t.now().Add(iatSkew)) {
		return nil, ErrInvalidCredential
	}
	out := &TokenClaims{ID: c.ID, KeyID: c.Subject, OrgID: *c.Org, Mode: c.Mode,
		Scopes: strings.Fields(*c.Scope), IssuedAt: c.IssuedAt.Time, ExpiresAt: c.ExpiresAt.Time}
	for _, s := range out.Scopes {
		if !access.ValidScope(s) {
			return nil, ErrInvalidCredential
		}
	}
	t.remember(sum, out)
	return out, nil
}

// cached returns a copy of the claims of a token that verified and has not expired.
func (t *Tokens) cached(sum [sha256.Size]byte) *TokenClaims {
	t.vmu.Lock()
	c := t.verified[sum]
	t.vmu.Unlock()
	if c == nil || !t.now().Before(c.ExpiresAt) {
		return nil
	}
	cp := *c
	cp.Scopes = slices.Clone(c.Scopes)
	return &cp
}

func (t *Tokens) remember(sum [sha256.Size]byte, c *TokenClaims) {
	cp := *c
	cp.Scopes = slices.Clone(c.Scopes)
	now := t.now()
	t.vmu.Lock()
	defer t.vmu.Unlock()
	if t.verified == nil {
		t.verified = map[[sha256.Size]byte]*TokenClaims{}
	}
	if len(t.verified) >= maxVerified {
		for k, v := range t.verified {
			if !now.Before(v.ExpiresAt) {
				delete(t.verified, k)
			}
		}
		for k := range t.verified {
			if len(t.verified) < maxVerified-maxVerified/10 {
				break
			}
			delete(t.verified, k)
		}
	}
	t.verified[sum] = &cp
}

// verificationKey returns the key kid, reloading once if it is unknown and no reload for an
// unknown kid happened within unknownKidReload.
func (t *Tokens) verificationKey(ctx context.Context, kid string) (*signingKey, error) {
	if err := t.ensureLoaded(ctx); err != nil {
		return nil, err
	}
	t.mu.RLock()
	k := t.verify[kid]
	due := t.now().Sub(t.triedAt) >= unknownKidReload
	t.mu.RUnlock()
	if k == nil && due {
		t.mu.Lock()
		t.triedAt = t.now()
		t.mu.Unlock()
		if err := t.load(ctx); err != nil {
			return nil, errKeysUnavailable{err}
		}
		t.mu.RLock()
		k = t.verify[kid]
		t.mu.RUnlock()
	}
	if k == nil {
		return nil, errors.New("unknown kid")
	}
	if k.retiredAt != nil && t.now().After(k.retiredAt.Add(TokenLifetime)) {
		return nil, errors.New("retired kid")
	}
	return k, nil
}

// ensureLoaded loads the keys when they were never loaded or are older than keysRefresh.
func (t *Tokens) ensureLoaded(ctx context.Context) error {
	t.mu.RLock()
	fresh := t.store == nil || t.verify != nil && t.now().Sub(t.loadedAt) < keysRefresh
	t.mu.RUnlock()
	if fresh {
		return nil
	}
	if err := t.load(ctx); err != nil {
		return errKeysUnavailable{err}
	}
	return nil
}

// signingKey returns the active key, creating it when no node has yet.
func (t *Tokens) signingKey(ctx context.Context) (*signingKey, error) {
	if t == nil || t.parser == nil {
		return nil, fault.Unavailable("token exchange is not configured")
	}
	if err := t.ensureLoaded(ctx); err != nil {
		return nil, fault.Wrap(fault.KindUnavailable, err, "token exchange is temporarily unavailable")
	}
	t.mu.RLock()
	k := t.signer
	t.mu.RUnlock()
	if k != nil {
		return k, nil
	}
	if err := t.create(ctx); err != nil {
		return nil, fault.Wrap(fault.KindUnavailable, err, "token exchange is temporarily unavailable")
	}
	t.mu.RLock()
	k = t.signer
	t.mu.RUnlock()
	if k == nil {
		return nil, fault.Unavailable("token exchange is temporarily unavailable")
	}
	return k, nil
}

// EnsureSigningKey makes sure an active signing key exists and is loaded, so the first token
// exchange does not pay for creating it. Servers call it at start.
func (t *Tokens) EnsureSigningKey(ctx context.Context) error {
	_, err := t.signingKey(ctx)
	return err
}

// create stores a new key unless another node has one active (the store's Create is race-safe
// between nodes), and loads the active one.
func (t *Tokens) create(ctx context.Context) error {
	if t.store == nil {
		return errors.New("no signing key store")
	}
	t.loadMu.Lock()
	defer t.loadMu.Unlock()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("generate signing key: %w", err)
	}
	if err := t.store.Create(ctx, postgres.SigningKey{KID: thumbprint(pub), Seed: priv.Seed(), Public: pub}); err != nil {
		return err
	}
	return t.loadLocked(ctx)
}

func (t *Tokens) load(ctx context.Context) error {
	if t.store == nil {
		return nil
	}
	t.loadMu.Lock()
	defer t.loadMu.Unlock()
	return t.loadLocked(ctx)
}

// loadLocked reads the active key and the retired keys whose tokens may still be live.
func (t *Tokens) loadLocked(ctx context.Context) error {
	stored, err := t.store.Load(ctx, TokenLifetime+iatSkew)
	if err != nil {
		return err
	}
	verify := map[string]*signingKey{}
	var signer *signingKey
	for _, sk := range stored {
		if len(sk.Seed) != ed25519.SeedSize || len(sk.Public) != ed25519.PublicKeySize {
			return fmt.Errorf("signing key %s is corrupt", sk.KID)
		}
		k := &signingKey{kid: sk.KID, public: ed25519.PublicKey(sk.Public), retiredAt: sk.RetiredAt}
		if k.retiredAt == nil {
			k.private = ed25519.NewKeyFromSeed(sk.Seed)
			signer = k
		}
		verify[k.kid] = k
	}
	t.mu.Lock()
	t.signer, t.verify, t.loadedAt = signer, verify, t.now()
	t.mu.Unlock()
	return nil
}

// thumbprint is the RFC 7638 JWK thumbprint of an Ed25519 public key (RFC 8037), the kid.
func thumbprint(pub ed25519.PublicKey) string {
	canonical := `{"crv":"Ed25519","kty":"OKP","x":"` + base64.RawURLEncoding.EncodeToString(pub) + `"}`
	sum := sha256.Sum256([]byte(canonical))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// JWK is a public JSON Web Key (RFC 8037 OKP).
type JWK struct {
	Kty string `json:"kty"` // OKP
	Crv string `json:"crv"` // Ed25519
	X   string `json:"x"`
	Kid string `json:"kid"`
	Alg string `json:"alg"` // EdDSA
	Use string `json:"use"` // sig
}

// JWKSet is the body of GET /.well-known/jwks.json.
type JWKSet struct {
	Keys []JWK `json:"keys"`
}

// JWKS returns the public keys that verify current tokens, creating the first signing key if
// there is none yet.
func (t *Tokens) JWKS(ctx context.Context) (JWKSet, error) {
	if _, err := t.signingKey(ctx); err != nil {
		return JWKSet{}, err
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	set := JWKSet{Keys: []JWK{}}
	for _, k := range t.verify {
		if k.retiredAt != nil && t.now().After(k.retiredAt.Add(TokenLifetime)) {
			continue
		}
		set.Keys = append(set.Keys, JWK{Kty: "OKP", Crv: "Ed25519", X: base64.RawURLEncoding.EncodeToString(k.public),
			Kid: k.kid, Alg: jwt.SigningMethodEdDSA.Alg(), Use: "sig"})
	}
	slices.SortFunc(set.Keys, func(a, b JWK) int { return strings.Compare(a.Kid, b.Kid) })
	return set, nil
}
