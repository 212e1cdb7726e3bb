package auth

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/api/envelope"
	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

// TestKeyStoreDownNamesPostgres: while the key store cannot be read (Postgres down, or failing
// over with no primary yet), a call is refused 503 UNAVAILABLE naming postgres, as the event
// log's 503s name their store: by key, by token, and a held connection's recheck.
func TestKeyStoreDownNamesPostgres(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	tokens := NewTokens(postgres.NewSigningKeys(pool))
	org := pgtest.NewOrg(t, pool)
	ctx := context.Background()
	ip := netip.MustParseAddr("192.0.2.1")
	key := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live})
	p, err := NewAuthenticator(keys, tokens, AuthenticatorConfig{}).Authenticate(ctx, "Bearer "+key.Secret, ip)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokens.Issue(ctx, p, nil)
	if err != nil {
		t.Fatal(err)
	}

	// A socket directory where no server listens.
	down, err := pgxpool.New(ctx, "host="+t.TempDir()+" port=5432 user=carehub dbname=carehub sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(down.Close)
	a := NewAuthenticator(postgres.NewAPIKeys(down), NewTokens(postgres.NewSigningKeys(down)), AuthenticatorConfig{})

	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"key", func() error { _, err := a.Authenticate(ctx, "Bearer "+key.Secret, ip); return err }},
		{"token", func() error { _, err := a.Authenticate(ctx, "Bearer "+tok.AccessToken, ip); return err }},
		{"recheck", func() error { return a.Recheck(ctx, p) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, obj := envelope.NewErrorObject(httptest.NewRequest(http.MethodGet, "/", nil), tc.call())
			if status != http.StatusServiceUnavailable || obj.Code != envelope.CodeUnavailable || obj.Details["dependency"] != postgres.Dependency {
				t.Errorf("answered %d %s %v; want 503 %s naming %s", status, obj.Code, obj.Details, envelope.CodeUnavailable, postgres.Dependency)
			}
		})
	}
}
