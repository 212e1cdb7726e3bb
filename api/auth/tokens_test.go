package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/kernel/fault"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

// fixedKey is a deterministic signing key for tests and fuzzing that need no database.
func fixedKey(seed string) *signingKey {
	s := sha256.Sum256([]byte(seed))
	priv := ed25519.NewKeyFromSeed(s[:])
	pub := priv.Public().(ed25519.PublicKey)
	return &signingKey{kid: thumbprint(pub), private: priv, public: pub}
}

// staticTokens returns Tokens over fixed keys (the first signs), without a database.
func staticTokens(now func() time.Time, keys ...*signingKey) *Tokens {
	t := newTokens(nil, now)
	t.verify = map[string]*signingKey{}
	for _, k := range keys {
		t.verify[k.kid] = k
	}
	t.signer = keys[0]
	return t
}

// validClaims returns the claims of a token carehub would issue at iat.
func validClaims(iat time.Time) jwt.MapClaims {
	return jwt.MapClaims{
		"iss": Issuer, "aud": Audience, "sub": "key_01jabcdefghjkmnpqrstvwxyz0", "org": "org_01jabcdefghjkmnpqrstvwxyz0",
		"scope": "read:patients exec:agents", "mode": "live", "iat": iat.Unix(), "exp": iat.Add(time.Hour).Unix(),
		"jti": "jti_01jabcdefghjkmnpqrstvwxyz0",
	}
}

// signWith signs claims with method and key, setting header fields (a nil value deletes one).
func signWith(t testing.TB, method jwt.SigningMethod, key any, claims jwt.MapClaims, header map[string]any) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, claims)
	for k, v := range header {
		if v == nil {
			delete(tok.Header, k)
		} else {
			tok.Header[k] = v
		}
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatalf("sign: %v", err)
	}
	return s
}

func TestVerifyAcceptsCarehubToken(t *testing.T) {
	clk := newClock()
	k := fixedKey("a")
	tk := staticTokens(clk.now, k)
	tok := signWith(t, jwt.SigningMethodEdDSA, k.private, validClaims(clk.now()), map[string]any{"kid": k.kid})
	c, err := tk.Verify(context.Background(), tok)
	if err != nil {
		t.Fatal(err)
	}
	if c.KeyID != "key_01jabcdefghjkmnpqrstvwxyz0" || c.OrgID != "org_01jabcdefghjkmnpqrstvwxyz0" || c.Mode != access.Live ||
		strings.Join(c.Scopes, " ") != "read:patients exec:agents" || c.ID != "jti_01jabcdefghjkmnpqrstvwxyz0" {
		t.Fatalf("claims %+v", c)
	}
}

