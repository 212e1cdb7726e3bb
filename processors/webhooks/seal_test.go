package webhooks

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"carehub/kernel/ids"
	"carehub/kernel/sealing"
	"carehub/kernel/whsig"
)

// TestSealedSecretOpensOnlyInItsRowUnderItsKey: a sealed secret opens for its subscription
// under the server key, not for another subscription nor under another key.
func TestSealedSecretOpensOnlyInItsRowUnderItsKey(t *testing.T) {
	box, secret := newSecretBox(testKey), whsig.NewSecret()
	sealed := box.seal("wh_a", secret)
	if got, err := box.open("wh_a", sealed); err != nil || got != secret {
		t.Fatalf("open in its row: %v", err)
	}
	if _, err := box.open("wh_b", sealed); err == nil {
		t.Error("opened in another subscription's row")
	}
	if _, err := newSecretBox(sealing.Random()).open("wh_a", sealed); err == nil {
		t.Error("opened under another server key")
	}
	if strings.Contains(string(sealed), strings.TrimPrefix(secret, whsig.SecretPrefix)) {
		t.Error("the sealed value holds the secret")
	}
	// After the key was lost and the secret rotated, the old secret no longer opens: the new
	// one signs alone.
	lost := newSecretBox(sealing.Random()).seal("wh_a", whsig.NewSecret())
	got, err := box.secrets("wh_a", storedSecrets{currentSealed: sealed, previousSealed: lost})
	if err != nil || len(got) != 1 || got[0] != secret {
		t.Errorf("secrets with an unreadable previous one: %d, %v; want the current alone", len(got), err)
	}
	if _, err := box.secrets("wh_a", storedSecrets{currentSealed: lost}); err == nil {
		t.Error("a current secret that does not open gave secrets")
	}
}

// TestSecretsAreStoredSealed: what Create and RotateSecret store holds neither secret, reads
// mask it as before, and a sealed secret copied into another subscription's row signs nothing.
func TestSecretsAreStoredSealed(t *testing.T) {
	f := newFixture(t)
	sub := f.create("http://127.0.0.1:1/hook", "*")
	rotated, err := f.svc.RotateSecret(f.admin, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	f.assertNoClearSecret(sub.ID, sub.Secret, rotated.Secret)
	if got := f.get(sub.ID).Secret; got != whsig.Mask(rotated.Secret) {
		t.Errorf("Get: secret %q, want %q", got, whsig.Mask(rotated.Secret))
	}

	other := f.create("http://127.0.0.1:1/hook", "*")
	if _, err := f.pool.Exec(t.Context(), `update webhooks set secret_sealed = (select secret_sealed from webhooks where id = $1)
where id = $2`, sub.ID, other.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Test(f.admin, TestRequest{WebhookID: other.ID}); err == nil {
		t.Error("a test send signed with a secret sealed for another subscription")
	}
}

// TestClearSecretsAreSealedAtStart: a subscription an older carehub stored with its secrets in
// clear (mid-rotation: current and previous) signs with both before the start-up step seals it
// and after. The step, run by two nodes at once, seals the row once and leaves no secret in it.
func TestClearSecretsAreSealedAtStart(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, nil)
	id, current, previous := ids.New(ids.Webhook), whsig.NewSecret(), whsig.NewSecret()
	if _, err := f.pool.Exec(t.Context(), `insert into webhooks (id, org_id, project_id, url, events, secret,
	previous_secret, previous_secret_expires_at)
values ($1, $2, $3, $4, '{*}', $5, $6, now() + interval '1 hour')`, id, f.orgID, f.projectID, rc.URL, current, previous); err != nil {
		t.Fatal(err)
	}
	f.start()
	f.publish("agent.run_completed", nil)
	verifyBoth(t, rc.waitRequests(t, 1, 20*time.Second)[0], current, previous)

	var wg sync.WaitGroup
	var sealed [2]int
	for i := range sealed {
		wg.Go(func() {
			var err error
			if sealed[i], err = SealStoredSecrets(context.Background(), f.pool, testKey); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if sealed[0]+sealed[1] != 1 {
		t.Errorf("two nodes starting sealed %v rows, want 1 in all", sealed)
	}
	f.assertNoClearSecret(id, current, previous)
	if n, err := SealStoredSecrets(t.Context(), f.pool, testKey); err != nil || n != 0 {
		t.Errorf("sealing again: %d rows, %v", n, err)
	}
	if got := f.get(id).Secret; got != whsig.Mask(current) {
		t.Errorf("Get: secret %q, want %q", got, whsig.Mask(current))
	}

	f.publish("agent.run_completed", nil)
	verifyBoth(t, rc.waitRequests(t, 2, 20*time.Second)[1], current, previous)
}

// verifyBoth checks that req carries two signatures, by current and previous in that order.
func verifyBoth(t *testing.T, req request, current, previous string) {
	t.Helper()
	sigs := strings.Fields(req.Header.Get(whsig.HeaderSignature))
	if len(sigs) != 2 {
		t.Fatalf("webhook-signature %q: want two signatures during the rotation", req.Header.Get(whsig.HeaderSignature))
	}
	for i, secret := range []string{current, previous} {
		if !whsig.Verify(secret, req.id(), req.Header.Get(whsig.HeaderTimestamp), req.Body, sigs[i]) {
			t.Errorf("signature %d does not verify with its secret", i)
		}
	}
}

// assertNoClearSecret checks that the row of subscription id holds its secrets sealed and none
// of secrets, whole or without their prefix, in any column.
func (f *fixture) assertNoClearSecret(id string, secrets ...string) {
	f.t.Helper()
	var row string
	var sealed bool
	if err := f.pool.QueryRow(context.Background(), `select w::text, secret is null and previous_secret is null
	and secret_sealed is not null and previous_secret_sealed is not null from webhooks w where id = $1`, id).Scan(&row, &sealed); err != nil {
		f.t.Fatal(err)
	}
	if !sealed {
		f.t.Errorf("webhook %s: secrets not sealed", id)
	}
	for _, s := range secrets {
		if strings.Contains(row, strings.TrimPrefix(s, whsig.SecretPrefix)) {
			f.t.Errorf("webhook %s: a secret is stored in clear", id)
		}
	}
}
