package authztest

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"carehub/api/ws/wstest"
	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// refusal is an audit record of a refused credential as GET /v1/audit shows it.
type refusal struct {
	ID          string `json:"id"`
	OrgID       string `json:"orgId"`
	KeyID       string `json:"keyId"`
	Mode        string `json:"mode"`
	ClientIP    string `json:"clientIp"`
	UserAgent   string `json:"userAgent"`
	Operation   string `json:"operation"`
	Outcome     string `json:"outcome"`
	Status      int    `json:"status"`
	AuthFailure string `json:"authFailure"`
	Credential  string `json:"credential"`
}

// refusalsOf polls GET /v1/audit?<query> as reader until a record satisfies match, and returns
// it with the raw page it came in.
func refusalsOf(t *testing.T, s *servertest.Server, reader, query string, match func(refusal) bool) (refusal, string) {
	t.Helper()
	var found refusal
	var raw string
	servertest.Eventually(t, 30*time.Second, "audit record for "+query, func() bool {
		r := s.Do(http.MethodGet, "/v1/audit?limit=1000&"+query, reader, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("GET /v1/audit?%s: %d %s", query, r.Status, r.Body)
		}
		var page struct{ Data []refusal }
		r.JSON(t, &page)
		for _, rec := range page.Data {
			if match(rec) {
				found, raw = rec, string(r.Body)
				return true
			}
		}
		return false
	})
	return found, raw
}