func TestVerifyRejects(t *testing.T) {
	clk := newClock()
	k := fixedKey("a")
	other := fixedKey("b")
	tk := staticTokens(clk.now, k)
	now := clk.now()
	edHeader := map[string]any{"kid": k.kid}
	good := signWith(t, jwt.SigningMethodEdDSA, k.private, validClaims(now), edHeader)
	parts := strings.Split(good, ".")

	without := func(claim string) jwt.MapClaims {
		c := validClaims(now)
		delete(c, claim)
		return c
	}
	with := func(claim string, v any) jwt.MapClaims {
		c := validClaims(now)
		c[claim] = v
		return c
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// The payload with one claim changed, keeping the original signature.
	tamperedPayload := func() string {
		raw, _ := base64.RawURLEncoding.DecodeString(parts[1])
		forged := strings.Replace(string(raw), `"read:patients exec:agents"`, `"admin:org read:patients"`, 1)
		return parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(forged)) + "." + parts[2]
	}()
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	sig[0] ^= 1
	tamperedSig := parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(sig)
	noneHeader := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT","kid":"` + k.kid + `"}`))

	for _, tc := range []struct {
		name, token string
	}{
		{"tampered payload", tamperedPayload},
		{"tampered signature", tamperedSig},
		{"signature stripped", parts[0] + "." + parts[1] + "."},
		{"alg none", noneHeader + "." + parts[1] + "."},
		{"alg none signed by the library", signWith(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, validClaims(now), edHeader)},
		{"HS256 with the public key as secret", signWith(t, jwt.SigningMethodHS256, []byte(k.public), validClaims(now), edHeader)},
		{"HS256 with the JWK x as secret", signWith(t, jwt.SigningMethodHS256, []byte(base64.RawURLEncoding.EncodeToString(k.public)), validClaims(now), edHeader)},
		{"RS256", signWith(t, jwt.SigningMethodRS256, rsaKey, validClaims(now), edHeader)},
		{"ES256", signWith(t, jwt.SigningMethodES256, ecKey, validClaims(now), edHeader)},
		{"unknown kid", signWith(t, jwt.SigningMethodEdDSA, other.private, validClaims(now), map[string]any{"kid": other.kid})},
		{"known kid, other key", signWith(t, jwt.SigningMethodEdDSA, other.private, validClaims(now), edHeader)},
		{"no kid", signWith(t, jwt.SigningMethodEdDSA, k.private, validClaims(now), map[string]any{"kid": nil})},
		{"kid not a string", signWith(t, jwt.SigningMethodEdDSA, k.private, validClaims(now), map[string]any{"kid": 7})},
		{"wrong issuer", signWith(t, jwt.SigningMethodEdDSA, k.private, with("iss", "evil"), edHeader)},
		{"missing iss", signWith(t, jwt.SigningMethodEdDSA, k.private, without("iss"), edHeader)},
		{"missing aud", signWith(t, jwt.SigningMethodEdDSA, k.private, without("aud"), edHeader)},
		{"wrong aud", signWith(t, jwt.SigningMethodEdDSA, k.private, with("aud", "carehub-webhooks"), edHeader)},
		{"aud list without carehub's", signWith(t, jwt.SigningMethodEdDSA, k.private, with("aud", []string{"a", "b"}), edHeader)},
		{"aud of the issuer's name", signWith(t, jwt.SigningMethodEdDSA, k.private, with("aud", Issuer), edHeader)},
		{"empty aud", signWith(t, jwt.SigningMethodEdDSA, k.private, with("aud", ""), edHeader)},
		{"missing sub", signWith(t, jwt.SigningMethodEdDSA, k.private, without("sub"), edHeader)},
		{"sub not a key", signWith(t, jwt.SigningMethodEdDSA, k.private, with("sub", "org_1"), edHeader)},
		{"missing org", signWith(t, jwt.SigningMethodEdDSA, k.private, without("org"), edHeader)},
		{"missing scope", signWith(t, jwt.SigningMethodEdDSA, k.private, without("scope"), edHeader)},
		{"unknown scope", signWith(t, jwt.SigningMethodEdDSA, k.private, with("scope", "read:patients root"), edHeader)},
		{"scope not a string", signWith(t, jwt.SigningMethodEdDSA, k.private, with("scope", []string{"read:patients"}), edHeader)},
		{"missing mode", signWith(t, jwt.SigningMethodEdDSA, k.private, without("mode"), edHeader)},
		{"bad mode", signWith(t, jwt.SigningMethodEdDSA, k.private, with("mode", "prod"), edHeader)},
		{"missing iat", signWith(t, jwt.SigningMethodEdDSA, k.private, without("iat"), edHeader)},
		{"missing exp", signWith(t, jwt.SigningMethodEdDSA, k.private, without("exp"), edHeader)},
		{"missing jti", signWith(t, jwt.SigningMethodEdDSA, k.private, without("jti"), edHeader)},
		{"expired", signWith(t, jwt.SigningMethodEdDSA, k.private, validClaims(now.Add(-time.Hour-time.Second)), edHeader)},
		{"issued in the future", signWith(t, jwt.SigningMethodEdDSA, k.private, validClaims(now.Add(2*time.Minute)), edHeader)},
		{"lifetime over an hour", signWith(t, jwt.SigningMethodEdDSA, k.private, with("exp", now.Add(2*time.Hour).Unix()), edHeader)},
		{"not yet valid", signWith(t, jwt.SigningMethodEdDSA, k.private, with("nbf", now.Add(time.Minute).Unix()), edHeader)},
		{"two segments", parts[0] + "." + parts[1]},
		{"four segments", good + ".x"},
		{"padded base64", parts[0] + "." + parts[1] + "=." + parts[2]},
		{"oversized", parts[0] + "." + parts[1] + strings.Repeat("A", maxTokenLen) + "." + parts[2]},
		{"empty", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tk.Verify(context.Background(), tc.token)
			if err == nil || fault.KindOf(err) != fault.KindUnauthenticated {
				t.Fatalf("Verify = %+v, %v; want UNAUTHORIZED", c, err)
			}
		})
	}
	// Control: the token the cases derive from verifies, so each refusal is the case's doing.
	if _, err := tk.Verify(context.Background(), good); err != nil {
		t.Fatalf("the untampered token: %v", err)
	}
	// And it expires one hour after issue.
	clk.add(time.Hour)
	if _, err := tk.Verify(context.Background(), good); err == nil {
		t.Fatal("a token one hour old verified")
	}
}

