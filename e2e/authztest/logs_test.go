package authztest

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/kernel/clinical"
)

// lockedBuffer collects a node's log lines from its goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestLogsCarryNoSecretsOrPatientData runs a node logging everything (debug) through the paths
// that handle secrets and patient data, successful and refused, and searches its log for them.
func TestLogsCarryNoSecretsOrPatientData(t *testing.T) {
	var logs lockedBuffer
	s := servertest.StartLogged(t, servertest.Config(t), slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	key := s.DemoKey()
	var orgs struct {
		Organizations []struct{ Projects []struct{ ID string } }
	}
	mustData(t, s.GraphQL(key, `{ organizations { projects { id } } }`, nil), &orgs)
	projectID := orgs.Organizations[0].Projects[0].ID

	secrets := map[string]string{"the live key": key}
	const (
		family  = "Quixlogprobe"
		phone   = "555-0199-7341"
		vital   = 187.25
		payload = "payload-marker-5c1f"
	)
	patient := map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": family, "given": []any{"Ada"}}},
		"gender": "female", "birthDate": "1931-07-04", "telecom": []any{map[string]any{"system": "phone", "value": phone}}}
	r := s.Do(http.MethodPost, "/v1/patients", key, patient)
	if r.Status != http.StatusCreated {
		t.Fatalf("POST /v1/patients: %d %s", r.Status, r.Body)
	}
	var created struct{ ID string }
	r.JSON(t, &created)

	obs := map[string]any{"resourceType": "Observation", "status": "final",
		"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": clinical.LOINCHeartRate}}},
		"subject":           map[string]any{"reference": "Patient/" + created.ID},
		"effectiveDateTime": time.Now().UTC().Format(time.RFC3339),
		"valueQuantity":     map[string]any{"value": vital, "unit": "/min"}}
	if r := s.Do(http.MethodPost, "/v1/observations", key, obs); r.Status != http.StatusAccepted {
		t.Fatalf("POST /v1/observations: %d %s", r.Status, r.Body)
	}
	// Refused and malformed input echoes nothing of itself into the log either.
	bad := obs
	bad["valueQuantity"] = map[string]any{"value": vital, "unit": "furlongs/" + payload}
	s.Do(http.MethodPost, "/v1/observations", key, bad)
	s.Do(http.MethodPost, "/v1/patients", key, `{"resourceType":"Patient","name":[{"family":"`+family+`"`)

	var hook struct{ ID, Secret string }
	r = s.Do(http.MethodPost, "/v1/webhooks", key, map[string]any{"projectId": projectID, "url": "https://127.0.0.1:9/hook", "events": []string{"logs.*"}})
	if r.Status != http.StatusCreated {
		t.Fatalf("POST /v1/webhooks: %d %s", r.Status, r.Body)
	}
	r.JSON(t, &hook)
	secrets["a webhook secret"] = hook.Secret
	var rotated struct{ Secret string }
	s.Do(http.MethodPost, "/v1/webhooks/"+hook.ID+"/rotate-secret", key, nil).JSON(t, &rotated)
	secrets["a rotated webhook secret"] = rotated.Secret
	// Published after the webhook exists, so the dispatcher delivers it.
	pub := s.GraphQL(key, `mutation($p: ID!, $x: JSON!) { publishEvent(type: "logs.probe", projectId: $p, payload: $x) { id } }`,
		map[string]any{"p": projectID, "x": map[string]any{"patientId": created.ID, "note": payload}})
	mustData(t, pub, nil)

	var minted struct {
		Key string `json:"key"`
	}
	r = s.Do(http.MethodPost, "/v1/api-keys", key, map[string]any{"name": "logs", "mode": "live", "scopes": []string{access.ReadPatients}})
	r.JSON(t, &minted)
	secrets["a minted key"] = minted.Key
	var token struct {
		AccessToken string `json:"access_token"`
	}
	s.Do(http.MethodPost, "/v1/auth/token", minted.Key, map[string]any{"scope": []string{access.ReadPatients}}).JSON(t, &token)
	secrets["a JWT"] = token.AccessToken
	if r := s.Do(http.MethodPost, "/v1/api-keys/"+keyID(t, s, key, minted.Key)+"/revoke", key, nil); r.Status != http.StatusOK {
		t.Fatalf("revoke: %d %s", r.Status, r.Body)
	}
	// Refused credentials: revoked, unknown, and a JWT with a broken signature.
	s.Do(http.MethodGet, "/v1/organizations", minted.Key, nil)
	unknown := "chk_live_" + strings.Repeat("Q", 32)
	secrets["an unknown key"] = unknown
	s.Do(http.MethodGet, "/v1/organizations", unknown, nil)
	s.Do(http.MethodGet, "/v1/organizations", token.AccessToken+"x", nil)

	for what, v := range secrets {
		if v == "" {
			t.Fatalf("%s was not issued", what)
		}
	}
	// The node has stored and delivered (or tried to deliver) what it accepted before the log is read.
	servertest.Eventually(t, time.Minute, "the observation and the event in the event log", func() bool {
		r := s.Do(http.MethodGet, "/v1/events?projectId="+projectID+"&limit=100", key, nil)
		return strings.Contains(string(r.Body), "logs.probe") && strings.Contains(string(r.Body), created.ID)
	})
	servertest.Eventually(t, time.Minute, "a delivery attempt of the probe event", func() bool {
		r := s.Do(http.MethodGet, "/v1/webhooks/"+hook.ID+"/deliveries", key, nil)
		return strings.Contains(string(r.Body), `"attempts"`) || strings.Contains(string(r.Body), `"status"`)
	})

	log := logs.String()
	if !strings.Contains(log, "route=/v1/observations") || !strings.Contains(log, "route=/v1/auth/token") {
		t.Fatalf("the log lacks the requests' access lines; the test reads nothing:\n%s", log)
	}
	for what, v := range secrets {
		if i := strings.Index(log, v); i >= 0 {
			t.Errorf("%s is in the log: …%s…", what, excerpt(log, i))
		}
		// A key's secret part alone (after its prefix) must not appear either.
		if tail := v[len(v)-16:]; strings.Contains(log, tail) {
			t.Errorf("the end of %s is in the log", what)
		}
	}
	for what, v := range map[string]string{"a patient's family name": family, "a patient's phone": phone,
		"a vital sign value": "187.25", "a birth date": "1931-07-04", "an event payload": payload} {
		if i := strings.Index(log, v); i >= 0 {
			t.Errorf("%s is in the log: …%s…", what, excerpt(log, i))
		}
	}
}

func excerpt(s string, i int) string {
	from, to := max(0, i-120), min(len(s), i+60)
	return s[from:to]
}

// mustData decodes a GraphQL answer that must have no errors into v (when v is not nil).
func mustData(t *testing.T, r *servertest.GraphQLResponse, v any) {
	t.Helper()
	if len(r.Errors) > 0 {
		t.Fatalf("GraphQL errors: %+v", r.Errors)
	}
	if v != nil {
		if err := json.Unmarshal(r.Data, v); err != nil {
			t.Fatalf("decode %s: %v", r.Data, err)
		}
	}
}
