package rest_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/api/rest"
	"carehub/kernel/access"
	"carehub/kernel/ids"
	"carehub/kernel/whsig"
	"carehub/processors/webhooks"
	"carehub/storage/postgres/pgtest"
)

// TestMain (pgtest.Main) is in rest_test.go.

// webhookAPI is the webhook routes on a fresh database, behind a stand-in for the
// authentication middleware that maps bearer tokens to principals.
type webhookAPI struct {
	t       *testing.T
	url     string
	pool    *pgxpool.Pool
	orgID   string
	project string
	tokens  map[string]*access.Principal
}

func newWebhookAPI(t *testing.T, cfg webhooks.ServiceConfig) *webhookAPI {
	t.Helper()
	pool := pgtest.New(t)
	a := &webhookAPI{t: t, pool: pool, tokens: map[string]*access.Principal{}}
	a.orgID = a.org()
	a.project = a.projectOf(a.orgID)
	a.tokens["admin"] = &access.Principal{OrgID: a.orgID, Mode: access.Test, Scopes: []string{access.AdminOrg}}
	a.tokens["reader"] = &access.Principal{OrgID: a.orgID, Mode: access.Test, Scopes: []string{access.ExecAgents}}
	a.tokens["outsider"] = &access.Principal{OrgID: a.org(), Mode: access.Test, Scopes: []string{access.AdminOrg}}
	r := mux.NewRouter()
	r.Use(bearerTokens(a.tokens))
	svc := webhooks.NewService(pool, cfg)
	rest.WebhookRoutes(r, svc)
	rest.Mount(mux.NewRouter(), r, rest.Services{Webhooks: svc}) // the spec's list, GET /v1/webhooks
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	a.url = srv.URL
	return a
}

func (a *webhookAPI) org() string {
	id := ids.New(ids.Organization)
	if _, err := a.pool.Exec(context.Background(), `insert into organizations (id, name, slug, type, plan)
values ($1, 'o', $1, 'clinic', 'starter')`, id); err != nil {
		a.t.Fatal(err)
	}
	return id
}

func (a *webhookAPI) projectOf(org string) string {
	id := ids.New(ids.Project)
	if _, err := a.pool.Exec(context.Background(), `insert into projects (id, org_id, name) values ($1, $2, 'p')`, id, org); err != nil {
		a.t.Fatal(err)
	}
	return id
}

func (a *webhookAPI) do(method, path, token string, body any) response {
	a.t.Helper()
	ct := ""
	if body != nil {
		ct = "application/json"
	}
	return send(a.t, a.url, method, path, token, body, "Content-Type", ct)
}

func (a *webhookAPI) create(url string) webhooks.Subscription {
	a.t.Helper()
	r := a.do("POST", "/v1/webhooks", "admin", map[string]any{"projectId": a.project, "url": url, "events": []string{"agent.*"}})
	if r.status != http.StatusCreated {
		a.t.Fatalf("create: %d %s", r.status, r.body)
	}
	var sub webhooks.Subscription
	r.decode(a.t, &sub)
	return sub
}