func TestIssuePolicy(t *testing.T) {
	clk := newClock()
	tk := staticTokens(clk.now, fixedKey("a"))
	ctx := context.Background()
	key := &access.Principal{OrgID: "org_1", KeyID: "key_1", Mode: access.Test, Scopes: []string{access.ReadPatients, access.ExecAgents}}
	for _, tc := range []struct {
		name   string
		p      *access.Principal
		scopes []string
		kind   fault.Kind
	}{
		{"unknown scope", key, []string{"read:patients", "read:everything"}, fault.KindValidation},
		{"scope the key lacks", key, []string{access.ReadPatients, access.AdminOrg}, fault.KindInsufficientScope},
		{"a token", &access.Principal{OrgID: "org_1", KeyID: "key_1", Mode: access.Test, Scopes: key.Scopes, TokenID: "jti_1"}, []string{access.ReadPatients}, fault.KindForbidden},
		{"no caller", nil, []string{}, fault.KindUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tok, err := tk.Issue(ctx, tc.p, tc.scopes); fault.KindOf(err) != tc.kind {
				t.Fatalf("Issue = %+v, %v; want kind %d", tok, err, tc.kind)
			}
		})
	}
	tok, err := tk.Issue(ctx, key, []string{access.ExecAgents, access.ReadPatients, access.ExecAgents})
	if err != nil {
		t.Fatal(err)
	}
	if tok.Scope != "exec:agents read:patients" || tok.TokenType != "Bearer" || tok.ExpiresIn != 3600 {
		t.Fatalf("token %+v", tok)
	}
	issued, err := time.Parse(time.RFC3339, tok.IssuedAt)
	if err != nil || !strings.HasSuffix(tok.IssuedAt, "Z") || issued.Sub(clk.now()).Abs() > time.Second {
		t.Fatalf("issued_at %q: want RFC 3339 UTC of now", tok.IssuedAt)
	}
	c, err := tk.Verify(ctx, tok.AccessToken)
	if err != nil {
		t.Fatal(err)
	}
	if !c.ExpiresAt.Equal(c.IssuedAt.Add(time.Hour)) || c.KeyID != "key_1" || c.OrgID != "org_1" || c.Mode != access.Test || !strings.HasPrefix(c.ID, "jti_") {
		t.Fatalf("claims %+v", c)
	}
	// The token's header and payload, as any JWT library would read them.
	parts := strings.Split(tok.AccessToken, ".")
	var header map[string]any
	var payload map[string]any
	for i, v := range []any{&header, &payload} {
		b, _ := base64.RawURLEncoding.DecodeString(parts[i])
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatal(err)
		}
	}
	if header["alg"] != "EdDSA" || header["kid"] != fixedKey("a").kid {
		t.Fatalf("header %v", header)
	}
	for _, claim := range []string{"iss", "aud", "sub", "org", "scope", "mode", "iat", "exp", "jti"} {
		if _, ok := payload[claim]; !ok {
			t.Errorf("payload %v lacks %s", payload, claim)
		}
	}
	if aud, _ := payload["aud"].([]any); len(aud) != 1 || aud[0] != Audience {
		t.Errorf("aud %v, want [%q]", payload["aud"], Audience)
	}
	// The platform operator may ask for any scope; a token with no scope is allowed too.
	platform := &access.Principal{KeyID: "key_p", Mode: access.Live, Platform: true}
	if _, err := tk.Issue(ctx, platform, access.Scopes); err != nil {
		t.Fatalf("platform exchange: %v", err)
	}
	if tok, err := tk.Issue(ctx, key, []string{}); err != nil || tok.Scope != "" {
		t.Fatalf("empty exchange: %+v, %v", tok, err)
	}
}

