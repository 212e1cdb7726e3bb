package auth

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/processors/audit"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

type api struct {
	url  string
	pool *pgxpool.Pool
	keys *postgres.APIKeys
	org  string
}

// newAPI serves the auth endpoints as the server mounts them: the JWKS in the open, the rest
// behind the authenticator.
func newAPI(t *testing.T) *api {
	t.Helper()
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	tokens := NewTokens(postgres.NewSigningKeys(pool))
	authn := NewAuthenticator(keys, tokens, AuthenticatorConfig{})
	h := NewHandlers(tokens, NewKeyAdmin(keys, authn), audit.NewService(postgres.NewAuditLog(pool)))
	root := mux.NewRouter()
	h.PublicRoutes(root)
	authed := root.NewRoute().Subrouter()
	authed.Use(authn.Middleware(nil))
	h.Routes(authed)
	srv := httptest.NewServer(root)
	t.Cleanup(srv.Close)
	return &api{url: srv.URL, pool: pool, keys: keys, org: pgtest.NewOrg(t, pool)}
}

func (a *api) key(t *testing.T, org, mode string, scopes ...string) *apikeys.CreatedKey {
	return pgtest.NewKey(t, a.keys, apikeys.NewKey{OrgID: org, Mode: mode, Scopes: scopes})
}

func (a *api) call(t *testing.T, method, path, key, contentType, body string) call {
	t.Helper()
	return do(t, method, a.url+path, key, contentType, body)
}

func wantError(t *testing.T, c call, status int, code string) {
	t.Helper()
	if c.status != status || errorCode(t, []byte(c.body)) != code {
		t.Fatalf("got %d %s, want %d %s", c.status, c.body, status, code)
	}
}

func TestTokenEndpoint(t *testing.T) {
	a := newAPI(t)
	key := a.key(t, a.org, access.Live, access.ReadPatients, access.ExecAgents)
	const ct = "application/json"

	c := a.call(t, http.MethodPost, "/v1/auth/token", key.Secret, ct, `{"scope":["read:patients"]}`)
	if c.status != http.StatusOK || c.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("exchange: %d %v %s", c.status, c.header, c.body)
	}
	var tok map[string]any
	if err := json.Unmarshal([]byte(c.body), &tok); err != nil {
		t.Fatal(err)
	}
	if len(tok) != 5 || tok["token_type"] != "Bearer" || tok["expires_in"] != float64(3600) || tok["scope"] != "read:patients" {
		t.Fatalf("token response %v: want exactly access_token, token_type, expires_in, scope, issued_at", tok)
	}
	if at, err := time.Parse(time.RFC3339, tok["issued_at"].(string)); err != nil || time.Since(at) > time.Minute || !strings.HasSuffix(tok["issued_at"].(string), "Z") {
		t.Fatalf("issued_at %v", tok["issued_at"])
	}
	jwt := tok["access_token"].(string)

	// The token authenticates like a key and carries only its scopes.
	wantError(t, a.call(t, http.MethodGet, "/v1/api-keys", jwt, "", ""), http.StatusForbidden, "INSUFFICIENT_SCOPE")
	// A token cannot be exchanged.
	wantError(t, a.call(t, http.MethodPost, "/v1/auth/token", jwt, ct, `{"scope":["read:patients"]}`), http.StatusForbidden, "FORBIDDEN")

	for _, tc := range []struct {
		name, key, ct, body string
		status              int
		code                string
	}{
		{"scope the key lacks", key.Secret, ct, `{"scope":["read:patients","admin:org"]}`, 403, "INSUFFICIENT_SCOPE"},
		{"unknown scope", key.Secret, ct, `{"scope":["read:all"]}`, 422, "VALIDATION_FAILED"},
		{"no scope", key.Secret, ct, `{}`, 422, "VALIDATION_FAILED"},
		{"scope as a string", key.Secret, ct, `{"scope":"read:patients"}`, 422, "VALIDATION_FAILED"},
		{"malformed JSON", key.Secret, ct, `{"scope":[`, 400, "INVALID_REQUEST"},
		{"empty body", key.Secret, ct, ``, 400, "INVALID_REQUEST"},
		{"form body", key.Secret, "application/x-www-form-urlencoded", `scope=read:patients`, 415, "UNSUPPORTED_MEDIA_TYPE"},
		{"no credential", "", ct, `{"scope":[]}`, 401, "UNAUTHORIZED"},
		{"bad credential", otherKey(key.Secret), ct, `{"scope":[]}`, 401, "UNAUTHORIZED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantError(t, a.call(t, http.MethodPost, "/v1/auth/token", tc.key, tc.ct, tc.body), tc.status, tc.code)
		})
	}

	c = a.call(t, http.MethodGet, "/.well-known/jwks.json", "", "", "")
	var set JWKSet
	if c.status != http.StatusOK || json.Unmarshal([]byte(c.body), &set) != nil || len(set.Keys) != 1 || set.Keys[0].Kid != kidOf(t, jwt) {
		t.Fatalf("JWKS without a credential: %d %s", c.status, c.body)
	}
}

