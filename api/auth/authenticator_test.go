package auth

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/kernel/fault"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

// TestRecheck: a principal stands while its credential does. Revocation, rotation past its
// grace, a JWT's exp, narrowed scopes and a narrowed allowlist each end it; on another node (no
// ForgetKey) within DefaultCacheTTL, here at once.
func TestRecheck(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	tokens := NewTokens(postgres.NewSigningKeys(pool))
	org := pgtest.NewOrg(t, pool)
	ctx := context.Background()
	ip := netip.MustParseAddr("192.0.2.1")
	scopes := []string{access.ReadPatients, access.ExecAgents}

	type setup struct {
		a   *Authenticator
		clk *clock
		key *apikeys.CreatedKey
		p   *access.Principal
	}
	start := func(t *testing.T, viaToken bool) setup {
		clk := newClock()
		s := setup{a: NewAuthenticator(keys, tokens, AuthenticatorConfig{Clock: clk.now}), clk: clk,
			key: pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live, Scopes: scopes, IPAllowlist: []string{"192.0.2.0/24"}})}
		p, err := s.a.Authenticate(ctx, "Bearer "+s.key.Secret, ip)
		if err != nil {
			t.Fatal(err)
		}
		if viaToken {
			tok, err := tokens.Issue(ctx, p, scopes)
			if err != nil {
				t.Fatal(err)
			}
			if p, err = s.a.Authenticate(ctx, "Bearer "+tok.AccessToken, ip); err != nil {
				t.Fatal(err)
			}
		}
		s.p = p
		if err := s.a.Recheck(ctx, p); err != nil {
			t.Fatalf("Recheck of a fresh principal: %v", err)
		}
		return s
	}
	exec := func(t *testing.T, sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	refusal := func(reason string) func(error) bool {
		return func(err error) bool {
			var r *Refusal
			return errors.As(err, &r) && r.Reason == reason && errors.Is(err, ErrInvalidCredential)
		}
	}
	kind := func(k fault.Kind) func(error) bool { return func(err error) bool { return fault.KindOf(err) == k } }

	for _, tc := range []struct {
		name     string
		viaToken bool
		withdraw func(t *testing.T, s setup)
		want     func(error) bool
	}{
		{"key revoked", false, func(t *testing.T, s setup) {
			if _, err := keys.Revoke(ctx, "", s.key.ID); err != nil {
				t.Fatal(err)
			}
		}, refusal(ReasonRevoked)},
		{"parent key of a JWT revoked", true, func(t *testing.T, s setup) {
			if _, err := keys.Revoke(ctx, "", s.key.ID); err != nil {
				t.Fatal(err)
			}
		}, refusal(ReasonRevoked)},
		{"key rotated, past its grace", false, func(t *testing.T, s setup) {
			if _, err := keys.Rotate(ctx, "", s.key.ID); err != nil {
				t.Fatal(err)
			}
			s.a.ForgetKey(s.key.ID)
			if err := s.a.Recheck(ctx, s.p); err != nil {
				t.Fatalf("within the rotation grace: %v", err)
			}
			s.clk.add(apikeys.RotationGrace + time.Minute)
		}, refusal(ReasonExpired)},
		{"JWT past its exp", true, func(t *testing.T, s setup) { s.clk.add(TokenLifetime) }, refusal(ReasonExpired)},
		{"scope removed from the key", false, func(t *testing.T, s setup) {
			exec(t, `update api_keys set scopes = '{exec:agents}' where id = $1`, s.key.ID)
		}, kind(fault.KindInsufficientScope)},
		{"scope removed from a JWT's parent key", true, func(t *testing.T, s setup) {
			exec(t, `update api_keys set scopes = '{read:patients}' where id = $1`, s.key.ID)
		}, kind(fault.KindInsufficientScope)},
		{"allowlist narrowed", false, func(t *testing.T, s setup) {
			exec(t, `update api_keys set ip_allowlist = '{198.51.100.0/24}' where id = $1`, s.key.ID)
		}, kind(fault.KindIPNotAllowed)},
		{"scope added", false, func(t *testing.T, s setup) {
			exec(t, `update api_keys set scopes = '{read:patients,exec:agents,admin:org}' where id = $1`, s.key.ID)
		}, func(err error) bool { return err == nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := start(t, tc.viaToken)
			tc.withdraw(t, s)
			// A node that did not make the change learns of it when its cached copy of the key
			// expires; the node that did (ForgetKey), at once.
			if err := s.a.Recheck(ctx, s.p); !tc.want(err) {
				s.clk.add(DefaultCacheTTL)
				if err := s.a.Recheck(ctx, s.p); !tc.want(err) {
					t.Fatalf("Recheck after the key cache interval: %v", err)
				}
			}
			s.a.ForgetKey(s.key.ID)
			if err := s.a.Recheck(ctx, s.p); !tc.want(err) {
				t.Fatalf("Recheck: %v", err)
			}
		})
	}
}

