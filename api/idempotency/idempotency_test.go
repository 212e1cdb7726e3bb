package idempotency_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// node is a whole carehub node and the demo tenant's ids the tests use.
type node struct {
	*servertest.Server
	t       *testing.T
	project string
}

func start(t *testing.T) *node {
	s := servertest.Start(t)
	n := &node{Server: s, t: t}
	if err := s.Pool().QueryRow(context.Background(), `select id from projects where org_id = $1 and name = $2`,
		demo.DemoOrgID, demo.SepsisProjectName).Scan(&n.project); err != nil {
		t.Fatal(err)
	}
	return n
}

// call sends a request with a credential, Idempotency-Key headers (none, one or several) and a
// JSON body.
func (n *node) call(method, path, cred string, keys []string, body any) *servertest.Response {
	n.t.Helper()
	r, err := send(n.URL, method, path, cred, keys, body)
	if err != nil {
		n.t.Fatal(err)
	}
	return r
}

func send(base, method, path, cred string, keys []string, body any) (*servertest.Response, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(method, base+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+cred)
	req.Header.Set("Content-Type", "application/json")
	for _, k := range keys {
		req.Header.Add("Idempotency-Key", k)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	return &servertest.Response{Status: resp.StatusCode, Header: resp.Header, Body: rb}, nil
}

func (n *node) count(query string, args ...any) int {
	return pgtest.Scalar[int](n.t, n.Pool(), query, args...)
}

func errorCode(t *testing.T, r *servertest.Response) string {
	t.Helper()
	var e struct{ Error struct{ Code string } }
	r.JSON(t, &e)
	return e.Error.Code
}

func wantReplay(t *testing.T, r *servertest.Response, replayed bool) {
	t.Helper()
	if got := r.Header.Get("Idempotent-Replayed") == "true"; got != replayed {
		t.Errorf("Idempotent-Replayed: %q, want replayed %v (%d %s)", r.Header.Get("Idempotent-Replayed"), replayed, r.Status, r.Body)
	}
}

type webhook struct {
	ID, Secret string
}

func TestREST(t *testing.T) {
	n := start(t)
	admin := n.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg)
	create := func(url string) map[string]any {
		return map[string]any{"projectId": n.project, "url": url, "events": []string{"workflow.*"}}
	}
	webhooks := func() int { return n.count(`select count(*) from webhooks where project_id = $1`, n.project) }

	t.Run("SameKeyAndBodyReplays", func(t *testing.T) {
		before := webhooks()
		first := n.call("POST", "/v1/webhooks", admin, []string{"create-1"}, create("https://a.example/hook"))
		second := n.call("POST", "/v1/webhooks", admin, []string{"create-1"}, create("https://a.example/hook"))
		if first.Status != 201 || second.Status != 201 {
			t.Fatalf("statuses %d %s, %d %s", first.Status, first.Body, second.Status, second.Body)
		}
		wantReplay(t, first, false)
		wantReplay(t, second, true)
		if !bytes.Equal(first.Body, second.Body) || second.Header.Get("Content-Type") != "application/json" {
			t.Errorf("replay %s (%s), want %s", second.Body, second.Header.Get("Content-Type"), first.Body)
		}
		if got := webhooks() - before; got != 1 {
			t.Errorf("%d webhooks made by two calls with one key, want 1", got)
		}
		// Without a key, each call is a new webhook.
		n.call("POST", "/v1/webhooks", admin, nil, create("https://a.example/hook"))
		n.call("POST", "/v1/webhooks", admin, nil, create("https://a.example/hook"))
		if got := webhooks() - before; got != 3 {
			t.Errorf("%d webhooks after two more calls without a key, want 3", got)
		}
	})

	t.Run("DifferentBodyIsConflict", func(t *testing.T) {
		n.call("POST", "/v1/webhooks", admin, []string{"create-2"}, create("https://a.example/hook"))
		for name, r := range map[string]*servertest.Response{
			"body":   n.call("POST", "/v1/webhooks", admin, []string{"create-2"}, create("https://b.example/hook")),
			"path":   n.call("POST", "/api/v1/workflows/runs", admin, []string{"create-2"}, create("https://a.example/hook")),
			"method": n.call("PATCH", "/v1/webhooks/wh_01jz00000000000000000000zz", admin, []string{"create-2"}, create("https://a.example/hook")),
		} {
			if r.Status != http.StatusConflict || errorCode(t, r) != "CONFLICT" {
				t.Errorf("another %s with the key: %d %s, want 409 CONFLICT", name, r.Status, r.Body)
			}
		}
	})

	t.Run("KeysBelongToTheCredential", func(t *testing.T) {
		first := n.call("POST", "/v1/webhooks", admin, []string{"shared"}, create("https://a.example/hook"))
		var a webhook
		first.JSON(t, &a)
		// Another tenant with the same key and body: its own request (the project is not its
		// own), never the first tenant's answer and secret.
		outsider := n.Key("northwind-health", access.Live, access.AdminOrg)
		r := n.call("POST", "/v1/webhooks", outsider, []string{"shared"}, create("https://a.example/hook"))
		if r.Status != http.StatusNotFound || bytes.Contains(r.Body, []byte(a.Secret)) {
			t.Errorf("other tenant, same key and body: %d %s, want 404", r.Status, r.Body)
		}
		wantReplay(t, r, false)
		// Another key of the same tenant: its own webhook.
		r = n.call("POST", "/v1/webhooks", n.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg), []string{"shared"}, create("https://a.example/hook"))
		var b webhook
		r.JSON(t, &b)
		if r.Status != 201 || b.ID == a.ID {
			t.Errorf("another key of the tenant: %d %s, want a webhook of its own", r.Status, r.Body)
		}
	})

	t.Run("ClientErrorsAreKept", func(t *testing.T) {
		first := n.call("POST", "/v1/webhooks", admin, []string{"bad-url"}, create("ftp://a.example/hook"))
		second := n.call("POST", "/v1/webhooks", admin, []string{"bad-url"}, create("ftp://a.example/hook"))
		if first.Status != 422 || second.Status != 422 {
			t.Fatalf("statuses %d, %d; want 422 twice", first.Status, second.Status)
		}
		wantReplay(t, second, true)
	})

	t.Run("MalformedKeys", func(t *testing.T) {
		for name, keys := range map[string][]string{
			"256 characters": {strings.Repeat("k", 256)},
			"space":          {"two words"},
			"non-ASCII":      {"clé"},
			"tab":            {"a\tb"},
			"empty":          {""},
			"twice":          {"k1", "k2"},
		} {
			before := webhooks()
			r := n.call("POST", "/v1/webhooks", admin, keys, create("https://a.example/hook"))
			if r.Status != 400 || errorCode(t, r) != "INVALID_REQUEST" || !bytes.Contains(r.Body, []byte("Idempotency-Key")) {
				t.Errorf("%s: %d %s, want 400 INVALID_REQUEST naming Idempotency-Key", name, r.Status, r.Body)
			}
			if webhooks() != before {
				t.Errorf("%s: the refused request made a webhook", name)
			}
		}
		if r := n.call("POST", "/v1/webhooks", admin, []string{strings.Repeat("k", 255)}, create("https://a.example/hook")); r.Status != 201 {
			t.Errorf("255 characters: %d %s, want 201", r.Status, r.Body)
		}
	})

	t.Run("InProgressIsConflict", func(t *testing.T) {
		// The receiver holds the first test send until released; any later one (there must be
		// none) is answered at once.
		arrived, release := make(chan struct{}), make(chan struct{})
		var sends atomic.Int32
		receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if sends.Add(1) == 1 {
				close(arrived)
				<-release
			}
		}))
		defer receiver.Close()
		body := map[string]any{"url": receiver.URL + "/hook"}
		var first *servertest.Response
		var wg sync.WaitGroup
		wg.Go(func() { first = n.call("POST", "/api/v1/webhooks/test", admin, []string{"slow"}, body) })
		<-arrived
		r := n.call("POST", "/api/v1/webhooks/test", admin, []string{"slow"}, body)
		close(release)
		wg.Wait()
		if r.Status != http.StatusConflict || errorCode(t, r) != "CONFLICT" || r.Header.Get("Retry-After") == "" {
			t.Errorf("same key while the first runs: %d %s (Retry-After %q), want 409 with Retry-After", r.Status, r.Body, r.Header.Get("Retry-After"))
		}
		again := n.call("POST", "/api/v1/webhooks/test", admin, []string{"slow"}, body)
		if first.Status != 200 || again.Status != 200 || !bytes.Equal(first.Body, again.Body) {
			t.Errorf("first %d %s, after it %d %s: want the first answer replayed", first.Status, first.Body, again.Status, again.Body)
		}
		wantReplay(t, again, true)
		if n := sends.Load(); n != 1 {
			t.Errorf("%d test sends for three calls with one key, want 1", n)
		}
	})

	t.Run("ExpiredKeyRunsAgain", func(t *testing.T) {
		first := n.call("POST", "/v1/webhooks", admin, []string{"old"}, create("https://a.example/hook"))
		if _, err := n.Pool().Exec(context.Background(), `update idempotency_keys set created_at = now() - interval '24 hours 1 minute'`); err != nil {
			t.Fatal(err)
		}
		second := n.call("POST", "/v1/webhooks", admin, []string{"old"}, create("https://a.example/hook"))
		var a, b webhook
		first.JSON(t, &a)
		second.JSON(t, &b)
		if second.Status != 201 || a.ID == b.ID {
			t.Errorf("after 24 h: %d %s, want a new webhook", second.Status, second.Body)
		}
		wantReplay(t, second, false)
	})

	t.Run("APIKeySecretReplayedButNotStored", func(t *testing.T) {
		body := map[string]any{"name": "ci", "mode": "test", "scopes": []string{access.AdminOrg}}
		first := n.call("POST", "/v1/api-keys", admin, []string{"new-key"}, body)
		second := n.call("POST", "/v1/api-keys", admin, []string{"new-key"}, body)
		var a, b struct{ ID, Key string }
		first.JSON(t, &a)
		second.JSON(t, &b)
		if first.Status != 201 || a.Key == "" || a != b {
			t.Fatalf("create key twice: %d %s, %d %s", first.Status, first.Body, second.Status, second.Body)
		}
		wantReplay(t, second, true)
		if c := n.count(`select count(*) from api_keys where name = 'ci'`); c != 1 {
			t.Errorf("%d keys made, want 1", c)
		}
		if c := n.count(`select count(*) from idempotency_keys where position(convert_to($1, 'UTF8') in response) > 0`, a.Key); c != 0 {
			t.Error("the stored answer holds the API key in the clear")
		}
	})

	t.Run("TokenExchangeIgnoresKey", func(t *testing.T) {
		body := map[string]any{"scope": []string{"admin:org"}}
		first := n.call("POST", "/v1/auth/token", admin, []string{"token"}, body)
		second := n.call("POST", "/v1/auth/token", admin, []string{"token"}, body)
		if first.Status != 200 || second.Status != 200 || bytes.Equal(first.Body, second.Body) {
			t.Errorf("token exchange: %d, %d; want two fresh tokens", first.Status, second.Status)
		}
		wantReplay(t, second, false)
	})
}

