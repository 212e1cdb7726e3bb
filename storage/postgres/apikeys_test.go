package postgres_test

import (
	"context"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/kernel/fault"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

// otherKey returns a well-formed key that differs from key in its last character.
func otherKey(key string) string {
	last := key[len(key)-1]
	repl := byte('a')
	if last == 'a' {
		repl = 'b'
	}
	return key[:len(key)-1] + string(repl)
}

func TestCreateKeyValidation(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	org := pgtest.NewOrg(t, pool)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		nk    apikeys.NewKey
		kind  fault.Kind
		field string
	}{
		{"bad mode", apikeys.NewKey{OrgID: org, Mode: "prod"}, fault.KindValidation, "mode"},
		{"unknown scope", apikeys.NewKey{OrgID: org, Mode: access.Live, Scopes: []string{"read:everything"}}, fault.KindValidation, "scopes"},
		{"bad allowlist", apikeys.NewKey{OrgID: org, Mode: access.Live, IPAllowlist: []string{"10.0.0.0/40"}}, fault.KindValidation, "ipAllowlist"},
		{"long name", apikeys.NewKey{OrgID: org, Mode: access.Live, Name: strings.Repeat("n", 201)}, fault.KindValidation, "name"},
		{"no org", apikeys.NewKey{Mode: access.Live}, fault.KindValidation, "orgId"},
		{"unknown org", apikeys.NewKey{OrgID: "org_01jdoesnotexist0000000000", Mode: access.Live}, fault.KindNotFound, ""},
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
	keys := postgres.NewAPIKeys(pool)
	scopes := []string{access.ReadPatients, access.AdminOrg, access.ReadPatients}
	ck := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: pgtest.NewOrg(t, pool), Mode: access.Live, Scopes: scopes, Name: "ci"})
	if !apikeys.WellFormedKey(ck.Secret) || !strings.HasPrefix(ck.Secret, apikeys.LivePrefix) {
		t.Fatalf("secret %q is not a live key", ck.Secret)
	}
	if ck.Prefix != apikeys.LivePrefix || ck.Last4 != ck.Secret[len(ck.Secret)-4:] || ck.Masked != apikeys.LivePrefix+"…"+ck.Last4 {
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
	if hex.EncodeToString(hash) != hex.EncodeToString(apikeys.HashKey(ck.Secret)) {
		t.Fatalf("stored hash %x is not the SHA-256 of the key", hash)
	}
	if strings.Contains(row, ck.Secret[len(apikeys.LivePrefix):]) {
		t.Fatal("the key's secret part is stored in api_keys")
	}
	got, err := keys.Lookup(context.Background(), ck.Secret)
	if err != nil || got.ID != ck.ID {
		t.Fatalf("Lookup = %v, %v", got, err)
	}
	if _, err := keys.Lookup(context.Background(), otherKey(ck.Secret)); !errors.Is(err, apikeys.ErrNotFound) {
		t.Fatalf("Lookup of another key: %v, want apikeys.ErrNotFound", err)
	}
	if _, err := keys.AuthLookup(context.Background(), otherKey(ck.Secret)); !errors.Is(err, apikeys.ErrNotFound) {
		t.Fatalf("AuthLookup of another key: %v, want apikeys.ErrNotFound", err)
	}
}

// TestKeyRotation: a replacement carries the old key's settings; the old key shows as rotated,
// replaced by it, for apikeys.RotationGrace and as expired after; only an active key rotates.
// (That the old key authenticates during the grace: api/auth's TestRotationGrace.)
func TestKeyRotation(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	ctx := context.Background()
	old := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: pgtest.NewOrg(t, pool), Mode: access.Live, Scopes: []string{access.ReadPatients}, IPAllowlist: []string{"10.0.0.0/8"}})
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
	var (
		mu  sync.Mutex
		now = time.Now()
	)
	keys.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	for _, step := range []struct {
		advance   time.Duration
		oldStatus string
	}{
		{0, "rotated"},
		{23*time.Hour + 59*time.Minute, "rotated"},
		{2 * time.Minute, "expired"}, // 24 h 1 min after rotation
	} {
		mu.Lock()
		now = now.Add(step.advance)
		mu.Unlock()
		k, err := keys.Get(ctx, old.OrgID, old.ID)
		if err != nil || k.Status != step.oldStatus || k.ReplacedBy != fresh.ID {
			t.Fatalf("old key %+v, %v: want status %s replaced by %s", k, err, step.oldStatus, fresh.ID)
		}
		list, err := keys.List(ctx, old.OrgID)
		if err != nil || len(list) != 2 || list[1].ID != old.ID || list[1].Status != step.oldStatus {
			t.Fatalf("List = %+v, %v: want the old key second, %s", list, err, step.oldStatus)
		}
	}
}

// TestKeyRevocation: a revocation is confined to the organization filter and ends the key's
// rotations. (That the key stops authenticating: api/auth's TestRevocation.)
func TestKeyRevocation(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	ctx := context.Background()
	org := pgtest.NewOrg(t, pool)
	ck := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live})
	if _, err := keys.Revoke(ctx, pgtest.NewOrg(t, pool), ck.ID); fault.KindOf(err) != fault.KindNotFound {
		t.Fatalf("revoke through another organization: %v, want NOT_FOUND", err)
	}
	k, err := keys.Revoke(ctx, org, ck.ID)
	if err != nil || k.Status != "revoked" || k.RevokedAt == nil {
		t.Fatalf("Revoke = %+v, %v", k, err)
	}
	if _, err := keys.Rotate(ctx, org, ck.ID); fault.KindOf(err) != fault.KindConflict {
		t.Fatalf("rotating a revoked key: %v, want CONFLICT", err)
	}
	if _, err := keys.Revoke(ctx, org, "key_01jdoesnotexist0000000000"); fault.KindOf(err) != fault.KindNotFound {
		t.Fatalf("revoking an unknown key: %v, want NOT_FOUND", err)
	}
}

// forgetter is a postgres.KeyCache that reports what it is told to forget.
type forgetter struct{ ids chan string }

func (f forgetter) ForgetKey(id string) { f.ids <- id }
func (f forgetter) Forget()             { f.ids <- "*" }

// TestKeyChangesAnnounced: Rotate and Revoke announce the key they change, once committed, to
// every KeyListener.
func TestKeyChangesAnnounced(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	ctx, cancel := context.WithCancel(context.Background())
	f := forgetter{ids: make(chan string, 8)}
	l, err := postgres.ListenKeyChanges(ctx, pool.Config().ConnConfig.Copy(), f, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- l.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	org := pgtest.NewOrg(t, pool)
	ck := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live})
	fresh, err := keys.Rotate(ctx, org, ck.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Revoke(ctx, org, fresh.ID); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{ck.ID, fresh.ID} {
		select {
		case got := <-f.ids:
			if got != want {
				t.Fatalf("forgot %s, want %s", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s was not announced", want)
		}
	}
}
