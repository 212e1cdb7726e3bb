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
	"hash"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	return sign(id, strconv.FormatInt(ts.Unix(), 10), body, secrets)
}

// sign is Sign with the timestamp as the header carries it. The signed content's head,
// "{id}.{ts}.", is written once for every secret, and the signatures appended to one buffer: an
// attempt signs on every send, thousands a second.
func sign(id, unix string, body []byte, secrets []string) (string, error) {
	if len(secrets) == 0 {
		return "", errors.New("no signing secret") // an empty header would go out unsigned
	}
	head := make([]byte, 0, len(id)+len(unix)+2)
	head = append(append(append(append(head, id...), '.'), unix...), '.')
	out := make([]byte, 0, len(secrets)*48)
	var sum [sha256.Size]byte
	for i, s := range secrets {
		macs, err := keyed(s)
		if err != nil {
			return "", err
		}
		mac := macs.Get().(hash.Hash)
		mac.Write(head)
		mac.Write(body)
		if i > 0 {
			out = append(out, ' ')
		}
		out = base64.StdEncoding.AppendEncode(append(out, "v1,"...), mac.Sum(sum[:0]))
		mac.Reset()
		macs.Put(mac)
	}
	return string(out), nil
}

// maxKeyed is how many secrets' HMACs are kept before they are all let go.
const maxKeyed = 4096

// keyedMACs holds, by secret, a pool of HMAC-SHA256s keyed with it: a reset HMAC starts from its
// key's state, so the key is decoded and hashed into its pads once rather than on every
// signature (with the HMAC's allocations, about a third of what signing a delivery cost).
var (
	keyedMACs sync.Map // secret → *sync.Pool of hash.Hash
	keyedN    atomic.Int64
)

// keyed returns the pool of HMACs keyed with secret.
func keyed(secret string) (*sync.Pool, error) {
	if p, ok := keyedMACs.Load(secret); ok {
		return p.(*sync.Pool), nil
	}
	key, err := secretKey(secret)
	if err != nil {
		return nil, err
	}
	if keyedN.Add(1) > maxKeyed { // secrets of deleted subscriptions, and rotated-out ones
		keyedMACs.Clear()
		keyedN.Store(1)
	}
	p, _ := keyedMACs.LoadOrStore(secret, &sync.Pool{New: func() any { return hmac.New(sha256.New, key) }})
	return p.(*sync.Pool), nil
}

// SetHeaders signs body and sets webhook-id, webhook-timestamp (unix seconds) and
// webhook-signature on h. It sets nothing when signing fails (no secret, or one that is not a
// whsec_ secret), so a request is never sent half-signed.
func SetHeaders(h http.Header, id string, ts time.Time, body []byte, secrets ...string) error {
	unix := strconv.FormatInt(ts.Unix(), 10)
	sig, err := sign(id, unix, body, secrets)
	if err != nil {
		return err
	}
	h[canonicalID], h[canonicalTimestamp], h[canonicalSignature] = []string{id}, []string{unix}, []string{sig}
	return nil
}

// The headers' keys as net/http sends them (and Header.Set would make them, on every call).
var (
	canonicalID        = textproto.CanonicalMIMEHeaderKey(HeaderID)
	canonicalTimestamp = textproto.CanonicalMIMEHeaderKey(HeaderTimestamp)
	canonicalSignature = textproto.CanonicalMIMEHeaderKey(HeaderSignature)
)

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
