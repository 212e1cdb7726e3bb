package auth

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"carehub/api/envelope"
	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

func TestLimiter(t *testing.T) {
	clk := newClock()
	l := newLimiter(Rate{PerSecond: 10, Burst: 3}, 100)
	for i, want := range []bool{true, true, true, false, false} {
		d := l.take("k", clk.now())
		if d.allowed != want {
			t.Fatalf("request %d: allowed=%v, want %v", i, d.allowed, want)
		}
		if d.limit != 3 || d.remaining != max(0, 2-i) {
			t.Fatalf("request %d: limit %d remaining %d", i, d.limit, d.remaining)
		}
		if !want && (d.retryAfter <= 0 || d.retryAfter > 100*time.Millisecond) {
			t.Fatalf("request %d: retry after %s, want (0, 100ms]", i, d.retryAfter)
		}
	}
	if d := l.take("other", clk.now()); !d.allowed {
		t.Fatal("one credential's bucket limited another")
	}
	clk.add(100 * time.Millisecond) // one token back
	if d := l.take("k", clk.now()); !d.allowed || d.remaining != 0 {
		t.Fatalf("after refilling one token: %+v", d)
	}
	clk.add(time.Hour) // refill caps at the burst
	d := l.take("k", clk.now())
	if d.remaining != 2 || d.reset != 100*time.Millisecond {
		t.Fatalf("after an hour: %+v, want remaining 2, reset 100ms", d)
	}
}

func TestLimiterMemoryBounded(t *testing.T) {
	clk := newClock()
	l := newLimiter(Rate{PerSecond: 1, Burst: 10}, 1000)
	for i := range 10_000 {
		l.take("k"+strconv.Itoa(i), clk.now())
		if len(l.buckets) > 1000 {
			t.Fatalf("%d buckets after %d credentials, bound 1000", len(l.buckets), i+1)
		}
	}
	// A busy credential is not evicted for idle ones while refilled buckets exist.
	clk.add(20 * time.Second)
	for range 10 {
		l.take("busy", clk.now())
	}
	for i := range 500 {
		l.take("new"+strconv.Itoa(i), clk.now())
	}
	if d := l.take("busy", clk.now()); d.allowed {
		t.Fatal("the busy credential's empty bucket was evicted and refilled")
	}
}

func TestDecisionHeaders(t *testing.T) {
	h := http.Header{}
	decision{allowed: false, limit: 100, remaining: 0, reset: 1500 * time.Millisecond, retryAfter: 20 * time.Millisecond}.setHeaders(h)
	want := map[string]string{"RateLimit-Limit": "100", "RateLimit-Remaining": "0", "RateLimit-Reset": "2", "Retry-After": "1"}
	for k, v := range want {
		if h.Get(k) != v {
			t.Errorf("%s = %q, want %q", k, h.Get(k), v)
		}
	}
	h = http.Header{}
	decision{allowed: true, limit: 100, remaining: 99}.setHeaders(h)
	if h.Get("Retry-After") != "" || h.Get("RateLimit-Reset") != "0" {
		t.Errorf("admitted request headers %v", h)
	}
}

// stack serves handler behind the authenticator's middleware and returns its URL.
func stack(t *testing.T, a *Authenticator, handler http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(a.Middleware(nil)(handler))
	t.Cleanup(srv.Close)
	return srv.URL
}

func get(t *testing.T, method, url, key string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func errorCode(t *testing.T, body []byte) string {
	t.Helper()
	var e envelope.ErrorBody
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("not an error envelope: %s", body)
	}
	return e.Error.Code
}

