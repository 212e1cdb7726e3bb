package authztest

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// served reports whether the node serves method path (a credential-less call is not 404).
func served(s *servertest.Server, method, path string) bool {
	r := s.Do(method, path, "", nil)
	return r.Status != http.StatusNotFound && r.Status != http.StatusMethodNotAllowed
}

type auditPage struct {
	Data []struct {
		ID          string   `json:"id"`
		KeyID       string   `json:"keyId"`
		Mode        string   `json:"mode"`
		Operation   string   `json:"operation"`
		PatientIDs  []string `json:"patientIds"`
		ResourceIDs []string `json:"resourceIds"`
		Outcome     string   `json:"outcome"`
		Status      int      `json:"status"`
		ClientIP    string   `json:"clientIp"`
		UserAgent   string   `json:"userAgent"`
	} `json:"data"`
	Meta struct {
		Total  int     `json:"total"`
		Cursor *string `json:"cursor"`
	} `json:"meta"`
}

// auditOf polls GET /v1/audit?keyId= until cond holds for the page.
func auditOf(t *testing.T, s *servertest.Server, admin, keyID string, cond func(auditPage) bool) auditPage {
	t.Helper()
	var page auditPage
	servertest.Eventually(t, 30*time.Second, "audit records of "+keyID, func() bool {
		r := s.Do(http.MethodGet, "/v1/audit?limit=1000&keyId="+keyID, admin, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("GET /v1/audit: %d %s", r.Status, r.Body)
		}
		page = auditPage{}
		r.JSON(t, &page)
		return cond(page)
	})
	return page
}

