package attacktest

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"net/http"
	"strings"
	"testing"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// Finding 11 of issue 51: idempotent answers were sealed under a key derived only from the
// Idempotency-Key and ids stored beside them, so a reader of the database who guessed the
// Idempotency-Key opened a sealed POST /v1/api-keys answer: a working live key. The seal must
// need the server sealing key, which is not in the database.
func TestIdempotencySealNeedsTheServerKey(t *testing.T) {
	s := servertest.Start(t)
	admin := s.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg, access.ReadPatients)
	const idemKey = "create-key-1" // guessable, as clients' keys often are
	body := map[string]any{"name": "probe", "mode": "live", "scopes": []string{access.ReadPatients}}
	first := replayDo(t, s, http.MethodPost, "/v1/api-keys", admin, idemKey, body)
	var created struct{ Secret, Key string }
	first.JSON(t, &created)
	secret := created.Secret + created.Key
	if first.Status != http.StatusCreated || secret == "" {
		t.Fatalf("create key: %d %s", first.Status, first.Body)
	}

	// What a reader of the database sees.
	ctx := context.Background()
	var orgID, keyID string
	var sealed []byte
	if err := s.Pool().QueryRow(ctx, `select org_id, key_id, response from idempotency_keys where org_id = $1 and status_code = 201`,
		demo.DemoOrgID).Scan(&orgID, &keyID, &sealed); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte(secret)) {
		t.Fatal("the recorded answer holds the API key in clear")
	}
	salt := []byte(orgID + "\x00" + keyID)
	for _, guess := range []struct{ name, info string }{
		{"the Idempotency-Key and ids (the v1 seal)", "carehub idempotency seal v1"},
		{"the Idempotency-Key and ids under the v2 info", "carehub idempotency seal v2"},
	} {
		if plain, ok := sealOpen(t, []byte(idemKey), salt, guess.info, sealed); ok {
			t.Fatalf("a key derived from %s opens the recorded answer (%d bytes): the seal needs no server secret", guess.name, len(plain))
		}
	}
	// The node itself still replays it.
	again := replayDo(t, s, http.MethodPost, "/v1/api-keys", admin, idemKey, body)
	if again.Status != http.StatusCreated || again.Header.Get("Idempotent-Replayed") != "true" || !bytes.Contains(again.Body, []byte(secret)) {
		t.Fatalf("replay: %d %s", again.Status, again.Body)
	}

	// An answer sealed before the server key was part of the seal (v1) is refused as a conflict,
	// and the request does not run again (it may have taken effect).
	v1 := sealWith(t, []byte(idemKey), salt, "carehub idempotency seal v1", []byte("an answer recorded before the upgrade"))
	if _, err := s.Pool().Exec(ctx, `update idempotency_keys set response = $3 where org_id = $1 and key_id = $2`, orgID, keyID, v1); err != nil {
		t.Fatal(err)
	}
	var keysBefore int
	if err := s.Pool().QueryRow(ctx, `select count(*) from api_keys`).Scan(&keysBefore); err != nil {
		t.Fatal(err)
	}
	old := replayDo(t, s, http.MethodPost, "/v1/api-keys", admin, idemKey, body)
	if old.Status != http.StatusConflict || !strings.Contains(string(old.Body), "cannot be read") {
		t.Fatalf("a v1-sealed answer: %d %s, want 409 CONFLICT", old.Status, old.Body)
	}
	var keysAfter int
	if err := s.Pool().QueryRow(ctx, `select count(*) from api_keys`).Scan(&keysAfter); err != nil {
		t.Fatal(err)
	}
	if keysAfter != keysBefore {
		t.Fatalf("api keys: %d before, %d after: the request ran again", keysBefore, keysAfter)
	}
}

// sealAEAD is AES-256-GCM under HKDF-SHA256(ikm, salt, info): what an attacker can compute
// without the server key.
func sealAEAD(t *testing.T, ikm, salt []byte, info string) cipher.AEAD {
	t.Helper()
	k, err := hkdf.Key(sha256.New, ikm, salt, info, 32)
	if err != nil {
		t.Fatal(err)
	}
	block, err := aes.NewCipher(k)
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	return aead
}

func sealOpen(t *testing.T, ikm, salt []byte, info string, sealed []byte) ([]byte, bool) {
	aead := sealAEAD(t, ikm, salt, info)
	n := aead.NonceSize()
	if len(sealed) < n {
		return nil, false
	}
	plain, err := aead.Open(nil, sealed[:n], sealed[n:], []byte("answer"))
	return plain, err == nil
}

func sealWith(t *testing.T, ikm, salt []byte, info string, plain []byte) []byte {
	aead := sealAEAD(t, ikm, salt, info)
	nonce := make([]byte, aead.NonceSize())
	rand.Read(nonce)
	return aead.Seal(nonce, nonce, plain, []byte("answer"))
}

// The observation intake keeps its Idempotency-Keys where every other POST does (issue 53): a
// key names one request whatever the route, and neither the key nor the answer (the accepted
// observations' ids) is readable in the database.
func TestObservationKeysShareTheSealedStore(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	obs := map[string]any{
		"resourceType": "Observation", "status": "final",
		"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": "8867-4"}}},
		"subject":           map[string]any{"reference": "Patient/" + demo.StablePatientID},
		"effectiveDateTime": "2026-01-02T03:04:05Z",
		"valueQuantity":     map[string]any{"value": 88, "unit": "/min"},
	}
	const idemKey = "reading-batch-7"
	first := replayDo(t, s, http.MethodPost, "/v1/observations", key, idemKey, obs)
	again := replayDo(t, s, http.MethodPost, "/v1/observations", key, idemKey, obs)
	if first.Status != http.StatusAccepted || again.Status != http.StatusAccepted || again.Header.Get("Idempotent-Replayed") != "true" ||
		!bytes.Equal(first.Body, again.Body) {
		t.Fatalf("first %d %s, again %d %s %v", first.Status, first.Body, again.Status, again.Body, again.Header)
	}
	var ans struct{ IDs []string }
	first.JSON(t, &ans)
	// The same key on another route is another request.
	other := replayDo(t, s, http.MethodPost, "/v1/events", key, idemKey, map[string]any{"type": "custom.probe", "payload": map[string]any{}})
	if other.Status != http.StatusConflict {
		t.Fatalf("the key on another route: %d %s, want 409", other.Status, other.Body)
	}
	rows, err := s.Pool().Query(context.Background(), `select convert_to(k::text, 'UTF8') from idempotency_keys k`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var row []byte
		if err := rows.Scan(&row); err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(row, []byte(idemKey)) || (len(ans.IDs) > 0 && bytes.Contains(row, []byte(ans.IDs[0]))) {
			t.Errorf("a row holds the Idempotency-Key or an accepted id in clear: %s", row)
		}
	}
}