func TestTokenRoundTripThroughAuthenticator(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	tokens := NewTokens(postgres.NewSigningKeys(pool))
	a := NewAuthenticator(keys, tokens, AuthenticatorConfig{})
	ctx := context.Background()
	ip := netip.MustParseAddr("192.0.2.1")
	ck := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: pgtest.NewOrg(t, pool), Mode: access.Live, Scopes: []string{access.ReadPatients, access.ExecAgents}})
	p, err := a.Authenticate(ctx, "Bearer "+ck.Secret, ip)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokens.Issue(ctx, p, []string{access.ReadPatients})
	if err != nil {
		t.Fatal(err)
	}
	tp, err := a.Authenticate(ctx, "Bearer "+tok.AccessToken, ip)
	if err != nil {
		t.Fatal(err)
	}
	if tp.KeyID != ck.ID || tp.OrgID != ck.OrgID || tp.Mode != access.Live || tp.TokenID == "" ||
		!tp.Has(access.ReadPatients) || tp.Has(access.ExecAgents) {
		t.Fatalf("token principal %+v", tp)
	}
	if _, err := tokens.Issue(ctx, tp, []string{access.ReadPatients}); fault.KindOf(err) != fault.KindForbidden {
		t.Fatalf("exchanging a token: %v, want FORBIDDEN", err)
	}

	// A key whose scopes were narrowed narrows its older tokens.
	if _, err := pool.Exec(ctx, `update api_keys set scopes = '{exec:agents}' where id = $1`, ck.ID); err != nil {
		t.Fatal(err)
	}
	a.ForgetKey(ck.ID)
	if tp, err := a.Authenticate(ctx, "Bearer "+tok.AccessToken, ip); err != nil || tp.Has(access.ReadPatients) {
		t.Fatalf("after narrowing the key: %+v, %v; want no read:patients", tp, err)
	}

	// The token dies with its parent key.
	if _, err := keys.Revoke(ctx, "", ck.ID); err != nil {
		t.Fatal(err)
	}
	a.ForgetKey(ck.ID)
	if _, err := a.Authenticate(ctx, "Bearer "+tok.AccessToken, ip); fault.KindOf(err) != fault.KindUnauthenticated {
		t.Fatalf("token of a revoked key: %v, want UNAUTHORIZED", err)
	}

	// The parent key's IP allowlist binds its tokens.
	ck2 := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: ck.OrgID, Mode: access.Live, IPAllowlist: []string{"192.0.2.0/24"}})
	p2, err := a.Authenticate(ctx, "Bearer "+ck2.Secret, ip)
	if err != nil {
		t.Fatal(err)
	}
	tok2, err := tokens.Issue(ctx, p2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(ctx, "Bearer "+tok2.AccessToken, netip.MustParseAddr("198.51.100.1")); fault.KindOf(err) != fault.KindIPNotAllowed {
		t.Fatalf("token from outside the key's allowlist: %v, want IP_NOT_ALLOWED", err)
	}
}

func TestTokenOfExpiredRotatedKey(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	tokens := NewTokens(postgres.NewSigningKeys(pool))
	clk := newClock()
	a := NewAuthenticator(keys, tokens, AuthenticatorConfig{Clock: clk.now})
	ctx := context.Background()
	ip := netip.MustParseAddr("192.0.2.1")
	ck := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: pgtest.NewOrg(t, pool), Mode: access.Live})
	p, err := a.Authenticate(ctx, "Bearer "+ck.Secret, ip)
	if err != nil {
		t.Fatal(err)
	}
	// Rotated 24 h ago, minus a minute: the key is in its last minute of grace.
	if _, err := keys.Rotate(ctx, "", ck.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `update api_keys set expires_at = now() + interval '1 minute' where id = $1`, ck.ID); err != nil {
		t.Fatal(err)
	}
	tok, err := tokens.Issue(ctx, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(ctx, "Bearer "+tok.AccessToken, ip); err != nil {
		t.Fatalf("token of a key in grace: %v", err)
	}
	clk.add(2 * time.Minute)
	tokens.now = clk.now
	if _, err := a.Authenticate(ctx, "Bearer "+tok.AccessToken, ip); fault.KindOf(err) != fault.KindUnauthenticated {
		t.Fatalf("token of a key past its grace: %v, want UNAUTHORIZED", err)
	}
}