func TestMiddleware(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	clk := newClock()
	a := NewAuthenticator(keys, nil, AuthenticatorConfig{Clock: clk.now, Limits: Limits{
		Default: Rate{PerSecond: 1, Burst: 2}, Ingest: Rate{PerSecond: 1, Burst: 4}}})
	org := pgtest.NewOrg(t, pool)
	ck := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Test, Scopes: []string{access.ReadPatients}})
	fenced := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Test, IPAllowlist: []string{"203.0.113.0/24"}})
	url := stack(t, a, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := access.From(r.Context())
		if p == nil { // the WebSocket upgrade, let through for its handler to authenticate
			w.WriteHeader(http.StatusSwitchingProtocols)
			return
		}
		envelope.WriteJSON(w, http.StatusOK, map[string]string{"keyId": p.KeyID, "ip": p.ClientIP})
	}))

	resp, body := get(t, http.MethodGet, url+"/v1/organizations", "")
	if resp.StatusCode != http.StatusUnauthorized || errorCode(t, body) != "UNAUTHORIZED" || resp.Header.Get("WWW-Authenticate") == "" {
		t.Fatalf("no credential: %d %s", resp.StatusCode, body)
	}
	resp, body = get(t, http.MethodGet, url+"/v1/organizations", fenced.Secret)
	if resp.StatusCode != http.StatusForbidden || errorCode(t, body) != "IP_NOT_ALLOWED" {
		t.Fatalf("from outside the allowlist: %d %s", resp.StatusCode, body)
	}

	for i := range 2 {
		resp, body = get(t, http.MethodGet, url+"/v1/organizations", ck.Secret)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), ck.ID) || !strings.Contains(string(body), `"ip":"127.0.0.1"`) {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		if resp.Header.Get("RateLimit-Limit") != "2" || resp.Header.Get("RateLimit-Remaining") != strconv.Itoa(1-i) || resp.Header.Get("RateLimit-Reset") == "" {
			t.Fatalf("request %d: headers %v", i, resp.Header)
		}
	}
	resp, body = get(t, http.MethodGet, url+"/v1/organizations", ck.Secret)
	if resp.StatusCode != http.StatusTooManyRequests || errorCode(t, body) != "RATE_LIMITED" || resp.Header.Get("Retry-After") != "1" ||
		resp.Header.Get("RateLimit-Remaining") != "0" || resp.Header.Get("RateLimit-Limit") != "2" {
		t.Fatalf("over the limit: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	// Ingest has buckets of its own.
	resp, _ = get(t, http.MethodPost, url+"/v1/observations", ck.Secret)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("RateLimit-Limit") != "4" {
		t.Fatalf("ingest while the default class is exhausted: %d %v", resp.StatusCode, resp.Header)
	}
	clk.add(time.Second)
	if resp, _ = get(t, http.MethodGet, url+"/v1/organizations", ck.Secret); resp.StatusCode != http.StatusOK {
		t.Fatalf("after a second's refill: %d", resp.StatusCode)
	}

	// Subscription upgrades authenticate inside the WebSocket protocol, not here.
	req, _ := http.NewRequest(http.MethodGet, url+"/graphql", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	if r, err := http.DefaultClient.Do(req); err != nil || r.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("websocket upgrade: %v %v", r, err)
	}
	// Elsewhere an Upgrade header changes nothing.
	req, _ = http.NewRequest(http.MethodGet, url+"/v1/organizations", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	if r, err := http.DefaultClient.Do(req); err != nil || r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("upgrade header on a REST route: %v %v", r, err)
	}
}

func TestLimitBody(t *testing.T) {
	var got int
	read := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			envelope.WriteError(w, r, err)
			return
		}
		got = len(b)
		w.WriteHeader(http.StatusNoContent)
	})
	outer := LimitBody(10)
	srv := httptest.NewServer(outer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			LimitBody(20)(read).ServeHTTP(w, r)
			return
		}
		read.ServeHTTP(w, r)
	})))
	defer srv.Close()
	post := func(path string, n int, chunked bool) (int, string) {
		var body io.Reader = strings.NewReader(strings.Repeat("x", n))
		if chunked {
			body = io.MultiReader(body) // unknown length: sent chunked
		}
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		code := ""
		if resp.StatusCode >= 400 {
			code = errorCode(t, b)
		}
		return resp.StatusCode, code
	}
	for _, tc := range []struct {
		path    string
		n       int
		chunked bool
		status  int
	}{
		{"/", 10, false, http.StatusNoContent},
		{"/", 11, false, http.StatusRequestEntityTooLarge},
		{"/", 11, true, http.StatusRequestEntityTooLarge},
		{"/big", 20, true, http.StatusNoContent},
		{"/big", 21, false, http.StatusRequestEntityTooLarge},
		{"/big", 21, true, http.StatusRequestEntityTooLarge},
	} {
		got = -1
		status, code := post(tc.path, tc.n, tc.chunked)
		if status != tc.status || (status == http.StatusRequestEntityTooLarge && code != "PAYLOAD_TOO_LARGE") {
			t.Errorf("%s with %d bytes (chunked %v): %d %s, want %d", tc.path, tc.n, tc.chunked, status, code, tc.status)
		}
		if status == http.StatusNoContent && got != tc.n {
			t.Errorf("%s: handler read %d bytes, want %d", tc.path, got, tc.n)
		}
	}
}

