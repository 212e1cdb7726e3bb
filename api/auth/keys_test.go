package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/storage/postgres/pgtest"
)

func TestGenerateKeyFormat(t *testing.T) {
	seen := map[string]bool{}
	for _, mode := range []string{access.Live, access.Test} {
		for range 200 {
			k, err := GenerateKey(mode)
			if err != nil {
				t.Fatal(err)
			}
			prefix := map[string]string{access.Live: LivePrefix, access.Test: TestPrefix}[mode]
			if !strings.HasPrefix(k, prefix) || len(k) != len(prefix)+32 {
				t.Fatalf("%s key %q: want %s + 32 characters", mode, k, prefix)
			}
			for _, c := range k[len(prefix):] {
				if !strings.ContainsRune(base62, c) {
					t.Fatalf("key %q has non-base62 %q", k, c)
				}
			}
			if !WellFormedKey(k) {
				t.Fatalf("WellFormedKey(%q) = false", k)
			}
			if seen[k] {
				t.Fatalf("key %q generated twice", k)
			}
			seen[k] = true
		}
	}
}

func TestWellFormedKey(t *testing.T) {
	body := strings.Repeat("aZ09", 8)
	for _, tc := range []struct {
		key  string
		want bool
	}{
		{LivePrefix + body, true},
		{TestPrefix + body, true},
		{"chk_prod_" + body, false},
		{LivePrefix + body[:31], false},
		{LivePrefix + body + "a", false},
		{LivePrefix + body[:31] + "-", false},
		{LivePrefix + body[:31] + "é", false},
		{"CHK_LIVE_" + body, false},
		{"", false},
	} {
		if got := WellFormedKey(tc.key); got != tc.want {
			t.Errorf("WellFormedKey(%q) = %v, want %v", tc.key, got, tc.want)
		}
	}
}

func TestHashKey(t *testing.T) {
	sum := sha256.Sum256([]byte("chk_test_abc"))
	if got := HashKey("chk_test_abc"); !bytes.Equal(got, sum[:]) {
		t.Fatalf("HashKey = %x, want SHA-256 %x", got, sum)
	}
}

func TestParseCIDR(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"10.1.2.3", "10.1.2.3/32"},
		{"10.1.2.3/8", "10.0.0.0/8"},
		{"2001:db8::1", "2001:db8::1/128"},
		{"2001:db8::1/32", "2001:db8::/32"},
		{"::ffff:192.0.2.7", "192.0.2.7/32"},
		{"::ffff:192.0.2.0/120", "192.0.2.0/24"},
		{" 10.0.0.1 ", "10.0.0.1/32"},
	} {
		p, err := parseCIDR(tc.in)
		if err != nil || p.String() != tc.want {
			t.Errorf("parseCIDR(%q) = %v, %v; want %s", tc.in, p, err, tc.want)
		}
	}
	for _, bad := range []string{"", "10.0.0.256", "10.0.0.0/33", "::ffff:0:0/95", "fe80::1%eth0", "example.com"} {
		if p, err := parseCIDR(bad); err == nil {
			t.Errorf("parseCIDR(%q) = %v, want an error", bad, p)
		}
	}
}

func TestCreateKeyValidation(t *testing.T) {
	pool := pgtest.New(t)
	keys := NewKeys(pool)
	org := newOrg(t, pool)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		nk    NewKey
		kind  fault.Kind
		field string
	}{
		{"bad mode", NewKey{OrgID: org, Mode: "prod"}, fault.KindValidation, "mode"},
		{"unknown scope", NewKey{OrgID: org, Mode: access.Live, Scopes: []string{"read:everything"}}, fault.KindValidation, "scopes"},
		{"bad allowlist", NewKey{OrgID: org, Mode: access.Live, IPAllowlist: []string{"10.0.0.0/40"}}, fault.KindValidation, "ipAllowlist"},
		{"long name", NewKey{OrgID: org, Mode: access.Live, Name: strings.Repeat("n", 201)}, fault.KindValidation, "name"},
		{"no org", NewKey{Mode: access.Live}, fault.KindValidation, "orgId"},
		{"unknown org", NewKey{OrgID: "org_01jdoesnotexist0000000000", Mode: access.Live}, fault.KindNotFound, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := keys.Create(ctx, tc.nk)
			if fault.KindOf(err) != tc.kind {
				t.Fatalf("err = %v, want kind %d", err, tc.kind)
			}
			if tc.field != "" {
				fields, _ := fault.As(err).Details["fields"].(map[string]any)
				if _, ok := fields[tc.field]; !ok {
					t.Fatalf("details %v do not name %s", fault.As(err).Details, tc.field)
				}
			}
		})
	}
}

