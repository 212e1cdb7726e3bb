package auth

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

// BenchmarkAuthenticate measures authentication with a warm cache: no I/O, only hashing (key)
// or signature verification (JWT), the cache lookup and, through the middleware, the rate
// limiter. Target: under 20 µs per request.
func BenchmarkAuthenticate(b *testing.B) {
	pool := pgtest.New(b)
	keys := postgres.NewAPIKeys(pool)
	tokens := NewTokens(postgres.NewSigningKeys(pool))
	a := NewAuthenticator(keys, tokens, AuthenticatorConfig{Limits: Limits{Default: Rate{PerSecond: 1e12, Burst: 1 << 30}}})
	ctx := context.Background()
	ip := netip.MustParseAddr("192.0.2.1")
	ck := pgtest.NewKey(b, keys, apikeys.NewKey{OrgID: pgtest.NewOrg(b, pool), Mode: access.Live, Scopes: access.Scopes, IPAllowlist: []string{"192.0.2.0/24"}})
	p, err := a.Authenticate(ctx, "Bearer "+ck.Secret, ip)
	if err != nil {
		b.Fatal(err)
	}
	tok, err := tokens.Issue(ctx, p, []string{access.ReadPatients})
	if err != nil {
		b.Fatal(err)
	}
	// A token seen for the first time: the Ed25519 verification itself.
	b.Run("jwt/uncached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tokens.vmu.Lock()
			clear(tokens.verified)
			tokens.vmu.Unlock()
			if _, err := a.Authenticate(ctx, "Bearer "+tok.AccessToken, ip); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, c := range []struct{ name, header string }{
		{"key", "Bearer " + ck.Secret},
		{"jwt", "Bearer " + tok.AccessToken},
	} {
		b.Run(c.name, func(b *testing.B) {
			if _, err := a.Authenticate(ctx, c.header, ip); err != nil { // warm the cache
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := a.Authenticate(ctx, c.header, ip); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/middleware", func(b *testing.B) {
			h := a.Middleware(nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
			req := httptest.NewRequest(http.MethodGet, "/v1/organizations", nil)
			req.RemoteAddr = "192.0.2.1:40000"
			req.Header.Set("Authorization", c.header)
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d", w.Code)
				}
			}
		})
	}
}