func TestWebhookRoutesManageSubscriptions(t *testing.T) {
	a := newWebhookAPI(t, webhooks.ServiceConfig{AllowPrivate: true})
	sub := a.create("https://hooks.example.com/in")
	if !strings.HasPrefix(sub.Secret, "whsec_") || strings.Contains(sub.Secret, "…") || sub.Status != "active" {
		t.Fatalf("created %+v: want the full secret and status active", sub)
	}
	var raw map[string]any
	a.do("GET", "/v1/webhooks/"+sub.ID, "reader", nil).decode(t, &raw)
	for _, field := range []string{"id", "url", "events", "status", "secret", "failureCount", "lastDeliveredAt", "createdAt"} {
		if _, ok := raw[field]; !ok {
			t.Errorf("GET lacks the spec's Webhook field %q: %v", field, raw)
		}
	}
	if raw["secret"] != "whsec_…"+sub.Secret[len(sub.Secret)-4:] {
		t.Errorf("GET secret %v, want it masked", raw["secret"])
	}

	for _, tc := range []struct {
		name, method, path, token string
		body                      any
		status                    int
		code                      string
	}{
		{"misspelt events", "POST", "/v1/webhooks", "admin", `{"projectId":"` + a.project + `","url":"https://x.example","event":["a.b"]}`, 400, "INVALID_REQUEST"},
		{"not JSON", "POST", "/v1/webhooks", "admin", `{"projectId":`, 400, "INVALID_REQUEST"},
		{"no events", "POST", "/v1/webhooks", "admin", map[string]any{"projectId": a.project, "url": "https://x.example"}, 422, "VALIDATION_FAILED"},
		{"no project", "POST", "/v1/webhooks", "admin", map[string]any{"url": "https://x.example", "events": []string{"*"}}, 422, "VALIDATION_FAILED"},
		{"without admin:org", "POST", "/v1/webhooks", "reader", map[string]any{"projectId": a.project, "url": "https://x.example", "events": []string{"*"}}, 403, "INSUFFICIENT_SCOPE"},
		{"no credential", "POST", "/v1/webhooks", "", map[string]any{"projectId": a.project, "url": "https://x.example", "events": []string{"*"}}, 401, "UNAUTHORIZED"},
		{"another org's project", "POST", "/v1/webhooks", "outsider", map[string]any{"projectId": a.project, "url": "https://x.example", "events": []string{"*"}}, 404, "NOT_FOUND"},
		{"another org's webhook", "GET", "/v1/webhooks/" + sub.ID, "outsider", nil, 404, "NOT_FOUND"},
		{"patch another org's", "PATCH", "/v1/webhooks/" + sub.ID, "outsider", map[string]any{"status": "paused"}, 404, "NOT_FOUND"},
		{"patch bad status", "PATCH", "/v1/webhooks/" + sub.ID, "admin", map[string]any{"status": "failing"}, 422, "VALIDATION_FAILED"},
		{"patch empty events", "PATCH", "/v1/webhooks/" + sub.ID, "admin", map[string]any{"events": []string{}}, 422, "VALIDATION_FAILED"},
		{"rotate another org's", "POST", "/v1/webhooks/" + sub.ID + "/rotate-secret", "outsider", nil, 404, "NOT_FOUND"},
		{"delete another org's", "DELETE", "/v1/webhooks/" + sub.ID, "outsider", nil, 404, "NOT_FOUND"},
		{"deliveries bad limit", "GET", "/v1/webhooks/" + sub.ID + "/deliveries?limit=x", "admin", nil, 400, "INVALID_REQUEST"},
		{"deliveries limit too big", "GET", "/v1/webhooks/" + sub.ID + "/deliveries?limit=101", "admin", nil, 400, "INVALID_REQUEST"},
		{"deliveries bad status", "GET", "/v1/webhooks/" + sub.ID + "/deliveries?status=lost", "admin", nil, 400, "INVALID_REQUEST"},
		{"deliveries another org's", "GET", "/v1/webhooks/" + sub.ID + "/deliveries", "outsider", nil, 404, "NOT_FOUND"},
		{"recover bad since", "POST", "/v1/webhooks/" + sub.ID + "/recover", "admin", map[string]any{"since": "yesterday"}, 422, "VALIDATION_FAILED"},
		{"unknown delivery", "GET", "/v1/webhooks/deliveries/dlv_01jabcdefghjkmnpqrstvwxyz0", "admin", nil, 404, "NOT_FOUND"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := a.do(tc.method, tc.path, tc.token, tc.body)
			if r.status != tc.status || r.code(t) != tc.code {
				t.Errorf("%s %s: %d %s, want %d %s", tc.method, tc.path, r.status, r.body, tc.status, tc.code)
			}
		})
	}

	req, _ := http.NewRequest("POST", a.url+"/v1/webhooks", strings.NewReader(`projectId=x`))
	req.Header.Set("Authorization", "Bearer admin")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("form body: %v %v, want 415", resp.StatusCode, err)
	}

	r := a.do("PATCH", "/v1/webhooks/"+sub.ID, "admin", map[string]any{"status": "paused", "events": []string{"workflow.*"}})
	var patched webhooks.Subscription
	r.decode(t, &patched)
	if r.status != 200 || patched.Status != "paused" || len(patched.Events) != 1 || patched.Events[0] != "workflow.*" || strings.Count(patched.Secret, "…") != 1 {
		t.Errorf("PATCH: %d %s", r.status, r.body)
	}
	var rotated webhooks.Subscription
	r = a.do("POST", "/v1/webhooks/"+sub.ID+"/rotate-secret", "admin", nil)
	r.decode(t, &rotated)
	if r.status != 200 || rotated.Secret == sub.Secret || strings.Contains(rotated.Secret, "…") {
		t.Errorf("rotate: %d %s", r.status, r.body)
	}
	if r := a.do("DELETE", "/v1/webhooks/"+sub.ID, "admin", nil); r.status != http.StatusNoContent {
		t.Errorf("DELETE: %d %s", r.status, r.body)
	}
	if r := a.do("GET", "/v1/webhooks/"+sub.ID, "admin", nil); r.status != 404 {
		t.Errorf("GET after DELETE: %d", r.status)
	}
}

