// Package whsig signs outbound HTTP deliveries the Standard Webhooks way
// (https://www.standardwebhooks.com/): whsec_ secrets, the webhook-id, webhook-timestamp and
// webhook-signature headers, and the v1 HMAC-SHA256 signature of "{id}.{timestamp}.{body}". Every
// processor that POSTs to a receiver's URL (webhook subscriptions, FHIR Subscriptions rest-hooks)
// signs with it, so receivers verify all of carehub's deliveries the same way.
package whsig

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// SecretPrefix starts every signing secret (Standard Webhooks).
const SecretPrefix = "whsec_"

// secretBytes is the length of a secret's key.
const secretBytes = 32

// Standard Webhooks headers.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// NewSecret returns whsec_ + base64 of 32 random bytes.
func NewSecret() string {
	b := make([]byte, secretBytes)
	if _, err := rand.Read(b); err != nil {
		// crypto/rand does not fail on supported platforms; a secret must never be weak.
		panic("whsig: no randomness: " + err.Error())
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(b)
}

// Mask shows only a secret's prefix and its last four characters.
func Mask(s string) string {
	if len(s) < len(SecretPrefix)+4 {
		return SecretPrefix + "…"
	}
	return SecretPrefix + "…" + s[len(s)-4:]
}

// secretKey returns the HMAC key of a whsec_ secret: its base64-decoded remainder.
func secretKey(secret string) ([]byte, error) {
	rest, ok := strings.CutPrefix(secret, SecretPrefix)
	if !ok {
		return nil, errors.New("webhook secret lacks the whsec_ prefix")
	}
	key, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		return nil, errors.New("webhook secret is not base64")
	}
	return key, nil
}

// Sign returns the Standard Webhooks signature of body for message id at ts under each secret,
// space-separated in the order given: "v1,<base64 HMAC-SHA256 of {id}.{ts}.{body}>". It is what
// the webhook-signature header carries.
func Sign(id string, ts time.Time, body []byte, secrets ...string) (string, error) {
	if len(secrets) == 0 {
		return "", errors.New("no signing secret") // an empty header would go out unsigned
	}
	unix := strconv.FormatInt(ts.Unix(), 10)
	sigs := make([]string, 0, len(secrets))
	for _, s := range secrets {
		key, err := secretKey(s)
		if err != nil {
			return "", err
		}
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id))
		mac.Write([]byte{'.'})
		mac.Write([]byte(unix))
		mac.Write([]byte{'.'})
		mac.Write(body)
		sigs = append(sigs, "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	}
	return strings.Join(sigs, " "), nil
}

// SetHeaders signs body and sets webhook-id, webhook-timestamp (unix seconds) and
// webhook-signature on h. It sets nothing when signing fails (no secret, or one that is not a
// whsec_ secret), so a request is never sent half-signed.
func SetHeaders(h http.Header, id string, ts time.Time, body []byte, secrets ...string) error {
	sig, err := Sign(id, ts, body, secrets...)
	if err != nil {
		return err
	}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, sig)
	return nil
}

// Verify reports whether one of the signatures in header (webhook-signature) is body's signature
// for id and the unix timestamp ts under secret. It checks no clock tolerance: receivers should.
// carehub uses it in tests and documentation; the reference verifier is the standardwebhooks
// library (see processors/webhooks/nodeverify/).
func Verify(secret, id, ts string, body []byte, header string) bool {
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return false
	}
	want, err := Sign(id, time.Unix(sec, 0), body, secret)
	if err != nil {
		return false
	}
	for sig := range strings.FieldsSeq(header) {
		if hmac.Equal([]byte(sig), []byte(want)) {
			return true
		}
	}
	return false
}
