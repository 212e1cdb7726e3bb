package attacktest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// Finding 7 of issue 51: a replay of an Idempotency-Key answered without running the handler,
// so without its scope checks and patient-data rules. A JWT narrowed from a key must not get
// the answers the key got with the same Idempotency-Key: the webhook secret of POST /v1/webhooks
// (REST), the patient data of runAgent (GraphQL).
func TestReplayChecksScopes(t *testing.T) {
	s := servertest.Start(t)
	parent := s.Key(demo.DemoOrgSlug, access.Live, access.Scopes...)
	var project, agent string
	ctx := context.Background()
	if err := s.Pool().QueryRow(ctx, `select id from projects where org_id = $1 and name = $2`, demo.DemoOrgID, demo.SepsisProjectName).Scan(&project); err != nil {
		t.Fatal(err)
	}
	if err := s.Pool().QueryRow(ctx, `select id from agents where org_id = $1 and name = $2`, demo.DemoOrgID, demo.Ward7AgentName).Scan(&agent); err != nil {
		t.Fatal(err)
	}

	t.Run("REST POST /v1/webhooks replayed to an exec:workflows JWT", func(t *testing.T) {
		body := map[string]any{"projectId": project, "url": "http://127.0.0.1:9/replay", "events": []string{"agent.run_completed"}}
		first := replayDo(t, s, http.MethodPost, "/v1/webhooks", parent, "replay-webhook", body)
		var created struct{ Secret string }
		first.JSON(t, &created)
		if first.Status != http.StatusCreated || created.Secret == "" {
			t.Fatalf("create with the parent key: %d %s", first.Status, first.Body)
		}
		narrow := replayJWT(t, s, parent, access.ExecWorkflows)
		again := replayDo(t, s, http.MethodPost, "/v1/webhooks", narrow, "replay-webhook", body)
		if again.Status < 400 || bytes.Contains(again.Body, []byte(created.Secret)) || again.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("exec:workflows JWT got the parent's answer: %d %s", again.Status, again.Body)
		}
		// Without the Idempotency-Key its own scope check refuses it, so a replay must not do more.
		if own := replayDo(t, s, http.MethodPost, "/v1/webhooks", narrow, "", body); own.Status != http.StatusForbidden {
			t.Fatalf("exec:workflows JWT without a key: %d %s, want 403", own.Status, own.Body)
		}
		// The parent itself still gets its replay.
		if r := replayDo(t, s, http.MethodPost, "/v1/webhooks", parent, "replay-webhook", body); r.Status != http.StatusCreated ||
			r.Header.Get("Idempotent-Replayed") != "true" || !bytes.Contains(r.Body, []byte(created.Secret)) {
			t.Fatalf("parent's replay: %d %s", r.Status, r.Body)
		}
	})

	t.Run("GraphQL runAgent replayed to an exec:agents JWT", func(t *testing.T) {
		body := map[string]any{
			"query":     `mutation($a: ID!, $p: String!) { runAgent(agentId: $a, patientId: $p) { id patientId status input output redacted } }`,
			"variables": map[string]any{"a": agent, "p": demo.RealPatientID},
		}
		first := replayDo(t, s, http.MethodPost, "/graphql", parent, "replay-agent", body)
		var res struct {
			Data struct {
				RunAgent struct {
					ID       string
					Redacted bool
				}
			}
		}
		first.JSON(t, &res)
		if first.Status != http.StatusOK || res.Data.RunAgent.ID == "" || res.Data.RunAgent.Redacted {
			t.Fatalf("runAgent with the parent key: %d %s", first.Status, first.Body)
		}
		narrow := replayJWT(t, s, parent, access.ExecAgents)
		again := replayDo(t, s, http.MethodPost, "/graphql", narrow, "replay-agent", body)
		if bytes.Contains(again.Body, []byte(res.Data.RunAgent.ID)) || again.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("exec:agents JWT got the parent's answer: %d %s", again.Status, again.Body)
		}
		if !strings.Contains(string(again.Body), "CONFLICT") {
			t.Fatalf("exec:agents JWT with the parent's key: %d %s, want CONFLICT", again.Status, again.Body)
		}
	})
}

// replayJWT exchanges key for a JWT holding only scopes.
func replayJWT(t *testing.T, s *servertest.Server, key string, scopes ...string) string {
	t.Helper()
	r := s.Do(http.MethodPost, "/v1/auth/token", key, map[string]any{"scope": scopes})
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	r.JSON(t, &tok)
	if r.Status != http.StatusOK || tok.AccessToken == "" {
		t.Fatalf("token exchange for %v: %d %s", scopes, r.Status, r.Body)
	}
	return tok.AccessToken
}

// replayDo is servertest.Server.Do with an Idempotency-Key header (none when idemKey is "").
func replayDo(t *testing.T, s *servertest.Server, method, path, key, idemKey string, body any) *servertest.Response {
	t.Helper()
	buf, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"Content-Type": {"application/json"}}
	if idemKey != "" {
		h.Set("Idempotency-Key", idemKey)
	}
	return attackSend(t, s, method, path, key, h, buf)
}

// attackSend sends body with key and the headers h.
func attackSend(t *testing.T, s *servertest.Server, method, path, key string, h http.Header, body []byte) *servertest.Response {
	t.Helper()
	req, err := http.NewRequest(method, s.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h.Clone()
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return &servertest.Response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}