// TestRefusals: every refused credential is a *Refusal that says why and names what it can
// without the secret; the fault behind it is what clients see.
func TestRefusals(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	tokens := NewTokens(postgres.NewSigningKeys(pool))
	clk := newClock()
	a := NewAuthenticator(keys, tokens, AuthenticatorConfig{Clock: clk.now})
	org := pgtest.NewOrg(t, pool)
	ctx := context.Background()
	ip := netip.MustParseAddr("2001:db8::7")

	revoked := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live})
	p, err := a.Authenticate(ctx, "Bearer "+revoked.Secret, ip)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokens.Issue(ctx, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Revoke(ctx, "", revoked.ID); err != nil {
		t.Fatal(err)
	}
	a.ForgetKey(revoked.ID)
	rotated := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Test})
	if _, err := keys.Rotate(ctx, "", rotated.ID); err != nil {
		t.Fatal(err)
	}
	expiredAuth := NewAuthenticator(keys, tokens, AuthenticatorConfig{Clock: func() time.Time { return clk.now().Add(apikeys.RotationGrace + time.Minute) }})
	unknown := otherKey(revoked.Secret)
	forged := tok.AccessToken[:len(tok.AccessToken)-3] + "AAA"

	for _, tc := range []struct {
		name, authorization string
		a                   *Authenticator
		want                Refusal
		secret              string
	}{
		{"missing", "", a, Refusal{Reason: ReasonMissing}, ""},
		{"not bearer", "Basic dXNlcjpwYXNz", a, Refusal{Reason: ReasonMalformed}, "dXNlcjpwYXNz"},
		{"short key", "Bearer chk_live_abc123", a, Refusal{Reason: ReasonMalformed}, "chk_live_abc123"},
		{"neither key nor token", "Bearer hunter2", a, Refusal{Reason: ReasonMalformed}, "hunter2"},
		{"unknown key", "Bearer " + unknown, a, Refusal{Reason: ReasonUnknownKey, Credential: maskKey(unknown)}, unknown},
		{"revoked key", "Bearer " + revoked.Secret, a,
			Refusal{Reason: ReasonRevoked, Credential: revoked.Masked, KeyID: revoked.ID, OrgID: org, Mode: access.Live}, revoked.Secret},
		{"key rotated past its grace", "Bearer " + rotated.Secret, expiredAuth,
			Refusal{Reason: ReasonExpired, Credential: rotated.Masked, KeyID: rotated.ID, OrgID: org, Mode: access.Test}, rotated.Secret},
		{"JWT of a revoked key", "Bearer " + tok.AccessToken, a,
			Refusal{Reason: ReasonRevoked, Credential: "jwt", KeyID: revoked.ID, OrgID: org, Mode: access.Live}, tok.AccessToken},
		{"forged JWT", "Bearer " + forged, a, Refusal{Reason: ReasonInvalidToken, Credential: "jwt"}, forged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.a.Authenticate(ctx, tc.authorization, ip)
			var r *Refusal
			if !errors.As(err, &r) || fault.KindOf(err) != fault.KindUnauthenticated {
				t.Fatalf("Authenticate = %v, want a refusal and UNAUTHORIZED", err)
			}
			got := *r
			got.err = nil
			want := tc.want
			want.ClientIP = "2001:db8::7"
			if got != want {
				t.Fatalf("refusal %+v\nwant      %+v", got, want)
			}
			if tc.secret != "" && strings.Contains(fmt.Sprintf("%+v %v", got, err), tc.secret) {
				t.Fatalf("the refusal carries the secret: %+v", got)
			}
		})
	}
}