func TestKeyStoredAsHashOnly(t *testing.T) {
	pool := pgtest.New(t)
	keys := NewKeys(pool)
	scopes := []string{access.ReadPatients, access.AdminOrg, access.ReadPatients}
	ck := newKey(t, keys, NewKey{OrgID: newOrg(t, pool), Mode: access.Live, Scopes: scopes, Name: "ci"})
	if !WellFormedKey(ck.Secret) || !strings.HasPrefix(ck.Secret, LivePrefix) {
		t.Fatalf("secret %q is not a live key", ck.Secret)
	}
	if ck.Prefix != LivePrefix || ck.Last4 != ck.Secret[len(ck.Secret)-4:] || ck.Masked != LivePrefix+"…"+ck.Last4 {
		t.Fatalf("prefix %q last4 %q masked %q do not match the secret", ck.Prefix, ck.Last4, ck.Masked)
	}
	if strings.Join(ck.Scopes, " ") != "admin:org read:patients" {
		t.Fatalf("scopes %v: want sorted and deduplicated", ck.Scopes)
	}
	if scopes[0] != access.ReadPatients || scopes[2] != access.ReadPatients {
		t.Fatalf("Create reordered the caller's slice: %v", scopes)
	}
	var hash []byte
	var row string
	if err := pool.QueryRow(context.Background(), `select hash, t::text from api_keys t where id = $1`, ck.ID).Scan(&hash, &row); err != nil {
		t.Fatal(err)
	}
	if hex.EncodeToString(hash) != hex.EncodeToString(HashKey(ck.Secret)) {
		t.Fatalf("stored hash %x is not the SHA-256 of the key", hash)
	}
	if strings.Contains(row, ck.Secret[len(LivePrefix):]) {
		t.Fatal("the key's secret part is stored in api_keys")
	}
	got, err := keys.Lookup(context.Background(), ck.Secret)
	if err != nil || got.ID != ck.ID {
		t.Fatalf("Lookup = %v, %v", got, err)
	}
	if _, err := keys.Lookup(context.Background(), otherKey(ck.Secret)); !errors.Is(err, ErrKeyNotFound) {
		t.Fatalf("Lookup of another key: %v, want ErrKeyNotFound", err)
	}
}

