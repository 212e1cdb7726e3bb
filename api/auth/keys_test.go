package auth

import (
	"context"
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

// The key store's own tests (create, hashing, rotate, revoke in the database) are
// storage/postgres's apikeys_test.go; the key format's are kernel/apikeys'. These are of the
// Authenticator over the real store.

func TestAuthenticateKey(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	ck := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: pgtest.NewOrg(t, pool), Mode: access.Test, Scopes: []string{access.ReadPatients}})
	a := NewAuthenticator(keys, nil, AuthenticatorConfig{})
	ip := netip.MustParseAddr("192.0.2.1")
	ctx := context.Background()
	p, err := a.Authenticate(ctx, "Bearer "+ck.Secret, ip)
	if err != nil {
		t.Fatal(err)
	}
	if p.KeyID != ck.ID || p.OrgID != ck.OrgID || p.Mode != access.Test || !p.Has(access.ReadPatients) || p.Has(access.AdminOrg) || p.ClientIP != "192.0.2.1" {
		t.Fatalf("principal %+v does not match key %+v", p, ck.Key)
	}
	var lastUsed *time.Time
	if err := pool.QueryRow(ctx, `select last_used_at from api_keys where id = $1`, ck.ID).Scan(&lastUsed); err != nil || lastUsed == nil {
		t.Fatalf("last_used_at not set by authentication: %v, %v", lastUsed, err)
	}
	for _, bad := range []string{"", "Bearer", "Basic " + ck.Secret, "Bearer " + otherKey(ck.Secret),
		"Bearer chk_live_" + strings.Repeat("0", 32), "Bearer not-a-key", "Bearer a.b.c"} {
		if _, err := a.Authenticate(ctx, bad, ip); fault.KindOf(err) != fault.KindUnauthenticated {
			t.Errorf("Authenticate(%q) = %v, want UNAUTHORIZED", bad, err)
		}
	}
}

// TestRotationGrace: a rotated key authenticates for apikeys.RotationGrace, its replacement at
// once. (What the store records of the rotation: storage/postgres's TestKeyRotation.)
func TestRotationGrace(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	ctx := context.Background()
	old := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: pgtest.NewOrg(t, pool), Mode: access.Live, Scopes: []string{access.ReadPatients}, IPAllowlist: []string{"10.0.0.0/8"}})
	fresh, err := keys.Rotate(ctx, old.OrgID, old.ID)
	if err != nil {
		t.Fatal(err)
	}
	clk := newClock()
	a := NewAuthenticator(keys, nil, AuthenticatorConfig{Clock: clk.now})
	ip := netip.MustParseAddr("10.1.1.1")
	for _, step := range []struct {
		advance  time.Duration
		oldWorks bool
	}{
		{0, true},
		{23*time.Hour + 59*time.Minute, true},
		{2 * time.Minute, false}, // 24 h 1 min after rotation
	} {
		clk.add(step.advance)
		_, err := a.Authenticate(ctx, "Bearer "+old.Secret, ip)
		if (err == nil) != step.oldWorks {
			t.Fatalf("at +%s the old key: err = %v, want working=%v", step.advance, err, step.oldWorks)
		}
		if _, err := a.Authenticate(ctx, "Bearer "+fresh.Secret, ip); err != nil {
			t.Fatalf("replacement key rejected: %v", err)
		}
	}
}

// TestRevocation: a key revoked in the store is refused once the cache forgets it, after the
// TTL or at once through ForgetKey. (What the store records: storage/postgres's TestKeyRevocation.)
func TestRevocation(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	ctx := context.Background()
	org := pgtest.NewOrg(t, pool)
	ck := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live})
	clk := newClock()
	a := NewAuthenticator(keys, nil, AuthenticatorConfig{Clock: clk.now})
	ip := netip.MustParseAddr("192.0.2.1")
	if _, err := a.Authenticate(ctx, "Bearer "+ck.Secret, ip); err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Revoke(ctx, org, ck.ID); err != nil {
		t.Fatal(err)
	}
	// Cached on this node for at most DefaultCacheTTL.
	clk.add(DefaultCacheTTL)
	if _, err := a.Authenticate(ctx, "Bearer "+ck.Secret, ip); fault.KindOf(err) != fault.KindUnauthenticated {
		t.Fatalf("revoked key after the cache TTL: %v, want UNAUTHORIZED", err)
	}
	// ForgetKey applies it at once.
	ck2 := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live})
	if _, err := a.Authenticate(ctx, "Bearer "+ck2.Secret, ip); err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Revoke(ctx, "", ck2.ID); err != nil {
		t.Fatal(err)
	}
	a.ForgetKey(ck2.ID)
	if _, err := a.Authenticate(ctx, "Bearer "+ck2.Secret, ip); fault.KindOf(err) != fault.KindUnauthenticated {
		t.Fatalf("revoked and forgotten key: %v, want UNAUTHORIZED", err)
	}
}

func TestIPAllowlist(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	org := pgtest.NewOrg(t, pool)
	a := NewAuthenticator(keys, nil, AuthenticatorConfig{})
	ctx := context.Background()
	v4 := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live, IPAllowlist: []string{"203.0.113.0/24", "198.51.100.7"}})
	v6 := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live, IPAllowlist: []string{"2001:db8:1::/48"}})
	mapped := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live, IPAllowlist: []string{"::ffff:192.0.2.0/120"}})
	open := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live})
	for _, tc := range []struct {
		key  *apikeys.CreatedKey
		ip   string
		want bool
	}{
		{v4, "203.0.113.9", true},
		{v4, "198.51.100.7", true},
		{v4, "198.51.100.8", false},
		{v4, "::ffff:203.0.113.9", true}, // a dual-stack listener's view of an IPv4 peer
		{v4, "2001:db8::1", false},
		{v6, "2001:db8:1:2::3", true},
		{v6, "2001:db8:2::1", false},
		{v6, "203.0.113.9", false},
		{mapped, "192.0.2.55", true},
		{mapped, "::ffff:192.0.2.55", true},
		{mapped, "192.0.3.1", false},
		{open, "2001:db8::1", true},
		{open, "203.0.113.9", true},
	} {
		p, err := a.Authenticate(ctx, "Bearer "+tc.key.Secret, netip.MustParseAddr(tc.ip))
		switch {
		case tc.want && err != nil:
			t.Errorf("key %v from %s: %v, want allowed", tc.key.IPAllowlist, tc.ip, err)
		case !tc.want && fault.KindOf(err) != fault.KindIPNotAllowed:
			t.Errorf("key %v from %s: %v, want IP_NOT_ALLOWED", tc.key.IPAllowlist, tc.ip, err)
		case !tc.want && (p == nil || p.KeyID != tc.key.ID):
			t.Errorf("key %v from %s: refused without the key's principal, which the audit log names", tc.key.IPAllowlist, tc.ip)
		}
	}
}

// otherKey returns a well-formed key that differs from key in its last character.
func otherKey(key string) string {
	last := key[len(key)-1]
	repl := byte('a')
	if last == 'a' {
		repl = 'b'
	}
	return key[:len(key)-1] + string(repl)
}
