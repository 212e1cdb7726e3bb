package webhooks

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

// The test vector of the Standard Webhooks specification (the reference libraries' own).
func TestSignMatchesTheStandardWebhooksVector(t *testing.T) {
	got, err := Sign("msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`),
		"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Errorf("Sign = %s, want %s", got, want)
	}
}

func TestSignWithTwoSecretsListsBoth(t *testing.T) {
	a, b := newSecret(), newSecret()
	body := []byte(`{"x":1}`)
	ts := time.Unix(1700000000, 0)
	both, err := Sign("evt_1", ts, body, a, b)
	if err != nil {
		t.Fatal(err)
	}
	sa, _ := Sign("evt_1", ts, body, a)
	sb, _ := Sign("evt_1", ts, body, b)
	if both != sa+" "+sb {
		t.Errorf("Sign(a, b) = %q, want %q", both, sa+" "+sb)
	}
	if !Verify(b, "evt_1", "1700000000", body, both) || Verify(newSecret(), "evt_1", "1700000000", body, both) {
		t.Error("Verify does not tell the signing secrets from another")
	}
	if Verify(a, "evt_1", "1700000001", body, both) || Verify(a, "evt_2", "1700000000", body, both) {
		t.Error("Verify accepts a signature for another timestamp or id")
	}
}

func TestSecretsAreWhsecWith32RandomBytesAndMaskToTheLastFour(t *testing.T) {
	s := newSecret()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, SecretPrefix))
	if !strings.HasPrefix(s, SecretPrefix) || err != nil || len(key) != 32 {
		t.Fatalf("secret %q: want whsec_ + base64 of 32 bytes", s)
	}
	if s == newSecret() {
		t.Fatal("two secrets are equal")
	}
	if m := maskSecret(s); m != "whsec_…"+s[len(s)-4:] || strings.Contains(m, s[6:20]) {
		t.Errorf("mask %q", m)
	}
	if _, err := Sign("evt_1", time.Now(), nil, "nope"); err == nil {
		t.Error("a secret without whsec_ signs")
	}
}