func TestAuthenticateKey(t *testing.T) {
	pool := pgtest.New(t)
	keys := NewKeys(pool)
	ck := newKey(t, keys, NewKey{OrgID: newOrg(t, pool), Mode: access.Test, Scopes: []string{access.ReadPatients}})
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

func TestRotationGrace(t *testing.T) {
	pool := pgtest.New(t)
	keys := NewKeys(pool)
	ctx := context.Background()
	old := newKey(t, keys, NewKey{OrgID: newOrg(t, pool), Mode: access.Live, Scopes: []string{access.ReadPatients}, IPAllowlist: []string{"10.0.0.0/8"}})
	fresh, err := keys.Rotate(ctx, old.OrgID, old.ID)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.ID == old.ID || fresh.Secret == old.Secret || fresh.Mode != old.Mode || strings.Join(fresh.Scopes, ",") != access.ReadPatients ||
		strings.Join(fresh.IPAllowlist, ",") != "10.0.0.0/8" {
		t.Fatalf("replacement %+v does not carry the old key's settings", fresh.Key)
	}
	if _, err := keys.Rotate(ctx, old.OrgID, old.ID); fault.KindOf(err) != fault.KindConflict {
		t.Fatalf("rotating a rotated key: %v, want CONFLICT", err)
	}
	clk := newClock()
	a := NewAuthenticator(keys, nil, AuthenticatorConfig{Clock: clk.now})
	ip := netip.MustParseAddr("10.1.1.1")
	for _, step := range []struct {
		advance   time.Duration
		oldWorks  bool
		oldStatus string
	}{
		{0, true, "rotated"},
		{23*time.Hour + 59*time.Minute, true, "rotated"},
		{2 * time.Minute, false, "expired"}, // 24 h 1 min after rotation
	} {
		clk.add(step.advance)
		keys.now = clk.now
		_, err := a.Authenticate(ctx, "Bearer "+old.Secret, ip)
		if (err == nil) != step.oldWorks {
			t.Fatalf("at +%s the old key: err = %v, want working=%v", step.advance, err, step.oldWorks)
		}
		if _, err := a.Authenticate(ctx, "Bearer "+fresh.Secret, ip); err != nil {
			t.Fatalf("replacement key rejected: %v", err)
		}
		k, err := keys.Get(ctx, old.OrgID, old.ID)
		if err != nil || k.Status != step.oldStatus || k.ReplacedBy != fresh.ID {
			t.Fatalf("old key %+v, %v: want status %s replaced by %s", k, err, step.oldStatus, fresh.ID)
		}
	}
}

func TestRevocation(t *testing.T) {
	pool := pgtest.New(t)
	keys := NewKeys(pool)
	ctx := context.Background()
	org := newOrg(t, pool)
	ck := newKey(t, keys, NewKey{OrgID: org, Mode: access.Live})
	clk := newClock()
	a := NewAuthenticator(keys, nil, AuthenticatorConfig{Clock: clk.now})
	ip := netip.MustParseAddr("192.0.2.1")
	if _, err := a.Authenticate(ctx, "Bearer "+ck.Secret, ip); err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Revoke(ctx, newOrg(t, pool), ck.ID); fault.KindOf(err) != fault.KindNotFound {
		t.Fatalf("revoke through another organization: %v, want NOT_FOUND", err)
	}
	k, err := keys.Revoke(ctx, org, ck.ID)
	if err != nil || k.Status != "revoked" || k.RevokedAt == nil {
		t.Fatalf("Revoke = %+v, %v", k, err)
	}
	// Cached on this node for at most DefaultCacheTTL.
	clk.add(DefaultCacheTTL)
	if _, err := a.Authenticate(ctx, "Bearer "+ck.Secret, ip); fault.KindOf(err) != fault.KindUnauthenticated {
		t.Fatalf("revoked key after the cache TTL: %v, want UNAUTHORIZED", err)
	}
	// ForgetKey applies it at once.
	ck2 := newKey(t, keys, NewKey{OrgID: org, Mode: access.Live})
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
	if _, err := keys.Rotate(ctx, org, ck2.ID); fault.KindOf(err) != fault.KindConflict {
		t.Fatalf("rotating a revoked key: %v, want CONFLICT", err)
	}
}

func TestIPAllowlist(t *testing.T) {
	pool := pgtest.New(t)
	keys := NewKeys(pool)
	org := newOrg(t, pool)
	a := NewAuthenticator(keys, nil, AuthenticatorConfig{})
	ctx := context.Background()
	v4 := newKey(t, keys, NewKey{OrgID: org, Mode: access.Live, IPAllowlist: []string{"203.0.113.0/24", "198.51.100.7"}})
	v6 := newKey(t, keys, NewKey{OrgID: org, Mode: access.Live, IPAllowlist: []string{"2001:db8:1::/48"}})
	mapped := newKey(t, keys, NewKey{OrgID: org, Mode: access.Live, IPAllowlist: []string{"::ffff:192.0.2.0/120"}})
	open := newKey(t, keys, NewKey{OrgID: org, Mode: access.Live})
	for _, tc := range []struct {
		key  *CreatedKey
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