// A replayed answer that carries patient data is audited with the patient's id, as the first
// answer was.
func TestReplayIsAudited(t *testing.T) {
	n := start(t)
	writer := n.Key(demo.DemoOrgSlug, access.Live, access.WritePatients, access.ReadPatients)
	admin := n.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg)
	patient := map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Okafor", "given": []any{"Ada"}}},
		"gender": "female", "birthDate": "1954-02-11"}
	first := n.call("POST", "/v1/patients", writer, []string{"patient-1"}, patient)
	second := n.call("POST", "/v1/patients", writer, []string{"patient-1"}, patient)
	var p struct{ ID string }
	first.JSON(t, &p)
	if first.Status != 201 || second.Status != 201 || !bytes.Equal(first.Body, second.Body) || p.ID == "" {
		t.Fatalf("create patient twice: %d %s, %d %s", first.Status, first.Body, second.Status, second.Body)
	}
	wantReplay(t, second, true)
	if c := n.count(`select count(*) from patients where name->0->>'family' = 'Okafor' and created_at > now() - interval '1 hour'`); c != 1 {
		t.Errorf("%d patients made, want 1", c)
	}
	servertest.Eventually(t, 30*time.Second, "two audit records of the call naming the patient", func() bool {
		r := n.Do(http.MethodGet, "/v1/audit?limit=100&operation="+url.QueryEscape("POST /v1/patients")+"&patientId="+p.ID, admin, nil)
		var page struct {
			Data []struct{ PatientIDs []string }
		}
		r.JSON(t, &page)
		named := 0
		for _, rec := range page.Data {
			if slices.Contains(rec.PatientIDs, p.ID) {
				named++
			}
		}
		return r.Status == 200 && named == 2
	})
}