func TestAPIKeysEndpoints(t *testing.T) {
	a := newAPI(t)
	admin := a.key(t, a.org, access.Live, access.AdminOrg, access.ReadPatients)
	otherOrg := pgtest.NewOrg(t, a.pool)
	outsider := a.key(t, otherOrg, access.Live, access.AdminOrg, access.ReadPatients)
	reader := a.key(t, a.org, access.Live, access.ReadPatients)
	const ct = "application/json"

	c := a.call(t, http.MethodPost, "/v1/api-keys", admin.Secret, ct, `{"name":"ci","mode":"test","scopes":["read:patients"],"ipAllowlist":["127.0.0.1"]}`)
	if c.status != http.StatusCreated {
		t.Fatalf("create: %d %s", c.status, c.body)
	}
	var created apikeys.CreatedKey
	if err := json.Unmarshal([]byte(c.body), &created); err != nil || !apikeys.WellFormedKey(created.Secret) || created.OrgID != a.org ||
		created.Mode != access.Test || created.Masked != apikeys.TestPrefix+"…"+created.Secret[len(created.Secret)-4:] {
		t.Fatalf("created %+v (%v) from %s", created, err, c.body)
	}
	if c := a.call(t, http.MethodGet, "/v1/api-keys", created.Secret, "", ""); c.status != http.StatusForbidden {
		t.Fatalf("the new key (no admin:org) listing keys: %d, want 403", c.status)
	}

	c = a.call(t, http.MethodGet, "/v1/api-keys", admin.Secret, "", "")
	var list struct{ Data []apikeys.Key }
	if c.status != http.StatusOK || json.Unmarshal([]byte(c.body), &list) != nil || len(list.Data) != 3 {
		t.Fatalf("list: %d %s", c.status, c.body)
	}
	for _, secret := range []string{created.Secret, admin.Secret, reader.Secret} {
		if strings.Contains(c.body, secret[len(apikeys.TestPrefix):]) {
			t.Fatal("the listing contains a key's secret")
		}
	}
	if strings.Contains(c.body, outsider.ID) {
		t.Fatal("the listing shows another organization's key")
	}

	for _, tc := range []struct {
		name, method, path, key, body string
		status                        int
		code                          string
	}{
		{"without admin:org", http.MethodGet, "/v1/api-keys", reader.Secret, "", 403, "INSUFFICIENT_SCOPE"},
		{"scope the caller lacks", http.MethodPost, "/v1/api-keys", admin.Secret, `{"mode":"live","scopes":["exec:agents"]}`, 403, "INSUFFICIENT_SCOPE"},
		{"unknown field", http.MethodPost, "/v1/api-keys", admin.Secret, `{"mode":"live","scopez":[]}`, 400, "INVALID_REQUEST"},
		{"bad mode", http.MethodPost, "/v1/api-keys", admin.Secret, `{"mode":"prod"}`, 422, "VALIDATION_FAILED"},
		{"another org", http.MethodPost, "/v1/api-keys", admin.Secret, `{"mode":"live","orgId":"` + otherOrg + `"}`, 404, "NOT_FOUND"},
		{"get across tenants", http.MethodGet, "/v1/api-keys/" + admin.ID, outsider.Secret, "", 404, "NOT_FOUND"},
		{"rotate across tenants", http.MethodPost, "/v1/api-keys/" + admin.ID + "/rotate", outsider.Secret, "", 404, "NOT_FOUND"},
		{"revoke across tenants", http.MethodPost, "/v1/api-keys/" + admin.ID + "/revoke", outsider.Secret, "", 404, "NOT_FOUND"},
		{"delete across tenants", http.MethodDelete, "/v1/api-keys/" + admin.ID, outsider.Secret, "", 404, "NOT_FOUND"},
		{"unknown id", http.MethodGet, "/v1/api-keys/key_nope", admin.Secret, "", 404, "NOT_FOUND"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctype := ""
			if tc.body != "" {
				ctype = ct
			}
			wantError(t, a.call(t, tc.method, tc.path, tc.key, ctype, tc.body), tc.status, tc.code)
		})
	}
	if c := a.call(t, http.MethodGet, "/v1/api-keys/"+admin.ID, admin.Secret, "", ""); c.status != http.StatusOK || !strings.Contains(c.body, `"masked"`) {
		t.Fatalf("get own key: %d %s", c.status, c.body)
	}

	// A JWT may list keys but not mint them.
	c = a.call(t, http.MethodPost, "/v1/auth/token", admin.Secret, ct, `{"scope":["admin:org","read:patients"]}`)
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	if err := json.Unmarshal([]byte(c.body), &tok); err != nil || tok.AccessToken == "" {
		t.Fatalf("exchange: %d %s", c.status, c.body)
	}
	if c := a.call(t, http.MethodGet, "/v1/api-keys", tok.AccessToken, "", ""); c.status != http.StatusOK {
		t.Fatalf("listing keys with a JWT: %d %s", c.status, c.body)
	}
	wantError(t, a.call(t, http.MethodPost, "/v1/api-keys", tok.AccessToken, ct, `{"mode":"live"}`), 403, "FORBIDDEN")
	wantError(t, a.call(t, http.MethodPost, "/v1/api-keys/"+created.ID+"/rotate", tok.AccessToken, "", ""), 403, "FORBIDDEN")

	// A test-mode admin manages test keys only.
	testAdmin := a.key(t, a.org, access.Test, access.AdminOrg, access.ReadPatients)
	wantError(t, a.call(t, http.MethodPost, "/v1/api-keys", testAdmin.Secret, ct, `{"mode":"live"}`), 403, "FORBIDDEN")
	wantError(t, a.call(t, http.MethodPost, "/v1/api-keys/"+reader.ID+"/revoke", testAdmin.Secret, "", ""), 403, "FORBIDDEN")

	// Rotation: a new secret; the old one keeps working during the grace period.
	c = a.call(t, http.MethodPost, "/v1/api-keys/"+reader.ID+"/rotate", admin.Secret, "", "")
	var rotated apikeys.CreatedKey
	if c.status != http.StatusCreated || json.Unmarshal([]byte(c.body), &rotated) != nil || rotated.Secret == reader.Secret || rotated.ID == reader.ID {
		t.Fatalf("rotate: %d %s", c.status, c.body)
	}
	for _, k := range []string{reader.Secret, rotated.Secret} {
		if c := a.call(t, http.MethodPost, "/v1/auth/token", k, ct, `{"scope":["read:patients"]}`); c.status != http.StatusOK {
			t.Fatalf("key after rotation: %d %s", c.status, c.body)
		}
	}
	if c := a.call(t, http.MethodGet, "/v1/api-keys/"+reader.ID, admin.Secret, "", ""); !strings.Contains(c.body, `"status":"rotated"`) || !strings.Contains(c.body, rotated.ID) {
		t.Fatalf("rotated key: %s", c.body)
	}
	wantError(t, a.call(t, http.MethodPost, "/v1/api-keys/"+reader.ID+"/rotate", admin.Secret, "", ""), 409, "CONFLICT")
	// Rotating a key with scopes the caller lacks would hand it that key's secret.
	broad := a.key(t, a.org, access.Live, access.ExecAgents)
	wantError(t, a.call(t, http.MethodPost, "/v1/api-keys/"+broad.ID+"/rotate", admin.Secret, "", ""), 403, "INSUFFICIENT_SCOPE")

	// Revocation takes effect at once on this node.
	c = a.call(t, http.MethodDelete, "/v1/api-keys/"+rotated.ID, admin.Secret, "", "")
	if c.status != http.StatusOK || !strings.Contains(c.body, `"status":"revoked"`) {
		t.Fatalf("revoke: %d %s", c.status, c.body)
	}
	wantError(t, a.call(t, http.MethodPost, "/v1/auth/token", rotated.Secret, ct, `{"scope":[]}`), 401, "UNAUTHORIZED")
	if c := a.call(t, http.MethodPost, "/v1/api-keys/"+rotated.ID+"/revoke", admin.Secret, "", ""); c.status != http.StatusOK {
		t.Fatalf("revoking twice: %d %s", c.status, c.body)
	}
}

