package attacktest

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// TestWebhookSecretsSealedAtRest: finding 12 of issue 51 ("webhook secrets are stored in
// clear"). A reader of the database read every subscription's signing secret and could forge
// deliveries its receivers trust. The row must hold no secret in clear, neither at create nor
// after a rotation, and deliveries must still be signed with the secret the API returned.
func TestWebhookSecretsSealedAtRest(t *testing.T) {
	s := servertest.Start(t)
	admin := s.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg, access.ExecWorkflows)
	project := s.ProjectID(demo.SepsisProjectName)
	rc := newHookReceiver(t)

	r := s.Do(http.MethodPost, "/v1/webhooks", admin, map[string]any{"projectId": project, "url": rc.URL, "events": []string{"attack.*"}})
	var hook struct{ ID, Secret string }
	r.JSON(t, &hook)
	if r.Status != http.StatusCreated || !strings.HasPrefix(hook.Secret, "whsec_") {
		t.Fatalf("create webhook: %d %s", r.Status, r.Body)
	}
	assertRowHoldsNoSecret(t, s, hook.ID, hook.Secret)
	req := publishAndReceive(t, s, admin, project, rc)
	if !verifyDelivery(hook.Secret, req) {
		t.Fatalf("the delivery does not verify with the secret create returned: %v", req.header)
	}

	r = s.Do(http.MethodPost, "/v1/webhooks/"+hook.ID+"/rotate-secret", admin, nil)
	var rotated struct{ Secret string }
	r.JSON(t, &rotated)
	if r.Status != http.StatusOK || !strings.HasPrefix(rotated.Secret, "whsec_") || rotated.Secret == hook.Secret {
		t.Fatalf("rotate secret: %d %s", r.Status, r.Body)
	}
	assertRowHoldsNoSecret(t, s, hook.ID, hook.Secret, rotated.Secret)
	req = publishAndReceive(t, s, admin, project, rc)
	if !verifyDelivery(rotated.Secret, req) || !verifyDelivery(hook.Secret, req) {
		t.Fatalf("during the rotation, the delivery does not verify with both secrets: %v", req.header)
	}
}

// assertRowHoldsNoSecret reads the subscription's row as a reader of the database would and
// looks for each secret in it, whole or as its base64 key.
func assertRowHoldsNoSecret(t *testing.T, s *servertest.Server, id string, secrets ...string) {
	t.Helper()
	var row string
	if err := s.Pool().QueryRow(context.Background(), `select w::text from webhooks w where id = $1`, id).Scan(&row); err != nil {
		t.Fatal(err)
	}
	for _, secret := range secrets {
		if strings.Contains(row, strings.TrimPrefix(secret, "whsec_")) {
			t.Fatalf("webhook %s: its row holds a signing secret in clear", id)
		}
	}
}

// hookRequest is one request a receiver got.
type hookRequest struct {
	header http.Header
	body   []byte
}

// hookReceiver is a webhook endpoint on loopback (servertest's nodes allow private destinations).
type hookReceiver struct {
	*httptest.Server
	got chan hookRequest
}

func newHookReceiver(t *testing.T) *hookReceiver {
	rc := &hookReceiver{got: make(chan hookRequest, 16)}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		select {
		case rc.got <- hookRequest{header: r.Header.Clone(), body: body}:
		default: // a retry the test does not wait for
		}
	}))
	t.Cleanup(rc.Close)
	return rc
}

// publishAndReceive publishes an event the subscription matches and returns its delivery.
func publishAndReceive(t *testing.T, s *servertest.Server, key, project string, rc *hookReceiver) hookRequest {
	t.Helper()
	r := s.Do(http.MethodPost, "/v1/events", key, map[string]any{"projectId": project, "type": "attack.webhook_probe", "payload": map[string]any{}})
	var published struct{ Data []struct{ ID string } }
	r.JSON(t, &published)
	if r.Status != http.StatusAccepted || len(published.Data) != 1 {
		t.Fatalf("publish: %d %s", r.Status, r.Body)
	}
	ev := published.Data[0]
	deadline := time.After(90 * time.Second)
	for {
		select {
		case req := <-rc.got:
			if req.header.Get("webhook-id") == ev.ID {
				return req
			}
		case <-deadline:
			t.Fatalf("event %s was not delivered", ev.ID)
		}
	}
}

// verifyDelivery is the receiver's check that docs/WEBHOOKS.md gives: HMAC-SHA256, keyed by the
// decoded secret, of "{webhook-id}.{webhook-timestamp}.{body}", among the signatures sent.
func verifyDelivery(secret string, req hookRequest) bool {
	id, ts := req.header.Get("webhook-id"), req.header.Get("webhook-timestamp")
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || time.Since(time.Unix(unix, 0)).Abs() > 5*time.Minute {
		return false
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return false
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(req.body)
	expected := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, sig := range strings.Fields(req.header.Get("webhook-signature")) {
		if hmac.Equal([]byte(sig), []byte(expected)) {
			return true
		}
	}
	return false
}