// TestTokenExchangeOnServer: POST /v1/auth/token as the spec shows it, and the JWT used as a
// credential on REST and GraphQL.
func TestTokenExchangeOnServer(t *testing.T) {
	s := servertest.Start(t)
	if !served(s, http.MethodPost, "/v1/auth/token") {
		t.Skip("POST /v1/auth/token is not mounted yet (api/server/routes.go)")
	}
	key := s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients, access.ExecAgents)
	r := s.Do(http.MethodPost, "/v1/auth/token", key, map[string]any{"scope": []string{"read:patients"}})
	if r.Status != http.StatusOK {
		t.Fatalf("exchange: %d %s", r.Status, r.Body)
	}
	var tok struct {
		AccessToken string `json:"access_token"`
		TokenType   string `json:"token_type"`
		ExpiresIn   int    `json:"expires_in"`
		Scope       string `json:"scope"`
		IssuedAt    string `json:"issued_at"`
	}
	r.JSON(t, &tok)
	if tok.TokenType != "Bearer" || tok.ExpiresIn != 3600 || tok.Scope != "read:patients" || strings.Count(tok.AccessToken, ".") != 2 {
		t.Fatalf("token %+v", tok)
	}
	if _, err := time.Parse(time.RFC3339, tok.IssuedAt); err != nil {
		t.Fatalf("issued_at %q: %v", tok.IssuedAt, err)
	}
	if r := s.Do(http.MethodGet, "/v1/organizations", tok.AccessToken, nil); r.Status != http.StatusOK || r.Header.Get("RateLimit-Limit") == "" {
		t.Fatalf("REST with the JWT: %d %v %s", r.Status, r.Header, r.Body)
	}
	g := s.GraphQL(tok.AccessToken, `{ organizations { id } }`, nil)
	if len(g.Errors) != 0 {
		t.Fatalf("GraphQL with the JWT: %+v", g.Errors)
	}
	r = s.Do(http.MethodGet, "/.well-known/jwks.json", "", nil)
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"kty":"OKP"`) {
		t.Fatalf("JWKS: %d %s", r.Status, r.Body)
	}
	// Exchanging more than the key holds, or exchanging a token.
	if r := s.Do(http.MethodPost, "/v1/auth/token", key, map[string]any{"scope": []string{"admin:org"}}); r.Status != http.StatusForbidden ||
		!strings.Contains(string(r.Body), "INSUFFICIENT_SCOPE") {
		t.Fatalf("exchange beyond the key: %d %s", r.Status, r.Body)
	}
	if r := s.Do(http.MethodPost, "/v1/auth/token", tok.AccessToken, map[string]any{"scope": []string{}}); r.Status != http.StatusForbidden {
		t.Fatalf("exchange of a token: %d %s", r.Status, r.Body)
	}
}

// TestHIPAAAuditOnServer: live-key calls reach the audit log (Kafka, the audit writer, the
// store) with the patients they touched; test-key calls do not.
func TestHIPAAAuditOnServer(t *testing.T) {
	s := servertest.Start(t)
	if !served(s, http.MethodGet, "/v1/audit") {
		t.Skip("GET /v1/audit is not mounted yet (api/server/routes.go)")
	}
	admin := s.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg)
	live := s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients)
	test := s.Key(demo.DemoOrgSlug, access.Test, access.ReadPatients)
	liveID, testID := keyID(t, s, admin, live), keyID(t, s, admin, test)

	patient := demo.DeterioratingPatientID
	g := s.GraphQL(live, `query P($id: ID!) { patient(id: $id) { id name } }`, map[string]any{"id": patient})
	if len(g.Errors) != 0 {
		t.Fatalf("live patient read: %+v", g.Errors)
	}
	page := auditOf(t, s, admin, liveID, func(p auditPage) bool { return len(p.Data) >= 1 })
	if len(page.Data) != 1 {
		t.Fatalf("%d audit records of one call, want exactly 1: %+v", len(page.Data), page.Data)
	}
	rec := page.Data[0]
	if rec.Operation != "graphql query patient" || rec.Mode != access.Live || rec.Outcome != "success" || rec.Status != 200 ||
		rec.ClientIP != "127.0.0.1" || !strings.HasPrefix(rec.ID, "req_") {
		t.Fatalf("audit record %+v", rec)
	}
	if len(rec.PatientIDs) != 1 || rec.PatientIDs[0] != patient {
		t.Fatalf("audit record names patients %v, want [%s]: the patient service must access.Touch what it returns", rec.PatientIDs, patient)
	}
	// Filtered by patient, the record is found; another patient's filter does not find it.
	r := s.Do(http.MethodGet, "/v1/audit?patientId="+patient+"&keyId="+liveID, admin, nil)
	var byPatient auditPage
	r.JSON(t, &byPatient)
	if len(byPatient.Data) != 1 {
		t.Fatalf("audit by patient: %d %s", r.Status, r.Body)
	}

	// A test-key call leaves no record: after it, a live call is recorded, and still none of
	// the test key's.
	if g := s.GraphQL(test, `query P($id: ID!) { patient(id: $id) { id } }`, map[string]any{"id": patient}); len(g.Errors) != 0 {
		t.Fatalf("test-key read of a synthetic patient: %+v", g.Errors)
	}
	s.Do(http.MethodGet, "/v1/organizations", live, nil)
	auditOf(t, s, admin, liveID, func(p auditPage) bool { return len(p.Data) >= 2 })
	if page := auditOf(t, s, admin, testID, func(auditPage) bool { return true }); len(page.Data) != 0 {
		t.Fatalf("test-key calls were audited: %+v", page.Data)
	}
	// The audit log is the caller's organization's.
	other := s.Key("northwind-health", access.Live, access.AdminOrg)
	r = s.Do(http.MethodGet, "/v1/audit?keyId="+liveID, other, nil)
	var foreign auditPage
	r.JSON(t, &foreign)
	if r.Status != http.StatusOK || len(foreign.Data) != 0 {
		t.Fatalf("another organization reads demo-health's audit log: %d %s", r.Status, r.Body)
	}
}

// keyID finds the id of key secret through GET /v1/api-keys (by its last four characters).
func keyID(t *testing.T, s *servertest.Server, admin, secret string) string {
	t.Helper()
	r := s.Do(http.MethodGet, "/v1/api-keys", admin, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /v1/api-keys: %d %s", r.Status, r.Body)
	}
	var list struct {
		Data []struct{ ID, Mode, Last4 string }
	}
	r.JSON(t, &list)
	for _, k := range list.Data {
		if k.Last4 == secret[len(secret)-4:] && strings.HasPrefix(secret, "chk_"+k.Mode+"_") {
			return k.ID
		}
	}
	t.Fatalf("key …%s not listed", secret[len(secret)-4:])
	return ""
}