func TestAuditEndpoint(t *testing.T) {
	a := newAPI(t)
	admin := a.key(t, a.org, access.Live, access.AdminOrg)
	reader := a.key(t, a.org, access.Live, access.ReadPatients)
	c := a.call(t, http.MethodGet, "/v1/audit?limit=10&patientId=pat_1&from=2024-01-01T00:00:00Z", admin.Secret, "", "")
	if c.status != http.StatusOK || strings.TrimSpace(c.body) != `{"data":[],"meta":{"total":0,"cursor":null}}` {
		t.Fatalf("audit: %d %s", c.status, c.body)
	}
	wantError(t, a.call(t, http.MethodGet, "/v1/audit", reader.Secret, "", ""), 403, "INSUFFICIENT_SCOPE")
	wantError(t, a.call(t, http.MethodGet, "/v1/audit", "", "", ""), 401, "UNAUTHORIZED")
	for _, q := range []string{"from=yesterday", "to=1", "to=", "limit=0", "limit=1001", "limit=x", "cursor=zz", "limit=1&limit=2"} {
		wantError(t, a.call(t, http.MethodGet, "/v1/audit?"+q, admin.Secret, "", ""), 400, "INVALID_REQUEST")
	}
	// Each parameter is well-formed; together they name no time: a rule beyond the document.
	wantError(t, a.call(t, http.MethodGet, "/v1/audit?from=2024-02-01T00:00:00Z&to=2024-01-01T00:00:00Z", admin.Secret, "", ""),
		422, "VALIDATION_FAILED")
}
