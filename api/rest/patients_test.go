package rest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"carehub/api/envelope"
	"carehub/api/rest"
	"carehub/e2e/servertest"
	"carehub/ingest/intake"
	"carehub/kernel/access"
	"carehub/kernel/ids"
	obs "carehub/processors/observations"
	"carehub/processors/patients"
	"carehub/storage/demo"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/postgres/pgtest"
)

// TestMain (pgtest.Main) is in rest_test.go.

// fhirAPI is the patient and observation routes on a fresh database and broker, behind a
// stand-in for the authentication middleware that maps bearer tokens to principals.
type fhirAPI struct {
	t      *testing.T
	url    string
	pool   *pgxpool.Pool
	tokens map[string]*access.Principal

	orgA, orgB            string
	synthA, realA, synthB string
}

func newFHIRAPI(t *testing.T, tune func(*intake.Config)) *fhirAPI {
	t.Helper()
	pool := pgtest.New(t)
	a := &fhirAPI{t: t, pool: pool, tokens: map[string]*access.Principal{},
		orgA: ids.New(ids.Organization), orgB: ids.New(ids.Organization),
		synthA: ids.New(ids.Patient), realA: ids.New(ids.Patient), synthB: ids.New(ids.Patient)}
	ctx := context.Background()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`insert into organizations (id, name, slug, type, plan) values ($1, 'A', $1, 'clinic', 'growth'), ($2, 'B', $2, 'clinic', 'growth')`, []any{a.orgA, a.orgB}},
		{`insert into projects (id, org_id, name) values ($1, $2, 'p')`, []any{ids.New(ids.Project), a.orgA}},
		{`insert into patients (id, org_id, synthetic, name, gender, risk_level, programs) values
	($1, $4, true, '[{"family":"Synth","given":["Ann"]}]', 'female', 'high', '{copd-home}'),
	($2, $4, false, '[{"family":"Real"}]', 'male', 'low', '{}'),
	($3, $5, true, '[{"family":"Other"}]', 'other', 'high', '{copd-home}')`, []any{a.synthA, a.realA, a.synthB, a.orgA, a.orgB}},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
	all := []string{access.ReadPatients, access.WritePatients, access.ReadObservations, access.WriteObservations}
	a.tokens["live"] = &access.Principal{OrgID: a.orgA, Mode: access.Live, Scopes: all}
	a.tokens["test"] = &access.Principal{OrgID: a.orgA, Mode: access.Test, Scopes: all}
	a.tokens["reader"] = &access.Principal{OrgID: a.orgA, Mode: access.Live, Scopes: []string{access.ReadPatients}}
	a.tokens["other"] = &access.Principal{OrgID: a.orgB, Mode: access.Live, Scopes: all}
	a.tokens["platform"] = &access.Principal{Platform: true, Mode: access.Live}

	brokers, topic, group := kafkatest.Brokers(t), kafkatest.Topic(t, "obs"), kafkatest.Group(t, "writer")
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError + 4}))
	cfg := intake.Config{Brokers: brokers, Pool: pool, Topic: topic, WriterGroup: group, MaxLag: -1, Producers: 2,
		Registerer: prometheus.NewRegistry(), Logger: logger}
	if tune != nil {
		tune(&cfg)
	}
	in, err := intake.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Close)
	w, err := obs.NewWriter(obs.WriterConfig{Brokers: brokers, Pool: pool, Topic: topic, Group: group, Logger: logger,
		SessionTimeout: 6 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(wctx) }()
	t.Cleanup(func() { cancel(); <-done })

	r := mux.NewRouter()
	r.Use(bearerTokens(a.tokens))
	rest.PatientRoutes(r, patients.New(pool))
	rest.ObservationIngestRoutes(r, in)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	a.url = srv.URL
	return a
}

// response is what one of the package's test servers answered.
// bearerTokens stands in for the authentication middleware: the principal of a request is the
// one tokens maps its bearer token to, or none.
func bearerTokens(tokens map[string]*access.Principal) mux.MiddlewareFunc {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if p, ok := tokens[strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer ")]; ok {
				req = req.WithContext(access.With(req.Context(), p))
			}
			next.ServeHTTP(w, req)
		})
	}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %d %s: %v", r.status, r.body, err)
	}
}