func TestTrustedProxies(t *testing.T) {
	f, err := TrustedProxies([]string{"10.0.0.0/8", "2001:db8::1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		peer, xff, want string
	}{
		{"203.0.113.5:1234", "198.51.100.1", "203.0.113.5"},                  // untrusted peer: header ignored
		{"10.1.1.1:1234", "198.51.100.1", "198.51.100.1"},                    // one trusted proxy
		{"10.1.1.1:1234", "6.6.6.6, 198.51.100.1, 10.2.2.2", "198.51.100.1"}, // chain: right-most untrusted
		{"[2001:db8::1]:443", "2001:db8:5::9", "2001:db8:5::9"},
		{"[::ffff:10.1.1.1]:80", "::ffff:198.51.100.1", "198.51.100.1"}, // mapped forms unmapped
		{"10.1.1.1:1234", "", "10.1.1.1"},
		{"10.1.1.1:1234", "garbage, 198.51.100.1", "198.51.100.1"},
		{"10.1.1.1:1234", "198.51.100.1, garbage", "10.1.1.1"},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = tc.peer
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		if got := f(r); got != netip.MustParseAddr(tc.want) {
			t.Errorf("peer %s, X-Forwarded-For %q: %s, want %s", tc.peer, tc.xff, got, tc.want)
		}
	}
	if _, err := TrustedProxies([]string{"not-an-ip"}); err == nil {
		t.Fatal("a bad proxy address was accepted")
	}
}

func TestGraphQLOperation(t *testing.T) {
	for _, tc := range []struct{ query, name, want string }{
		{`{ patient(id: "pat_1") { id name } }`, "", "graphql query patient"},
		{`query { patients(limit: 5) { id observations { id } } organizations { id } }`, "", "graphql query organizations,patients"},
		{`query Q($id: ID! = "x") @cached { p: patient(id: $id) { id } q: patient(id: "b") { id } }`, "", "graphql query patient"},
		{`mutation Run { runAgent(agentId: "agt_1", patientId: "pat_1", input: {note: "}{"}) { id } }`, "", "graphql mutation runAgent"},
		{`subscription { eventStream(projectId: "prj_1", types: ["a.b"]) { id } }`, "", "graphql subscription eventStream"},
		{"query A { agents(projectId: \"p\") { id } }\nmutation B { createAgent(name: \"n\", projectId: \"p\") { id } }", "B", "graphql mutation createAgent"},
		{`query A { a } query B { b }`, "", unparsedOperation},
		{`query A { a }`, "C", unparsedOperation},
		{`{ ...Root ... on Query { patients { id } } } fragment Root on Query { organization(id: "o") { id } ...More } fragment More on Query { __typename events(projectId: "p") { id } }`, "", "graphql query events,organization,patients"},
		{`{ __typename }`, "", "graphql query __typename"},
		{`{ __schema { types { name } } }`, "", "graphql query __schema"},
		{`# comment {
		  { assets(badges: ["""block "" }"""]) { id } }`, "", "graphql query assets"},
		{`{ patient(id: "pat_1") { id }`, "", unparsedOperation},
		{`not graphql`, "", unparsedOperation},
		{``, "", unparsedOperation},
	} {
		if got := GraphQLOperation(tc.query, tc.name); got != tc.want {
			t.Errorf("GraphQLOperation(%q, %q) = %q, want %q", tc.query, tc.name, got, tc.want)
		}
	}
}

func TestGraphQLOutcome(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"data":{"patient":{"id":"p"}}}`, "success"},
		{`{"data":null,"errors":[{"message":"m","extensions":{"code":"FORBIDDEN"}}]}`, "denied"},
		{`{"data":null,"errors":[{"message":"m","extensions":{"code":"NOT_FOUND"}}]}`, "error"},
		{`{"data":{"a":1,"b":null},"errors":[{"message":"m","extensions":{"code":"INTERNAL"}}]}`, "success"},
		{`garbage`, "success"},
	} {
		if got := graphQLOutcome([]byte(tc.body)); got != tc.want {
			t.Errorf("graphQLOutcome(%s) = %s, want %s", tc.body, got, tc.want)
		}
	}
}

// An organization's keys share its rate: a tenant that makes more keys gets no more of the node,
// and another organization's keys are not slowed by it.
func TestMiddlewareOrganizationRate(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	clk := newClock()
	a := NewAuthenticator(keys, nil, AuthenticatorConfig{Clock: clk.now, Limits: Limits{
		Default: Rate{PerSecond: 1, Burst: 2}, OrgDefault: Rate{PerSecond: 2, Burst: 3}}})
	org, other := pgtest.NewOrg(t, pool), pgtest.NewOrg(t, pool)
	url := stack(t, a, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		envelope.WriteJSON(w, http.StatusOK, map[string]string{})
	}))
	var secrets []string
	for range 3 {
		secrets = append(secrets, pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live}).Secret)
	}
	for i, want := range []int{200, 200, 200, 429} { // three of the organization's keys, one request each, then a fourth
		resp, body := get(t, http.MethodGet, url+"/v1/organizations", secrets[i%3])
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		if want == 429 && (errorCode(t, body) != "RATE_LIMITED" || !strings.Contains(string(body), "organization") ||
			resp.Header.Get("Retry-After") != "1" || resp.Header.Get("RateLimit-Limit") != "3" || resp.Header.Get("RateLimit-Remaining") != "0") {
			t.Fatalf("past the organization's rate: %v %s", resp.Header, body)
		}
	}
	if resp, body := get(t, http.MethodGet, url+"/v1/organizations", pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: other, Mode: access.Live}).Secret); resp.StatusCode != 200 {
		t.Fatalf("another organization's key: %d %s", resp.StatusCode, body)
	}
	clk.add(time.Second)
	if resp, _ := get(t, http.MethodGet, url+"/v1/organizations", secrets[2]); resp.StatusCode != 200 {
		t.Fatalf("after a second's refill: %d", resp.StatusCode)
	}
}
