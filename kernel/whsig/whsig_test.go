package whsig

import (
	"encoding/base64"
	"net/http"
	"strconv"
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
	a, b := NewSecret(), NewSecret()
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
	if !Verify(b, "evt_1", "1700000000", body, both) || Verify(NewSecret(), "evt_1", "1700000000", body, both) {
		t.Error("Verify does not tell the signing secrets from another")
	}
	if Verify(a, "evt_1", "1700000001", body, both) || Verify(a, "evt_2", "1700000000", body, both) {
		t.Error("Verify accepts a signature for another timestamp or id")
	}
}

func TestSecretsAreWhsecWith32RandomBytesAndMaskToTheLastFour(t *testing.T) {
	s := NewSecret()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, SecretPrefix))
	if !strings.HasPrefix(s, SecretPrefix) || err != nil || len(key) != 32 {
		t.Fatalf("secret %q: want whsec_ + base64 of 32 bytes", s)
	}
	if s == NewSecret() {
		t.Fatal("two secrets are equal")
	}
	if m := Mask(s); m != "whsec_…"+s[len(s)-4:] || strings.Contains(m, s[6:20]) {
		t.Errorf("mask %q", m)
	}
	if m := Mask("whsec_ab"); m != "whsec_…" {
		t.Errorf("mask of a short secret %q, want only the prefix", m)
	}
	if _, err := Sign("evt_1", time.Now(), nil, "nope"); err == nil {
		t.Error("a secret without whsec_ signs")
	}
	if _, err := Sign("evt_1", time.Now(), nil, "whsec_!!not base64"); err == nil {
		t.Error("a secret that is not base64 signs")
	}
	if _, err := Sign("evt_1", time.Now(), nil); err == nil {
		t.Error("no secret signs")
	}
}

func TestSetHeadersSetsTheThreeStandardHeaders(t *testing.T) {
	a, b := NewSecret(), NewSecret()
	body := []byte(`{"resourceType":"Bundle"}`)
	ts := time.Unix(1700000000, 500)
	h := http.Header{}
	if err := SetHeaders(h, "evt_1", ts, body, a, b); err != nil {
		t.Fatal(err)
	}
	want, _ := Sign("evt_1", ts, body, a, b)
	if h.Get(HeaderID) != "evt_1" || h.Get(HeaderTimestamp) != "1700000000" || h.Get(HeaderSignature) != want {
		t.Errorf("headers %v, want id evt_1, timestamp 1700000000, signature %q", h, want)
	}
	if !Verify(a, h.Get(HeaderID), h.Get(HeaderTimestamp), body, h.Get(HeaderSignature)) ||
		!Verify(b, h.Get(HeaderID), h.Get(HeaderTimestamp), body, h.Get(HeaderSignature)) {
		t.Error("the headers set do not verify under either secret")
	}

	unsigned := http.Header{}
	if err := SetHeaders(unsigned, "evt_1", ts, body); err == nil || len(unsigned) != 0 {
		t.Errorf("without a secret: err %v, headers %v; want an error and no header", err, unsigned)
	}
	if err := SetHeaders(unsigned, "evt_1", ts, body, "nope"); err == nil || len(unsigned) != 0 {
		t.Errorf("with a bad secret: err %v, headers %v; want an error and no header", err, unsigned)
	}
}

// BenchmarkSetHeaders is the signing of each webhook attempt: a 300-byte body, one secret and,
// during a rotation, two.
func BenchmarkSetHeaders(b *testing.B) {
	body := []byte(strings.Repeat("x", 300))
	ts := time.Unix(1614265330, 0)
	for _, secrets := range [][]string{{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
		{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"}} {
		b.Run(strconv.Itoa(len(secrets)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := SetHeaders(http.Header{}, "msg_p5jXN8AQM9LWM0D4loKWxJek", ts, body, secrets...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestSignAfterTheKeyedHMACsAreLetGo(t *testing.T) {
	const vector = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	secret, body, at := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", []byte(`{"test": 2432232314}`), time.Unix(1614265330, 0)
	for i := range maxKeyed + 2 {
		other := NewSecret()
		a, _ := Sign("msg_1", at, body, other)
		b, _ := Sign("msg_1", at, body, other) // from the pool, reset
		if a != b {
			t.Fatalf("secret %d signed the same content twice differently: %s, %s", i, a, b)
		}
		if i%1000 == 0 || i > maxKeyed-2 {
			if got, _ := Sign("msg_p5jXN8AQM9LWM0D4loKWxJek", at, body, secret); got != vector {
				t.Fatalf("after %d other secrets: %s, want %s", i, got, vector)
			}
		}
	}
}
