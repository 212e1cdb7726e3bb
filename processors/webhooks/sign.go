package webhooks

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"carehub/kernel/events"
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

// userAgent identifies carehub's deliveries to receivers.
const userAgent = "carehub-webhooks/1"

// newSecret returns whsec_ + base64 of 32 random bytes.
func newSecret() string {
	b := make([]byte, secretBytes)
	if _, err := rand.Read(b); err != nil {
		// crypto/rand does not fail on supported platforms; a secret must never be weak.
		panic("webhooks: no randomness: " + err.Error())
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(b)
}

// maskSecret shows only the prefix and the last four characters.
func maskSecret(s string) string {
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

// Verify reports whether one of the signatures in header (webhook-signature) is body's signature
// for id and the unix timestamp ts under secret. It checks no clock tolerance: receivers should.
// carehub uses it in tests and documentation; the reference verifier is the standardwebhooks
// library (see nodeverify/).
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

// deliveredEvent is the body a receiver gets (the spec's delivered shape, DECISIONS §4).
type deliveredEvent struct {
	Event     string          `json:"event"`
	Timestamp string          `json:"timestamp"`
	OrgID     string          `json:"org_id"`
	ProjectID string          `json:"project_id"`
	Payload   json.RawMessage `json:"payload"`
	// Redacted is true when the payload's patient data was removed for the subscription (phi.go).
	Redacted bool `json:"redacted,omitempty"`
}

// Body returns the bytes delivered for ev: {event, timestamp, org_id, project_id, payload}, with
// timestamp the event's createdAt in RFC 3339 UTC.
func Body(ev events.Event) ([]byte, error) {
	payload := ev.Payload
	if len(payload) == 0 {
		payload = json.RawMessage(`{}`)
	}
	return json.Marshal(deliveredEvent{
		Event:     ev.Type,
		Timestamp: ev.CreatedAt.UTC().Format(time.RFC3339Nano),
		OrgID:     ev.OrgID,
		ProjectID: ev.ProjectID,
		Payload:   payload,
	})
}

// BatchIDPrefix starts the webhook-id of a batched POST (an ordered subscription with batchSize
// above 1).
const BatchIDPrefix = "whb_"

// BatchBody is the webhook-id and body of one POST carrying several events (ids[i] with its
// Body bodies[i]): a JSON array of {"id": the webhook-id the event has alone, "body": the body it
// has alone}; the id is derived from the events' ids, so the same batch sent again has the same
// one.
func BatchBody(ids []string, bodies [][]byte) (string, []byte) {
	h := sha256.New()
	size := 2
	for i, id := range ids {
		h.Write([]byte(id))
		h.Write([]byte{0})
		size += len(bodies[i]) + len(id) + 20
	}
	out := make([]byte, 0, size)
	out = append(out, '[')
	for i, id := range ids {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"id":`...)
		out = strconv.AppendQuote(out, id)
		out = append(out, `,"body":`...)
		out = append(out, bodies[i]...)
		out = append(out, '}')
	}
	out = append(out, ']')
	return BatchIDPrefix + hex.EncodeToString(h.Sum(nil)[:16]), out
}
