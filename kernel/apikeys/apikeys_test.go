package apikeys

import (
	"bytes"
	"crypto/sha256"
	"strings"
	"testing"
	"time"

	"carehub/kernel/access"
	"carehub/kernel/fault"
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
		p, err := ParseCIDR(tc.in)
		if err != nil || p.String() != tc.want {
			t.Errorf("ParseCIDR(%q) = %v, %v; want %s", tc.in, p, err, tc.want)
		}
	}
	for _, bad := range []string{"", "10.0.0.256", "10.0.0.0/33", "::ffff:0:0/95", "fe80::1%eth0", "example.com"} {
		if p, err := ParseCIDR(bad); err == nil {
			t.Errorf("ParseCIDR(%q) = %v, want an error", bad, p)
		}
	}
}

// TestValidateNewKey: the checks of a key request that need no store (the store's own, an
// unknown organization, are in storage/postgres's TestCreateKeyValidation).
func TestValidateNewKey(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nk    NewKey
		field string
	}{
		{"bad mode", NewKey{OrgID: "org_1", Mode: "prod"}, "mode"},
		{"unknown scope", NewKey{OrgID: "org_1", Mode: access.Live, Scopes: []string{"read:everything"}}, "scopes"},
		{"bad allowlist", NewKey{OrgID: "org_1", Mode: access.Live, IPAllowlist: []string{"10.0.0.0/40"}}, "ipAllowlist"},
		{"long allowlist", NewKey{OrgID: "org_1", Mode: access.Live, IPAllowlist: make([]string, maxAllowlist+1)}, "ipAllowlist"},
		{"long name", NewKey{OrgID: "org_1", Mode: access.Live, Name: strings.Repeat("n", 201)}, "name"},
		{"no org", NewKey{Mode: access.Live}, "orgId"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.nk.Validate()
			fields, _ := fault.As(err).Details["fields"].(map[string]any)
			if fault.KindOf(err) != fault.KindValidation || fields[tc.field] == nil {
				t.Fatalf("err = %v, want VALIDATION_FAILED naming %s", err, tc.field)
			}
		})
	}
	scopes := []string{access.ReadPatients, access.AdminOrg, access.ReadPatients}
	allowlist := []string{"10.1.2.3/8", "::ffff:192.0.2.7"}
	nk, err := NewKey{Platform: true, Mode: access.Test, Scopes: scopes, IPAllowlist: allowlist}.Validate()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(nk.Scopes, " ") != "admin:org read:patients" || strings.Join(nk.IPAllowlist, " ") != "10.0.0.0/8 192.0.2.7/32" {
		t.Fatalf("normalized %+v", nk)
	}
	if scopes[1] != access.AdminOrg || allowlist[0] != "10.1.2.3/8" {
		t.Fatalf("Validate changed the caller's slices: %v %v", scopes, allowlist)
	}
}

func TestKeyLife(t *testing.T) {
	now := time.Now()
	later := now.Add(time.Minute)
	for _, tc := range []struct {
		key     Key
		usable  bool
		display string
	}{
		{Key{Status: "active"}, true, "active"},
		{Key{Status: "rotated", ExpiresAt: &later}, true, "rotated"},
		{Key{Status: "rotated", ExpiresAt: &now}, false, "expired"},
		{Key{Status: "rotated"}, false, "expired"},
		{Key{Status: "revoked"}, false, "revoked"},
	} {
		if got := tc.key.Usable(now); got != tc.usable {
			t.Errorf("%+v: Usable = %v, want %v", tc.key, got, tc.usable)
		}
		if got := tc.key.DisplayStatus(now); got != tc.display {
			t.Errorf("%+v: DisplayStatus = %q, want %q", tc.key, got, tc.display)
		}
	}
	p := (&Key{ID: "key_1", OrgID: "org_1", Mode: access.Test, Scopes: []string{access.ReadPatients}}).Principal()
	if p.KeyID != "key_1" || p.OrgID != "org_1" || p.Mode != access.Test || !p.Has(access.ReadPatients) || p.Platform {
		t.Fatalf("principal %+v", p)
	}
}
