package authztest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/mux"

	"carehub/api/ws/wstest"
	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/storage/demo"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

// otherSlug is the tenant whose credentials must not reach demo-health's resources.
const otherSlug = "northwind-health"

// fixture holds the demo-health resources the rows name, and the credentials they use.
type fixture struct {
	t *testing.T
	s *servertest.Server

	org, project, agent, workflow, run, deployment, installation string
	asset, reviewAsset, webhook, delivery                        string
	patient, realPatient                                         string
	subscription                                                 string // a FHIR Subscription (websocket channel)

	keys  map[string]string // credential cache: "slug/mode/scopes" → secret
	jwts  map[string]string
	spare map[string]string
}

func newFixture(t *testing.T, s *servertest.Server) *fixture {
	f := &fixture{t: t, s: s, org: demo.DemoOrgID, patient: demo.DeterioratingPatientID, realPatient: demo.RealPatientID,
		keys: map[string]string{}, jwts: map[string]string{}, spare: map[string]string{}}
	one := func(query string, args ...any) string { return pgtest.Scalar[string](t, s.Pool(), query, args...) }
	f.project = one(`select id from projects where org_id = $1 and name = $2`, f.org, demo.SepsisProjectName)
	var sub struct{ ID string }
	if r := s.Do(http.MethodPost, "/fhir/R4/Subscription", s.DemoKey(), matrixSubscription(f)); r.Status != http.StatusCreated {
		t.Fatalf("fixture subscription: %d %s", r.Status, r.Body)
	} else {
		r.JSON(t, &sub)
	}
	f.subscription = sub.ID
	f.agent = one(`select id from agents where org_id = $1 and name = $2`, f.org, demo.Ward7AgentName)
	f.workflow = one(`select id from workflows where org_id = $1 and name = $2`, f.org, demo.DeteriorationWorkflowName)
	f.run = one(`select coalesce((select id from workflow_runs where org_id = $1 order by id limit 1), 'run_01jz00000000000000000000zz')`, f.org)
	f.installation = one(`select id from installations where org_id = $1 order by id limit 1`, f.org)
	f.deployment = one(`select coalesce((select id from deployments where org_id = $1 order by id limit 1), '')`, f.org)
	if f.deployment == "" {
		g := s.GraphQL(f.platformKey(), `mutation($i: ID!) { createDeployment(installationId: $i, environment: "staging") { id } }`,
			map[string]any{"i": f.installation})
		var data struct{ CreateDeployment struct{ ID string } }
		if len(g.Errors) > 0 || json.Unmarshal(g.Data, &data) != nil || data.CreateDeployment.ID == "" {
			t.Fatalf("fixture deployment: %+v %s", g.Errors, g.Data)
		}
		f.deployment = data.CreateDeployment.ID
	}
	f.asset = one(`select id from assets where status = 'APPROVED' order by id limit 1`)
	f.reviewAsset = one(`select coalesce((select id from assets where status = 'UNDER_REVIEW' order by id limit 1), $1)`, f.asset)
	f.webhook = one(`select coalesce((select id from webhooks where org_id = $1 order by id limit 1), '')`, f.org)
	if f.webhook == "" {
		f.webhook = f.spareWebhook(99)
	}
	f.delivery = one(`select coalesce((select id from webhook_deliveries where org_id = $1 order by id limit 1), 'dlv_01jz00000000000000000000zz')`, f.org)
	return f
}

// key returns a key of slug with exactly scopes.
func (f *fixture) key(slug, mode string, scopes ...string) string {
	id := slug + "/" + mode + "/" + strings.Join(scopes, ",")
	if k, ok := f.keys[id]; ok {
		return k
	}
	k := f.s.Key(slug, mode, scopes...)
	f.keys[id] = k
	return k
}

func (f *fixture) platformKey() string {
	if k, ok := f.keys["platform"]; ok {
		return k
	}
	f.keys["platform"] = f.s.PlatformKey()
	return f.keys["platform"]
}