// code checks the error envelope and returns error.code.
func (r response) code(t *testing.T) string {
	t.Helper()
	var e envelope.ErrorBody
	r.decode(t, &e)
	if e.Error.Message == "" || e.Error.DocsURL == "" || !strings.HasSuffix(e.Error.DocsURL, "#"+e.Error.Code) {
		t.Errorf("error envelope %s lacks message or docsUrl", r.body)
	}
	return e.Error.Code
}

// send sends method path to base with a bearer token (unless empty), a body (nil; a string or
// bytes as they are; anything else as JSON) and header name, value pairs (an empty value is not
// sent).
func send(t testing.TB, base, method, path, token string, body any, header ...string) response {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] != "" {
			req.Header.Set(header[i], header[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

func (a *fhirAPI) do(method, path, token, contentType string, body []byte, header ...string) response {
	a.t.Helper()
	var b any
	if body != nil {
		b = body
	}
	return send(a.t, a.url, method, path, token, b, append([]string{"Content-Type", contentType}, header...)...)
}

func (a *fhirAPI) scalar(sql string, args ...any) string {
	return pgtest.Scalar[string](a.t, a.pool, sql, args...)
}

func fhirJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newPatient(edit ...func(map[string]any)) map[string]any {
	p := map[string]any{
		"resourceType": "Patient",
		"id":           "ignored-on-create",
		"active":       true,
		"name":         []any{map[string]any{"use": "official", "family": "Okafor", "given": []any{"Ada"}}},
		"gender":       "female",
		"birthDate":    "1954-02-11",
		"telecom":      []any{map[string]any{"system": "phone", "value": "555-0100"}},
		"extension": []any{
			map[string]any{"url": patients.ExtensionRiskLevel, "valueCode": "moderate"},
			map[string]any{"url": patients.ExtensionProgram, "valueString": "chf-remote-monitoring"},
			map[string]any{"url": "https://ehr.example/ext/x", "valueString": "kept"},
		},
	}
	for _, e := range edit {
		e(p)
	}
	return p
}

type fhirPatient struct {
	ResourceType string `json:"resourceType"`
	ID           string `json:"id"`
	Gender       string `json:"gender"`
	BirthDate    string `json:"birthDate"`
	Name         []struct {
		Family string   `json:"family"`
		Given  []string `json:"given"`
	} `json:"name"`
	Meta struct {
		LastUpdated string `json:"lastUpdated"`
		Tag         []struct{ System, Code string }
	} `json:"meta"`
	Extension []struct {
		URL         string `json:"url"`
		ValueCode   string `json:"valueCode"`
		ValueString string `json:"valueString"`
	} `json:"extension"`
	ManagingOrganization struct{ Reference string } `json:"managingOrganization"`
}

func (p fhirPatient) ext(url string) []string {
	var out []string
	for _, e := range p.Extension {
		if e.URL == url {
			out = append(out, e.ValueCode+e.ValueString)
		}
	}
	return out
}

func (p fhirPatient) testData() bool {
	for _, t := range p.Meta.Tag {
		if t.Code == "HTEST" {
			return true
		}
	}
	return false
}

func TestPatientCreateAndRead(t *testing.T) {
	a := newFHIRAPI(t, nil)
	r := a.do("POST", "/v1/patients", "live", "application/fhir+json", fhirJSON(t, newPatient()))
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var p fhirPatient
	r.decode(t, &p)
	if !ids.Valid(ids.Patient, p.ID) || r.header.Get("Location") != "/v1/patients/"+p.ID || p.ResourceType != "Patient" ||
		p.Gender != "female" || p.BirthDate != "1954-02-11" || p.Name[0].Family != "Okafor" || p.Meta.LastUpdated == "" ||
		p.ManagingOrganization.Reference != "Organization/"+a.orgA || p.testData() {
		t.Fatalf("created %s (Location %q)", r.body, r.header.Get("Location"))
	}
	if fmt.Sprint(p.ext(patients.ExtensionRiskLevel), p.ext(patients.ExtensionProgram), p.ext("https://ehr.example/ext/x")) != "[moderate] [chf-remote-monitoring] [kept]" {
		t.Fatalf("extensions %s", r.body)
	}
	if got := a.scalar(`select format('%s %s %s %s', synthetic::text, org_id, risk_level, programs) from patients where id = $1`, p.ID); got != fmt.Sprintf("false %s moderate {chf-remote-monitoring}", a.orgA) {
		t.Fatalf("row %s", got)
	}
	g := a.do("GET", "/v1/patients/"+p.ID, "reader", "", nil)
	if g.status != http.StatusOK || !bytes.Equal(bytes.TrimSpace(g.body), bytes.TrimSpace(r.body)) {
		t.Fatalf("read back %d %s\nwant %s", g.status, g.body, r.body)
	}

	// A test key creates a synthetic patient, tagged as test data; a live key may ask for one.
	r = a.do("POST", "/v1/patients", "test", "application/json", fhirJSON(t, newPatient()))
	var tp fhirPatient
	r.decode(t, &tp)
	if r.status != http.StatusCreated || !tp.testData() || a.scalar(`select synthetic::text from patients where id = $1`, tp.ID) != "true" {
		t.Fatalf("test key create: %d %s", r.status, r.body)
	}
	tagged := newPatient(func(p map[string]any) {
		p["meta"] = map[string]any{"tag": []any{map[string]any{"system": "http://terminology.hl7.org/CodeSystem/v3-ActReason", "code": "HTEST"}}}
	})
	r = a.do("POST", "/v1/patients", "live", "application/json", fhirJSON(t, tagged))
	r.decode(t, &tp)
	if r.status != http.StatusCreated || a.scalar(`select synthetic::text from patients where id = $1`, tp.ID) != "true" {
		t.Fatalf("live key, HTEST: %d %s", r.status, r.body)
	}

	// The platform operator names the organization.
	withOrg := newPatient(func(p map[string]any) {
		p["managingOrganization"] = map[string]any{"reference": "Organization/" + a.orgB}
	})
	r = a.do("POST", "/v1/patients", "platform", "application/json", fhirJSON(t, withOrg))
	r.decode(t, &tp)
	if r.status != http.StatusCreated || a.scalar(`select org_id from patients where id = $1`, tp.ID) != a.orgB {
		t.Fatalf("platform create: %d %s", r.status, r.body)
	}
	if r := a.do("POST", "/v1/patients", "platform", "application/json", fhirJSON(t, newPatient())); r.status != 422 {
		t.Fatalf("platform without an organization: %d %s", r.status, r.body)
	}
}

func TestPatientWriteErrors(t *testing.T) {
	a := newFHIRAPI(t, nil)
	tests := []struct {
		name        string
		token       string
		contentType string
		body        []byte
		status      int
		code        string
		field       string
	}{
		{"no credential", "", "application/json", fhirJSON(t, newPatient()), 401, "UNAUTHORIZED", ""},
		{"read scope only", "reader", "application/json", fhirJSON(t, newPatient()), 403, "INSUFFICIENT_SCOPE", ""},
		{"text/plain", "live", "text/plain", fhirJSON(t, newPatient()), 415, "UNSUPPORTED_MEDIA_TYPE", ""},
		{"not JSON", "live", "application/json", []byte("{"), 400, "INVALID_REQUEST", ""},
		{"over 1 MiB", "live", "application/json", fhirJSON(t, newPatient(func(p map[string]any) { p["text"] = strings.Repeat("x", 1<<20) })), 413, "PAYLOAD_TOO_LARGE", ""},
		{"an Observation", "live", "application/json", fhirJSON(t, newPatient(func(p map[string]any) { p["resourceType"] = "Observation" })), 422, "VALIDATION_FAILED", "resourceType"},
		{"no name", "live", "application/json", fhirJSON(t, newPatient(func(p map[string]any) { delete(p, "name") })), 422, "VALIDATION_FAILED", "name"},
		{"empty name", "live", "application/json", fhirJSON(t, newPatient(func(p map[string]any) { p["name"] = []any{map[string]any{"use": "official"}} })), 422, "VALIDATION_FAILED", "name"},
		{"name not a list", "live", "application/json", fhirJSON(t, newPatient(func(p map[string]any) { p["name"] = "Ada" })), 422, "VALIDATION_FAILED", "name"},
		{"gender outside the value set", "live", "application/json", fhirJSON(t, newPatient(func(p map[string]any) { p["gender"] = "F" })), 422, "VALIDATION_FAILED", "gender"},
		{"birth date format", "live", "application/json", fhirJSON(t, newPatient(func(p map[string]any) { p["birthDate"] = "11/02/1954" })), 422, "VALIDATION_FAILED", "birthDate"},
		{"birth date in the future", "live", "application/json", fhirJSON(t, newPatient(func(p map[string]any) { p["birthDate"] = time.Now().AddDate(1, 0, 0).Format(time.DateOnly) })), 422, "VALIDATION_FAILED", "birthDate"},
		{"birth date impossible", "live", "application/json", fhirJSON(t, newPatient(func(p map[string]any) { p["birthDate"] = "1954-02-30" })), 422, "VALIDATION_FAILED", "birthDate"},
		{"telecom not a list", "live", "application/json", fhirJSON(t, newPatient(func(p map[string]any) { p["telecom"] = map[string]any{} })), 422, "VALIDATION_FAILED", "telecom"},
		{"unknown risk level", "live", "application/json", fhirJSON(t, newPatient(func(p map[string]any) {
			p["extension"] = []any{map[string]any{"url": patients.ExtensionRiskLevel, "valueCode": "HIGH"}}
		})), 422, "VALIDATION_FAILED", "extension"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := a.do("POST", "/v1/patients", tt.token, tt.contentType, tt.body)
			if r.status != tt.status || r.code(t) != tt.code {
				t.Fatalf("%d %s; want %d %s", r.status, r.body, tt.status, tt.code)
			}
			if tt.field != "" {
				var e envelope.ErrorBody
				r.decode(t, &e)
				if fields, _ := e.Error.Details["fields"].(map[string]any); fields[tt.field] == nil {
					t.Fatalf("details %v lack %s", e.Error.Details, tt.field)
				}
			}
		})
	}
	if n := a.scalar(`select count(*)::text from patients`); n != "3" {
		t.Fatalf("refused writes created patients: %s", n)
	}
}

// TestPatientProgramLength checks that a care program's 100-character bound counts characters, as
// the message and the OpenAPI document's maxLength say, not bytes: 100 accented letters are 200
// bytes and fit; 101 do not.
func TestPatientProgramLength(t *testing.T) {
	a := newFHIRAPI(t, nil)
	for _, tt := range []struct {
		n      int
		status int
	}{{100, http.StatusCreated}, {101, http.StatusUnprocessableEntity}} {
		body := fhirJSON(t, newPatient(func(p map[string]any) {
			p["extension"] = []any{map[string]any{"url": patients.ExtensionProgram, "valueString": strings.Repeat("é", tt.n)}}
		}))
		if r := a.do("POST", "/v1/patients", "live", "application/json", body); r.status != tt.status {
			t.Errorf("a program of %d characters: %d %s; want %d", tt.n, r.status, r.body, tt.status)
		}
	}
}

func TestPatientUpdate(t *testing.T) {
	a := newFHIRAPI(t, nil)
	body := fhirJSON(t, map[string]any{"resourceType": "Patient", "id": a.synthA, "name": []any{map[string]any{"family": "Renamed"}}, "gender": "unknown"})
	r := a.do("PUT", "/v1/patients/"+a.synthA, "live", "application/fhir+json", body)
	var p fhirPatient
	r.decode(t, &p)
	if r.status != http.StatusOK || p.ID != a.synthA || p.Name[0].Family != "Renamed" || p.Gender != "unknown" || p.BirthDate != "" || !p.testData() {
		t.Fatalf("update: %d %s", r.status, r.body)
	}
	// Without the extensions, risk level and programs stay.
	if fmt.Sprint(p.ext(patients.ExtensionRiskLevel), p.ext(patients.ExtensionProgram)) != "[high] [copd-home]" {
		t.Fatalf("extensions after update: %s", r.body)
	}
	withRisk := fhirJSON(t, newPatient(func(p map[string]any) { delete(p, "id") }))
	if r := a.do("PUT", "/v1/patients/"+a.synthA, "test", "application/json", withRisk); r.status != http.StatusOK {
		t.Fatalf("test key, synthetic patient: %d %s", r.status, r.body)
	}
	if got := a.scalar(`select format('%s %s %s', risk_level, programs, synthetic::text) from patients where id = $1`, a.synthA); got != "moderate {chf-remote-monitoring} true" {
		t.Fatalf("row after update %s", got)
	}
	for _, tt := range []struct {
		name, token, id string
		body            []byte
		status          int
	}{
		{"another tenant's patient", "live", a.synthB, withRisk, 404},
		{"a real patient under a test key", "test", a.realA, withRisk, 404},
		{"no such patient", "live", ids.New(ids.Patient), withRisk, 404},
		{"id in the body differs", "live", a.realA, body, 400},
		{"read scope only", "reader", a.realA, withRisk, 403},
		{"invalid body", "live", a.realA, fhirJSON(t, map[string]any{"resourceType": "Patient"}), 422},
	} {
		if r := a.do("PUT", "/v1/patients/"+tt.id, tt.token, "application/json", tt.body); r.status != tt.status {
			t.Errorf("%s: %d %s; want %d", tt.name, r.status, r.body, tt.status)
		}
	}
	if got := a.scalar(`select name->0->>'family' from patients where id = $1`, a.synthB); got != "Other" {
		t.Fatalf("another tenant's patient changed: %s", got)
	}
}

type fhirPage struct {
	Data []json.RawMessage `json:"data"`
	Meta struct {
		Total  int     `json:"total"`
		Cursor *string `json:"cursor"`
	} `json:"meta"`
}

func TestPatientList(t *testing.T) {
	a := newFHIRAPI(t, nil)
	for i := range 7 {
		body := fhirJSON(t, newPatient(func(p map[string]any) {
			p["extension"] = []any{map[string]any{"url": patients.ExtensionRiskLevel, "valueCode": []string{"low", "critical"}[i%2]}}
		}))
		if r := a.do("POST", "/v1/patients", "live", "application/json", body); r.status != 201 {
			t.Fatal(r.status, string(r.body))
		}
	}
	list := func(token, query string) (fhirPage, response) {
		t.Helper()
		r := a.do("GET", "/v1/patients"+query, token, "", nil)
		var p fhirPage
		if r.status == 200 {
			r.decode(t, &p)
		}
		return p, r
	}
	var seen []string
	cursor := ""
	for pages := 0; ; pages++ {
		q := "?limit=3"
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		p, r := list("live", q)
		if r.status != 200 || p.Meta.Total != 9 || pages > 4 {
			t.Fatalf("page %d: %d %s", pages, r.status, r.body)
		}
		for _, d := range p.Data {
			var pt fhirPatient
			_ = json.Unmarshal(d, &pt)
			seen = append(seen, pt.ID)
		}
		if p.Meta.Cursor == nil {
			if !strings.Contains(string(r.body), `"cursor":null`) {
				t.Fatalf("last page: %s", r.body)
			}
			break
		}
		cursor = *p.Meta.Cursor
	}
	if len(seen) != 9 || len(distinctStrings(seen)) != 9 {
		t.Fatalf("walked %v", seen)
	}
	if p, _ := list("live", "?riskLevel=critical"); p.Meta.Total != 3 || len(p.Data) != 3 {
		t.Fatalf("riskLevel=critical: %d", p.Meta.Total)
	}
	if p, _ := list("live", "?program=copd-home"); p.Meta.Total != 1 {
		t.Fatalf("program=copd-home: %d", p.Meta.Total)
	}
	if p, _ := list("test", ""); p.Meta.Total != 1 {
		t.Fatalf("a test key sees %d patients; want the one synthetic", p.Meta.Total)
	}
	if p, _ := list("other", ""); p.Meta.Total != 1 {
		t.Fatalf("organization B sees %d", p.Meta.Total)
	}
	for _, q := range []string{"?limit=0", "?limit=101", "?limit=x", "?cursor=nonsense"} {
		if _, r := list("live", q); r.status != 400 || r.code(t) != "INVALID_REQUEST" {
			t.Errorf("%s: %d %s", q, r.status, r.body)
		}
	}
	if _, r := list("", ""); r.status != 401 {
		t.Fatalf("no credential: %d", r.status)
	}
	for _, tt := range []struct{ token, id string }{{"test", a.realA}, {"other", a.synthA}, {"live", ids.New(ids.Patient)}} {
		if r := a.do("GET", "/v1/patients/"+tt.id, tt.token, "", nil); r.status != 404 || r.code(t) != "NOT_FOUND" {
			t.Errorf("%s reading %s: %d %s", tt.token, tt.id, r.status, r.body)
		}
	}
}

func distinctStrings(ss []string) map[string]bool {
	m := map[string]bool{}
	for _, s := range ss {
		m[s] = true
	}
	return m
}

// TestPatientRoutesOnTheServer drives the patient routes through a whole node (real keys,
// authentication, audit) on the demo data.
func TestPatientRoutesOnTheServer(t *testing.T) {
	s := servertest.Start(t)
	live := s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients, access.ReadObservations, access.WritePatients)
	test := s.Key(demo.DemoOrgSlug, access.Test, access.ReadPatients, access.ReadObservations)
	other := s.Key("northwind-health", access.Live, access.ReadPatients)

	r := s.Do("GET", "/v1/patients/"+demo.StablePatientID, live, nil)
	var p fhirPatient
	r.JSON(t, &p)
	if r.Status != 200 || p.ID != demo.StablePatientID || fmt.Sprint(p.ext(patients.ExtensionRiskLevel)) != "[low]" || !p.testData() {
		t.Fatalf("stable patient: %d %s", r.Status, r.Body)
	}
	for _, c := range []struct{ key, path string }{
		{test, "/v1/patients/" + demo.RealPatientID},
		{test, "/v1/patients/" + demo.RealPatientID + "/observations"},
		{other, "/v1/patients/" + demo.StablePatientID},
	} {
		if r := s.Do("GET", c.path, c.key, nil); r.Status != 404 {
			t.Errorf("GET %s: %d %s; want 404", c.path, r.Status, r.Body)
		}
	}
	r = s.Do("GET", "/v1/patients/"+demo.DeterioratingPatientID+"/observations?code=9279-1&limit=1", live, nil)
	var page fhirPage
	r.JSON(t, &page)
	if r.Status != 200 || len(page.Data) != 1 || page.Meta.Total != 18 || page.Meta.Cursor == nil {
		t.Fatalf("latest respiratory rate: %d %s", r.Status, r.Body)
	}
	var o struct {
		ValueQuantity struct{ Value float64 } `json:"valueQuantity"`
	}
	_ = json.Unmarshal(page.Data[0], &o)
	if o.ValueQuantity.Value != 26 {
		t.Fatalf("latest respiratory rate %v; the demo's deteriorating patient has 26", o.ValueQuantity.Value)
	}
	var list fhirPage
	s.Do("GET", "/v1/patients?limit=100", test, nil).JSON(t, &list)
	for _, d := range list.Data {
		var pt fhirPatient
		_ = json.Unmarshal(d, &pt)
		if pt.ID == demo.RealPatientID || !pt.testData() {
			t.Fatalf("a test key listed %s (not synthetic)", pt.ID)
		}
	}
}