// TestRefusedCredentialsAudited: a 401, whether a revoked live key, an unknown key, a malformed
// header or a forged JWT, over REST, GraphQL or a WebSocket's connection_init, is in the audit
// log as a failed authentication, without the secret. A refusal whose key exists is filed under
// the key's organization, where its administrators see it; one whose key does not exist names
// no tenant and is seen by the platform operator only.
func TestRefusedCredentialsAudited(t *testing.T) {
	s := servertest.Start(t)
	admin := s.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg)
	platform := s.PlatformKey()
	org := s.OrgID(demo.DemoOrgSlug)
	victim := s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients)
	victimID := keyID(t, s, admin, victim)
	if r := s.Do(http.MethodPost, "/v1/api-keys/"+victimID+"/revoke", admin, nil); r.Status != http.StatusOK {
		t.Fatalf("revoke: %d %s", r.Status, r.Body)
	}
	masked := victim[:len("chk_live_")] + "…" + victim[len(victim)-4:]

	// A revoked live key, over REST: filed under its organization, by key id.
	r := s.Do(http.MethodGet, "/v1/patients/"+demo.DeterioratingPatientID, victim, nil)
	if r.Status != http.StatusUnauthorized {
		t.Fatalf("revoked key: %d %s", r.Status, r.Body)
	}
	id := r.Header.Get("Request-Id")
	rec, raw := refusalsOf(t, s, admin, "keyId="+victimID, func(x refusal) bool { return x.ID == id })
	if rec.OrgID != org || rec.Mode != access.Live || rec.AuthFailure != "revoked" || rec.Credential != masked ||
		rec.Status != 401 || rec.Outcome != "denied" || rec.ClientIP != "127.0.0.1" || rec.Operation != "GET /v1/patients/{id}" {
		t.Fatalf("revoked key recorded as %+v", rec)
	}
	if strings.Contains(raw, victim) {
		t.Fatal("the audit log carries the revoked key's secret")
	}

	// The same key on a WebSocket: the refused connection_init is recorded too.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, err := wstest.Dial(ctx, "ws"+strings.TrimPrefix(s.URL, "http")+"/graphql", "Bearer "+victim); err == nil {
		c.Close()
		t.Fatal("connection_init with a revoked key was acknowledged")
	}
	rec, _ = refusalsOf(t, s, admin, "keyId="+victimID+"&operation=graphql+ws+connection_init", func(x refusal) bool { return true })
	if rec.AuthFailure != "revoked" || rec.Status != 401 || rec.OrgID != org {
		t.Fatalf("refused connection_init recorded as %+v", rec)
	}

	// A live key used from outside its IP allowlist on a WebSocket: refused at connection_init
	// and recorded as a denied call of that key, as the same call over HTTP is.
	var fenced struct {
		ID  string `json:"id"`
		Key string `json:"key"`
	}
	r = s.Do(http.MethodPost, "/v1/api-keys", admin, map[string]any{"name": "fenced", "mode": "live",
		"scopes": []string{access.AdminOrg}, "ipAllowlist": []string{"203.0.113.0/24"}})
	if r.Status != http.StatusCreated {
		t.Fatalf("create a fenced key: %d %s", r.Status, r.Body)
	}
	r.JSON(t, &fenced)
	if c, err := wstest.Dial(ctx, "ws"+strings.TrimPrefix(s.URL, "http")+"/graphql", "Bearer "+fenced.Key); err == nil {
		c.Close()
		t.Fatal("connection_init from outside the key's allowlist was acknowledged")
	}
	rec, raw = refusalsOf(t, s, admin, "keyId="+fenced.ID+"&operation=graphql+ws+connection_init", func(x refusal) bool { return true })
	if rec.Status != http.StatusForbidden || rec.Outcome != "denied" || rec.OrgID != org || rec.ClientIP != "127.0.0.1" {
		t.Fatalf("connection_init outside the allowlist recorded as %+v", rec)
	}
	if strings.Contains(raw, fenced.Key) {
		t.Fatal("the audit log carries the fenced key's secret")
	}

	// Credentials that name no key: filed under no organization, seen by the platform operator.
	unknown := "chk_live_" + strings.Repeat("Z", 28) + victim[len(victim)-4:]
	for _, tc := range []struct {
		name, method, path, authorization, reason, credential, secret string
	}{
		{"unknown key", http.MethodGet, "/v1/organizations", "Bearer " + unknown, "unknown_key", "chk_live_…" + unknown[len(unknown)-4:], unknown},
		{"malformed header", http.MethodGet, "/v1/organizations", "Basic c2VjcmV0OnBhc3N3b3Jk", "malformed", "", "c2VjcmV0OnBhc3N3b3Jk"},
		{"forged JWT", http.MethodPost, "/graphql", "Bearer eyJhbGciOiJFZERTQSIsImtpZCI6IngifQ.eyJzdWIiOiJrZXlfMSJ9.c2lnbmF0dXJl", "invalid_token", "jwt", "c2lnbmF0dXJl"},
		{"missing", http.MethodGet, "/v1/organizations", "", "missing", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, s.URL+tc.path, strings.NewReader(`{"query":"{ organizations { id } }"}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("User-Agent", "refusal-test/1")
			if tc.authorization != "" {
				req.Header.Set("Authorization", tc.authorization)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("%s %s: %d, want 401", tc.method, tc.path, resp.StatusCode)
			}
			id := resp.Header.Get("Request-Id")
			rec, raw := refusalsOf(t, s, platform, "", func(x refusal) bool { return x.ID == id })
			if rec.OrgID != "" || rec.KeyID != "" || rec.AuthFailure != tc.reason || rec.Credential != tc.credential ||
				rec.Status != 401 || rec.UserAgent != "refusal-test/1" || rec.ClientIP != "127.0.0.1" {
				t.Fatalf("recorded as %+v", rec)
			}
			if tc.secret != "" && strings.Contains(raw, tc.secret) {
				t.Fatal("the audit log carries the presented secret")
			}
			// No tenant's administrator sees it.
			if tenantSees(t, s, admin, id) {
				t.Fatal("a tenant's administrator reads a refusal that names no tenant")
			}
		})
	}
}

// tenantSees reports whether reader's audit log holds the record with id.
func tenantSees(t *testing.T, s *servertest.Server, reader, id string) bool {
	t.Helper()
	r := s.Do(http.MethodGet, "/v1/audit?limit=1000", reader, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /v1/audit: %d %s", r.Status, r.Body)
	}
	var page struct{ Data []refusal }
	r.JSON(t, &page)
	for _, rec := range page.Data {
		if rec.ID == id {
			return true
		}
	}
	return false
}