type gqlResponse struct {
	Status int
	Header http.Header
	Data   struct {
		PublishEvent struct{ ID string }
	}
	Errors []struct {
		Extensions struct{ Code string }
	}
	Body string
}

func (n *node) graphql(cred, key, query string, vars map[string]any) gqlResponse {
	n.t.Helper()
	var keys []string
	if key != "" {
		keys = []string{key}
	}
	r := n.call("POST", "/graphql", cred, keys, map[string]any{"query": query, "variables": vars})
	out := gqlResponse{Status: r.Status, Header: r.Header, Body: string(r.Body)}
	if err := json.Unmarshal(r.Body, &out); err != nil {
		n.t.Fatalf("graphql %d %s: %v", r.Status, r.Body, err)
	}
	return out
}

const publish = `mutation($p: ID!, $t: String!) { publishEvent(projectId: $p, type: $t, payload: {n: 1}) { id type } }`

func TestGraphQLMutation(t *testing.T) {
	n := start(t)
	cred := n.Key(demo.DemoOrgSlug, access.Live, access.ExecWorkflows)
	typ := fmt.Sprintf("idem.graphql_%d", time.Now().UnixNano())
	events := func() int {
		return n.count(`select count(*) from outbox where value->>'type' = $1`, typ)
	}
	vars := map[string]any{"p": n.project, "t": typ}

	first := n.graphql(cred, "publish-1", publish, vars)
	second := n.graphql(cred, "publish-1", publish, vars)
	if first.Status != 200 || len(first.Errors) > 0 || first.Data.PublishEvent.ID == "" || second.Body != first.Body {
		t.Fatalf("publishEvent twice with one key: %s, then %s", first.Body, second.Body)
	}
	if second.Header.Get("Idempotent-Replayed") != "true" {
		t.Error("the second publishEvent was not marked replayed")
	}
	if c := events(); c != 1 {
		t.Errorf("%d events published by two calls with one key, want 1", c)
	}

	other := n.graphql(cred, "publish-1", publish, map[string]any{"p": n.project, "t": typ + "_other"})
	if other.Status != http.StatusConflict || len(other.Errors) != 1 || other.Errors[0].Extensions.Code != "CONFLICT" {
		t.Errorf("other variables with the key: %d %s, want 409 with a CONFLICT error", other.Status, other.Body)
	}
	bad := n.graphql(cred, strings.Repeat("k", 256), publish, vars)
	if bad.Status != http.StatusBadRequest || len(bad.Errors) != 1 || bad.Errors[0].Extensions.Code != "BAD_USER_INPUT" {
		t.Errorf("malformed key: %d %s, want 400 BAD_USER_INPUT", bad.Status, bad.Body)
	}
	if c := events(); c != 1 {
		t.Errorf("%d events after refused calls, want 1", c)
	}

	// Queries ignore the key: nothing to protect, nothing kept.
	q := `{ organizations { id } }`
	for range 2 {
		if r := n.graphql(cred, "publish-1", q, nil); r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("query with a used key: %d %s", r.Status, r.Body)
		}
	}
	// Without a key, two calls publish two events. They go straight to the events topic
	// (feed.Config.Producer), so the log is where all three show.
	n.graphql(cred, "", publish, vars)
	n.graphql(cred, "", publish, vars)
	logged := 0
	servertest.Eventually(t, 30*time.Second, "three events in GET /v1/events", func() bool {
		r := n.call("GET", "/v1/events?projectId="+n.project+"&type="+typ, cred, nil, nil)
		var page struct{ Data []struct{ ID string } }
		r.JSON(t, &page)
		logged = len(page.Data)
		return logged >= 3
	})
	if logged != 3 {
		t.Errorf("%d events after two calls without a key, want 3", logged)
	}
}