func TestSigningKeyCreatedOnceAndShared(t *testing.T) {
	pool := pgtest.New(t)
	ctx := context.Background()
	nodes := make([]*Tokens, 8)
	var wg sync.WaitGroup
	errs := make([]error, len(nodes))
	for i := range nodes {
		nodes[i] = NewTokens(postgres.NewSigningKeys(pool))
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = nodes[i].EnsureSigningKey(ctx)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var active int
	if err := pool.QueryRow(ctx, `select count(*) from jwt_signing_keys where retired_at is null`).Scan(&active); err != nil || active != 1 {
		t.Fatalf("%d active signing keys (%v), want 1", active, err)
	}
	p := &access.Principal{OrgID: "org_1", KeyID: "key_1", Mode: access.Live}
	for _, issuer := range nodes {
		tok, err := issuer.Issue(ctx, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, verifier := range nodes {
			if _, err := verifier.Verify(ctx, tok.AccessToken); err != nil {
				t.Fatalf("a node cannot verify another's token: %v", err)
			}
		}
	}

	// Another node replaces the signing key: the old tokens still verify within their
	// lifetime, and a node that cached only the old key finds the new one.
	old, err := nodes[0].Issue(ctx, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `update jwt_signing_keys set retired_at = now()`); err != nil {
		t.Fatal(err)
	}
	fresh := NewTokens(postgres.NewSigningKeys(pool))
	tok, err := fresh.Issue(ctx, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if kidOf(t, tok.AccessToken) == kidOf(t, old.AccessToken) {
		t.Fatal("a new node signed with the retired key")
	}
	for _, tk := range []string{tok.AccessToken, old.AccessToken} {
		if _, err := nodes[1].Verify(ctx, tk); err != nil {
			t.Fatalf("verify after the signing key changed: %v", err)
		}
	}
	set, err := fresh.JWKS(ctx)
	if err != nil || len(set.Keys) != 2 {
		t.Fatalf("JWKS = %+v, %v; want the new and the retired key", set, err)
	}
}

func kidOf(t *testing.T, token string) string {
	t.Helper()
	b, _ := base64.RawURLEncoding.DecodeString(strings.Split(token, ".")[0])
	var h struct{ Kid string }
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	return h.Kid
}

// TestJWKSVerifiesTokens checks the JWKS with the standard library alone, as a client would.
func TestJWKSVerifiesTokens(t *testing.T) {
	pool := pgtest.New(t)
	tokens := NewTokens(postgres.NewSigningKeys(pool))
	ctx := context.Background()
	tok, err := tokens.Issue(ctx, &access.Principal{OrgID: "org_1", KeyID: "key_1", Mode: access.Test}, nil)
	if err != nil {
		t.Fatal(err)
	}
	set, err := tokens.JWKS(ctx)
	if err != nil || len(set.Keys) != 1 {
		t.Fatalf("JWKS = %+v, %v", set, err)
	}
	jwk := set.Keys[0]
	if jwk.Kty != "OKP" || jwk.Crv != "Ed25519" || jwk.Alg != "EdDSA" || jwk.Use != "sig" || jwk.Kid != kidOf(t, tok.AccessToken) {
		t.Fatalf("JWK %+v", jwk)
	}
	x, err := base64.RawURLEncoding.DecodeString(jwk.X)
	if err != nil || len(x) != ed25519.PublicKeySize {
		t.Fatalf("x %q: %v", jwk.X, err)
	}
	if thumbprint(x) != jwk.Kid {
		t.Fatal("kid is not the RFC 7638 thumbprint of the key")
	}
	parts := strings.Split(tok.AccessToken, ".")
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	if !ed25519.Verify(x, []byte(parts[0]+"."+parts[1]), sig) {
		t.Fatal("the JWKS key does not verify the token")
	}
}