// jwt returns a token exchanged for exactly scopes from a live demo-health key (or the platform
// key), or "" when the node does not serve the exchange.
func (f *fixture) jwt(platform bool, scopes ...string) string {
	id := strconv.FormatBool(platform) + strings.Join(scopes, ",")
	if tok, ok := f.jwts[id]; ok {
		return tok
	}
	key := f.key(demo.DemoOrgSlug, access.Live, scopes...)
	if platform {
		key = f.platformKey()
	}
	r := f.s.Do(http.MethodPost, "/v1/auth/token", key, map[string]any{"scope": nonNil(scopes)})
	if r.Status == http.StatusNotFound {
		return ""
	}
	if r.Status != http.StatusOK {
		f.t.Fatalf("token exchange for %v: %d %s", scopes, r.Status, r.Body)
	}
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	r.JSON(f.t, &tok)
	f.jwts[id] = tok.AccessToken
	return tok.AccessToken
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// spareKey is the i-th demo-health key made to be rotated, revoked or deleted.
func (f *fixture) spareKey(i int) string {
	id := "key" + strconv.Itoa(i)
	if k, ok := f.spare[id]; ok {
		return k
	}
	ck, err := postgres.NewAPIKeys(f.s.Pool()).Create(context.Background(), apikeys.NewKey{OrgID: f.org, Mode: access.Live, Name: "spare " + id})
	if err != nil {
		f.t.Fatal(err)
	}
	f.spare[id] = ck.ID
	return ck.ID
}

// spareWebhook is the i-th demo-health webhook made to be deleted.
func (f *fixture) spareWebhook(i int) string {
	id := "wh" + strconv.Itoa(i)
	if w, ok := f.spare[id]; ok {
		return w
	}
	g := f.s.GraphQL(f.platformKey(), `mutation($p: ID!) { createWebhook(projectId: $p, url: "https://93.184.215.14/spare", events: ["agent.*"]) { id } }`,
		map[string]any{"p": f.project})
	var data struct{ CreateWebhook struct{ ID string } }
	if len(g.Errors) > 0 || json.Unmarshal(g.Data, &data) != nil || data.CreateWebhook.ID == "" {
		f.t.Fatalf("spare webhook: %+v %s", g.Errors, g.Data)
	}
	f.spare[id] = data.CreateWebhook.ID
	return data.CreateWebhook.ID
}

// spareWorkflow is a demo-health workflow made to be archived.
func (f *fixture) spareWorkflow() string {
	if w, ok := f.spare["wf"]; ok {
		return w
	}
	g := f.s.GraphQL(f.platformKey(), `mutation($p: ID!) { createWorkflow(name: "spare", projectId: $p, steps: ["load_patient"]) { id } }`,
		map[string]any{"p": f.project})
	var data struct{ CreateWorkflow struct{ ID string } }
	if len(g.Errors) > 0 || json.Unmarshal(g.Data, &data) != nil || data.CreateWorkflow.ID == "" {
		f.t.Fatalf("spare workflow: %+v %s", g.Errors, g.Data)
	}
	f.spare["wf"] = data.CreateWorkflow.ID
	return data.CreateWorkflow.ID
}

// result is what a credential got: the HTTP status and the error codes (REST error.code,
// GraphQL extensions.code). A subscription refused at connection_init has status 401.
type result struct {
	status int
	codes  []string
	body   string
}

func (r result) denied() bool {
	return r.status == http.StatusUnauthorized || r.status == http.StatusForbidden ||
		slices.Contains(r.codes, "FORBIDDEN") || slices.Contains(r.codes, "UNAUTHENTICATED") ||
		slices.Contains(r.codes, "INSUFFICIENT_SCOPE") || slices.Contains(r.codes, "IP_NOT_ALLOWED")
}

func (r result) notFound() bool {
	return r.status == http.StatusNotFound || slices.Contains(r.codes, "NOT_FOUND")
}

func (r result) String() string {
	return strconv.Itoa(r.status) + " " + strings.Join(r.codes, ",") + " " + truncate(r.body, 400)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// exec runs row r's request with credential (may be "") against f's patient.
func (f *fixture) exec(r row, credential string) result {
	f.t.Helper()
	switch {
	case r.rest != nil:
		method, path, body := r.rest(f)
		return f.retry(func() result {
			resp := f.s.Do(method, path, credential, body)
			res := result{status: resp.Status, body: string(resp.Body)}
			res.codes = errorCodes(resp.Status, resp.Body)
			return res
		})
	case strings.HasPrefix(r.op, "subscription "):
		query, vars := r.gql(f)
		return f.subscribe(query, vars, credential)
	default:
		query, vars := r.gql(f)
		return f.retry(func() result {
			resp := f.s.Do(http.MethodPost, "/graphql", credential, map[string]any{"query": query, "variables": vars})
			res := result{status: resp.Status, body: string(resp.Body)}
			var g servertest.GraphQLResponse
			if json.Unmarshal(resp.Body, &g) == nil {
				for _, e := range g.Errors {
					res.codes = append(res.codes, e.Code())
				}
			}
			return res
		})
	}
}

// errorCodes reads carehub's error codes from a REST error envelope or, on the FHIR base, from an
// OperationOutcome's issue details.
func errorCodes(status int, body []byte) []string {
	if status < 400 {
		return nil
	}
	var e struct {
		Error struct{ Code string }
		Issue []struct {
			Details struct{ Coding []struct{ Code string } }
		}
	}
	if json.Unmarshal(body, &e) != nil {
		return nil
	}
	if e.Error.Code != "" {
		return []string{e.Error.Code}
	}
	var codes []string
	for _, is := range e.Issue {
		for _, c := range is.Details.Coding {
			codes = append(codes, c.Code)
		}
	}
	return codes
}

// retry repeats a call refused with 429 after its Retry-After.
func (f *fixture) retry(do func() result) result {
	for range 5 {
		res := do()
		if res.status != http.StatusTooManyRequests {
			return res
		}
		time.Sleep(time.Second)
	}
	f.t.Fatal("rate limited five times in a row")
	return result{}
}

// subscribe starts a subscription and reports how it was refused, if it was, within a moment.
func (f *fixture) subscribe(query string, vars map[string]any, credential string) result {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := "ws" + strings.TrimPrefix(f.s.URL, "http") + "/graphql"
	auth := ""
	if credential != "" {
		auth = "Bearer " + credential
	}
	c, err := wstest.Dial(ctx, url, auth)
	if err != nil {
		return result{status: http.StatusUnauthorized, codes: []string{"UNAUTHENTICATED"}, body: err.Error()}
	}
	defer c.Close()
	ch, err := c.Subscribe(ctx, "1", query, vars)
	if err != nil {
		f.t.Fatalf("subscribe: %v", err)
	}
	select {
	case _, open := <-ch:
		if open {
			return result{status: http.StatusOK}
		}
	case <-time.After(500 * time.Millisecond):
		return result{status: http.StatusOK} // still running: accepted
	}
	res := result{status: http.StatusOK}
	var oe *wstest.OperationError
	if err := c.Err("1"); errors.As(err, &oe) {
		res.body = oe.Error()
		for _, raw := range oe.Errors {
			var e struct{ Extensions struct{ Code string } }
			if json.Unmarshal(raw, &e) == nil {
				res.codes = append(res.codes, e.Extensions.Code)
			}
		}
	}
	return res
}

// served reports whether the node serves the row's operation.
func (f *fixture) served(r row) bool {
	if r.rest != nil {
		method, path, _ := r.rest(f)
		body := string(f.s.Do(method, path, "", nil).Body)
		// The router's own answers (api/server/errors.go), as opposed to a handler's.
		return !strings.Contains(body, "no such route") && !strings.Contains(body, "method not allowed on this route")
	}
	return served(f.s, http.MethodPost, "/graphql")
}

// TestAuthorizationMatrix runs every row with every credential variant that applies.
func TestAuthorizationMatrix(t *testing.T) {
	s := servertest.Start(t)
	t.Run("every route of the node has a row", func(t *testing.T) { checkNodeRoutes(t, s) })
	f := newFixture(t, s)
	for _, r := range rows {
		t.Run(r.op, func(t *testing.T) {
			f.t = t
			if !f.served(r) {
				t.Fatalf("%s has a row but is not served by the node", r.op)
			}
			demoSlug := demo.DemoOrgSlug

			// No credential.
			res := f.exec(r, "")
			if r.access == public_ {
				if res.denied() {
					t.Fatalf("public operation refused without a credential: %s", res)
				}
				return
			}
			if res.status != http.StatusUnauthorized {
				t.Errorf("no credential: %s, want 401", res)
			}

			// A credential lacking the row's (last) scope, with every other scope.
			if r.access == platform {
				if res := f.exec(r, f.key(demoSlug, access.Live, access.Scopes...)); !res.denied() && !res.notFound() {
					t.Errorf("a tenant key with every scope: %s, want FORBIDDEN", res)
				}
			} else if len(r.scopes) > 0 {
				missing := r.scopes[len(r.scopes)-1]
				var others []string
				for _, sc := range access.Scopes {
					if sc != missing {
						others = append(others, sc)
					}
				}
				res := f.exec(r, f.key(demoSlug, access.Live, others...))
				if !res.denied() || (r.rest != nil && (res.status != http.StatusForbidden || !slices.Contains(res.codes, "INSUFFICIENT_SCOPE"))) {
					t.Errorf("a key lacking %s: %s, want 403 INSUFFICIENT_SCOPE / FORBIDDEN", missing, res)
				}
			}

			// Another tenant's credential holding the scopes.
			if r.tenant && r.access != platform {
				if res := f.exec(r, f.key(otherSlug, access.Live, r.scopes...)); !res.notFound() {
					t.Errorf("%s's key on demo-health's resource: %s, want NOT_FOUND", otherSlug, res)
				}
			}

			// A test key on a real patient.
			if r.real {
				real := *f
				real.patient = f.realPatient
				if res := real.exec(r, f.key(demoSlug, access.Test, r.scopes...)); !res.notFound() {
					t.Errorf("a test key on a real patient: %s, want NOT_FOUND", res)
				}
			}

			// Credentials holding exactly the row's scopes: a key, then a JWT.
			key := f.key(demoSlug, access.Live, r.scopes...)
			if r.access == platform {
				key = f.platformKey()
			}
			if res := f.exec(r, key); res.denied() {
				t.Errorf("a key holding %v: %s, want it authorized", r.scopes, res)
			}
			if tok := f.jwt(r.access == platform, r.scopes...); tok != "" {
				res := f.exec(r, tok)
				switch {
				case r.keyOnly && (res.status != http.StatusForbidden || !slices.Contains(res.codes, "FORBIDDEN")):
					t.Errorf("a JWT on a key-only operation: %s, want 403 FORBIDDEN", res)
				case !r.keyOnly && res.denied():
					t.Errorf("a JWT holding %v: %s, want it authorized", r.scopes, res)
				}
			}

			// Another tenant's credential again, now that the owner was served: what a node
			// remembers of a resource (a project's organization) must not cross tenants either.
			if r.tenant && r.access != platform {
				if res := f.exec(r, f.key(otherSlug, access.Live, r.scopes...)); !res.notFound() {
					t.Errorf("%s's key on demo-health's resource after its owner's call: %s, want NOT_FOUND", otherSlug, res)
				}
			}
		})
	}
}

// infrastructure routes are not API operations: health, metrics, docs, the explorer; /graphql
// is covered field by field from the schema.
var infrastructure = []string{"/healthz", "/readyz", "/metrics", "/docs/errors", "/graphiql", "/graphiql/", "/graphql"}

// checkNodeRoutes walks the running node's router: every route it serves needs a row.
func checkNodeRoutes(t *testing.T, s *servertest.Server) {
	router := s.Router()
	if router == nil {
		t.Skip("the node's router is not a *mux.Router")
	}
	have := map[string]bool{}
	for _, r := range rows {
		have[r.op] = true
	}
	walked := 0
	err := router.Walk(func(route *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		tpl, err := route.GetPathTemplate()
		if err != nil || slices.Contains(infrastructure, tpl) {
			return nil
		}
		methods, _ := route.GetMethods()
		for _, m := range methods {
			walked++
			if !have[m+" "+tpl] {
				t.Errorf("the node serves %s %s, which has no row in the authorization matrix", m, tpl)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if walked == 0 {
		t.Fatal("walked no API route of the node")
	}
	t.Logf("%d routes of the node checked", walked)
}
