package postgres_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"testing"
	"time"

	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

// signingKey returns a deterministic signing key row (the kid need not be a thumbprint here).
func signingKey(seed string) postgres.SigningKey {
	s := sha256.Sum256([]byte(seed))
	priv := ed25519.NewKeyFromSeed(s[:])
	return postgres.SigningKey{KID: "kid-" + seed, Seed: priv.Seed(), Public: priv.Public().(ed25519.PublicKey)}
}

// TestSigningKeys: one active key, whoever creates it first; Load returns it and the keys
// retired within the window asked for, oldest first. (That every node signs and verifies with
// them: api/auth's TestSigningKeyCreatedOnceAndShared.)
func TestSigningKeys(t *testing.T) {
	pool := pgtest.New(t)
	store := postgres.NewSigningKeys(pool)
	ctx := context.Background()
	kids := func(ks []postgres.SigningKey) []string {
		var out []string
		for _, k := range ks {
			out = append(out, k.KID)
		}
		return out
	}
	a, b := signingKey("a"), signingKey("b")
	for _, k := range []postgres.SigningKey{a, b} {
		if err := store.Create(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	got, err := store.Load(ctx, time.Hour)
	if err != nil || len(got) != 1 || got[0].KID != a.KID || got[0].RetiredAt != nil ||
		!bytes.Equal(got[0].Seed, a.Seed) || !bytes.Equal(got[0].Public, a.Public) {
		t.Fatalf("Load = %v, %v; want only the first key created, active", kids(got), err)
	}

	if _, err := pool.Exec(ctx, `update jwt_signing_keys set retired_at = now()`); err != nil {
		t.Fatal(err)
	}
	if err := store.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	got, err = store.Load(ctx, time.Hour)
	if err != nil || len(got) != 2 || got[0].KID != a.KID || got[0].RetiredAt == nil || got[1].KID != b.KID || got[1].RetiredAt != nil {
		t.Fatalf("Load = %v, %v; want the retired key, then the new active one", kids(got), err)
	}

	if _, err := pool.Exec(ctx, `update jwt_signing_keys set retired_at = now() - interval '2 hours' where kid = $1`, a.KID); err != nil {
		t.Fatal(err)
	}
	if got, err = store.Load(ctx, time.Hour); err != nil || len(got) != 1 || got[0].KID != b.KID {
		t.Fatalf("Load = %v, %v; want a key retired before the window left out", kids(got), err)
	}
}