func TestWebhookRoutesDeliveries(t *testing.T) {
	a := newWebhookAPI(t, webhooks.ServiceConfig{AllowPrivate: true})
	sub := a.create("https://hooks.example.com/in")
	// Two failed deliveries, as the dispatcher leaves them after its last attempt.
	var dlv []string
	for i := range 2 {
		id := ids.New(ids.Delivery)
		dlv = append(dlv, id)
		if _, err := a.pool.Exec(context.Background(), `insert into webhook_deliveries
	(id, org_id, webhook_id, event_id, event_type, event_created_at, body, status, attempt_count, completed_at)
values ($1, $2, $3, $4, 'workflow.completed', now(), $5, 'failed', 8, now())`,
			id, a.orgID, sub.ID, ids.New(ids.Event), []byte(`{"event":"workflow.completed","n":`+string(rune('0'+i))+`}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := a.pool.Exec(context.Background(), `insert into webhook_attempts (id, delivery_id, webhook_id, org_id, status_code, latency_ms, error, response_body)
values ($1, $2, $3, $4, 500, 12, 'HTTP 500', 'oops')`, ids.New(ids.Attempt), id, sub.ID, a.orgID); err != nil {
			t.Fatal(err)
		}
	}

	var list struct {
		Data []webhooks.Delivery `json:"data"`
		Meta struct {
			NextOffset *int `json:"nextOffset"`
		} `json:"meta"`
	}
	r := a.do("GET", "/v1/webhooks/"+sub.ID+"/deliveries?status=failed&limit=1", "admin", nil)
	r.decode(t, &list)
	if r.status != 200 || len(list.Data) != 1 || list.Data[0].ID != dlv[1] || list.Meta.NextOffset == nil || *list.Meta.NextOffset != 1 {
		t.Fatalf("deliveries page 1: %d %s", r.status, r.body)
	}
	r = a.do("GET", "/v1/webhooks/"+sub.ID+"/deliveries?status=failed&limit=1&offset=1", "admin", nil)
	r.decode(t, &list)
	if len(list.Data) != 1 || list.Data[0].ID != dlv[0] {
		t.Errorf("deliveries page 2: %s", r.body)
	}
	if r := a.do("GET", "/v1/webhooks/"+sub.ID+"/deliveries", "reader", nil); r.status != 403 {
		t.Errorf("deliveries without admin:org: %d", r.status)
	}

	var view struct {
		webhooks.Delivery
		Body     json.RawMessage    `json:"body"`
		Attempts []webhooks.Attempt `json:"attempts"`
	}
	r = a.do("GET", "/v1/webhooks/deliveries/"+dlv[0], "admin", nil)
	r.decode(t, &view)
	if r.status != 200 || view.ID != dlv[0] || len(view.Attempts) != 1 || *view.Attempts[0].StatusCode != 500 ||
		*view.Attempts[0].ResponseBody != "oops" || !strings.Contains(string(view.Body), `"n":0`) {
		t.Errorf("delivery: %d %s", r.status, r.body)
	}
	if r := a.do("GET", "/v1/webhooks/deliveries/"+dlv[0], "outsider", nil); r.status != 404 {
		t.Errorf("another org's delivery: %d", r.status)
	}

	var redelivered webhooks.Delivery
	r = a.do("POST", "/v1/webhooks/deliveries/"+dlv[0]+"/redeliver", "admin", nil)
	r.decode(t, &redelivered)
	if r.status != http.StatusAccepted || redelivered.Status != "pending" || redelivered.NextAttemptAt == nil {
		t.Errorf("redeliver: %d %s", r.status, r.body)
	}
	var recovered struct {
		Recovered int `json:"recovered"`
	}
	r = a.do("POST", "/v1/webhooks/"+sub.ID+"/recover", "admin", map[string]string{"since": "2020-01-01T00:00:00Z"})
	r.decode(t, &recovered)
	if r.status != http.StatusAccepted || recovered.Recovered != 1 {
		t.Errorf("recover: %d %s, want 1 (the other was already pending)", r.status, r.body)
	}
	if r := a.do("POST", "/v1/webhooks/deliveries/"+dlv[1]+"/redeliver", "outsider", nil); r.status != 404 {
		t.Errorf("another org's redeliver: %d", r.status)
	}
}

func TestWebhookTestSend(t *testing.T) {
	var got *http.Request
	var gotBody []byte
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Clone(context.Background())
		gotBody, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusOK)
		w.Write([]byte("thanks"))
	}))
	defer receiver.Close()

	a := newWebhookAPI(t, webhooks.ServiceConfig{AllowPrivate: true})
	sub := a.create(receiver.URL)
	var res webhooks.TestResult
	r := a.do("POST", "/api/v1/webhooks/test", "admin", map[string]string{"webhookId": sub.ID})
	r.decode(t, &res)
	if r.status != 200 || !res.Success || res.StatusCode == nil || *res.StatusCode != 200 || *res.ResponseBody != "thanks" || res.Secret != "" {
		t.Fatalf("test send: %d %s", r.status, r.body)
	}
	if got == nil || !whsig.Verify(sub.Secret, got.Header.Get(whsig.HeaderID), got.Header.Get(whsig.HeaderTimestamp), gotBody, got.Header.Get(whsig.HeaderSignature)) {
		t.Fatal("the receiver got no request signed with the subscription's secret")
	}
	if res.Request.Body != string(gotBody) || res.Request.Headers["Webhook-Signature"] != got.Header.Get("webhook-signature") {
		t.Errorf("the answer does not show the request sent: %+v", res.Request)
	}
	var payload struct {
		Event   string         `json:"event"`
		Payload map[string]any `json:"payload"`
	}
	if err := json.Unmarshal(gotBody, &payload); err != nil || payload.Event != "workflow.run.completed" || len(payload.Payload) != 6 {
		t.Errorf("sample body %s", gotBody)
	}

	r = a.do("POST", "/api/v1/webhooks/test", "admin", map[string]string{"url": receiver.URL})
	r.decode(t, &res)
	if r.status != 200 || !strings.HasPrefix(res.Secret, "whsec_") ||
		!whsig.Verify(res.Secret, got.Header.Get(whsig.HeaderID), got.Header.Get(whsig.HeaderTimestamp), gotBody, got.Header.Get(whsig.HeaderSignature)) {
		t.Errorf("test send to a URL: %d %s: want a one-off secret that verifies the request", r.status, r.body)
	}
	for _, tc := range []struct {
		token string
		body  any
		want  int
	}{
		{"reader", map[string]string{"webhookId": sub.ID}, 403},
		{"outsider", map[string]string{"webhookId": sub.ID}, 404},
		{"admin", map[string]string{}, 422},
		{"admin", map[string]string{"url": "ftp://x"}, 422},
	} {
		if r := a.do("POST", "/api/v1/webhooks/test", tc.token, tc.body); r.status != tc.want {
			t.Errorf("test send %v as %s: %d %s, want %d", tc.body, tc.token, r.status, r.body, tc.want)
		}
	}

	// Without --webhooks-allow-private a loopback URL is refused before anything is sent.
	strict := newWebhookAPI(t, webhooks.ServiceConfig{})
	got = nil
	if r := strict.do("POST", "/api/v1/webhooks/test", "admin", map[string]string{"url": receiver.URL}); r.status != 422 || r.code(t) != "VALIDATION_FAILED" {
		t.Errorf("loopback test send without allow-private: %d %s", r.status, r.body)
	}
	if got != nil {
		t.Error("the loopback receiver was reached")
	}
}
