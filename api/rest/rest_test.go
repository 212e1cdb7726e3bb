package rest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/mux"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/kernel/events"
	"carehub/kernel/ids"
	"carehub/schemas"
	"carehub/storage/demo"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type errorBody struct {
	Error struct {
		Code, Message, RequestID, DocsURL string
		Details                           map[string]any
	}
}

// wantError checks a REST error response: status, code and the envelope's fields.
func wantError(t *testing.T, r *servertest.Response, status int, code string) errorBody {
	t.Helper()
	var e errorBody
	r.JSON(t, &e)
	if r.Status != status || e.Error.Code != code {
		t.Fatalf("want %d %s, got %d %s", status, code, r.Status, r.Body)
	}
	if e.Error.Message == "" || e.Error.RequestID == "" || e.Error.RequestID != r.Header.Get("Request-Id") ||
		!strings.HasSuffix(e.Error.DocsURL, "/docs/errors#"+code) {
		t.Fatalf("incomplete envelope: %s (Request-Id %q)", r.Body, r.Header.Get("Request-Id"))
	}
	return e
}

type orgPage struct {
	Data []struct {
		ID, Name, Slug, Type, Plan string
		FHIRBase                   *string
		HIPAACompliant             bool
		CreatedAt                  string
	}
	Meta struct {
		Total  int
		Cursor *string
	}
}

func TestREST(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	platform := s.PlatformKey()
	sepsis := s.ProjectID(demo.SepsisProjectName)

	t.Run("every response has a Request-Id", func(t *testing.T) {
		for _, path := range []string{"/v1/organizations", "/v1/nope", "/v1/openapi.json"} {
			if r := s.Do(http.MethodGet, path, key, nil); !strings.HasPrefix(r.Header.Get("Request-Id"), "req_") {
				t.Errorf("%s: Request-Id %q", path, r.Header.Get("Request-Id"))
			}
		}
	})

	t.Run("401 envelope", func(t *testing.T) {
		for _, k := range []string{"", "chk_test_00000000000000000000000000000000"} {
			wantError(t, s.Do(http.MethodGet, "/v1/organizations", k, nil), http.StatusUnauthorized, "UNAUTHORIZED")
		}
	})

	t.Run("organizations: cursor pagination to the end", func(t *testing.T) {
		var seen []string
		cursor := ""
		for pages := 0; ; pages++ {
			if pages > 5 {
				t.Fatal("too many pages")
			}
			path := "/v1/organizations?limit=3"
			if cursor != "" {
				path += "&cursor=" + url.QueryEscape(cursor)
			}
			r := s.Do(http.MethodGet, path, platform, nil)
			var p orgPage
			r.JSON(t, &p)
			if r.Status != http.StatusOK || p.Meta.Total != 10 {
				t.Fatalf("HTTP %d %s", r.Status, r.Body)
			}
			for _, o := range p.Data {
				seen = append(seen, o.ID)
			}
			if p.Meta.Cursor == nil {
				if !strings.Contains(string(r.Body), `"cursor":null`) {
					t.Fatalf("the last page must carry cursor null: %s", r.Body)
				}
				break
			}
			if len(p.Data) != 3 {
				t.Fatalf("a page before the last has %d items", len(p.Data))
			}
			cursor = *p.Meta.Cursor
		}
		distinct := slices.Clone(seen)
		sort.Strings(distinct)
		if len(seen) != 10 || len(slices.Compact(distinct)) != 10 {
			t.Fatalf("walked %d organizations: %v", len(seen), seen)
		}
		var one orgPage
		r := s.Do(http.MethodGet, "/v1/organizations", key, nil)
		r.JSON(t, &one)
		o := one.Data[0]
		if one.Meta.Total != 1 || len(one.Data) != 1 || o.ID != demo.DemoOrgID || o.Type != "health_system" || o.Plan != "enterprise" ||
			!o.HIPAACompliant || o.FHIRBase == nil || !strings.HasSuffix(o.CreatedAt, "Z") {
			t.Fatalf("a tenant's listing: %s", r.Body)
		}
	})

	t.Run("organizations: bad cursor and limits are 400", func(t *testing.T) {
		for _, q := range []string{"cursor=garbage", "cursor=" + url.QueryEscape("MS4xMjMuYXN0X3g"), "limit=0", "limit=101", "limit=ten"} {
			wantError(t, s.Do(http.MethodGet, "/v1/organizations?"+q, key, nil), http.StatusBadRequest, "INVALID_REQUEST")
		}
		var p orgPage
		r := s.Do(http.MethodGet, "/v1/organizations?limit=100", platform, nil)
		r.JSON(t, &p)
		if len(p.Data) != 10 || p.Meta.Cursor != nil {
			t.Fatalf("limit 100: %d items, cursor %v", len(p.Data), p.Meta.Cursor)
		}
	})

	t.Run("single resources", func(t *testing.T) {
		ward7 := scalar(t, s, `select id from agents where name = $1`, demo.Ward7AgentName)
		wf := scalar(t, s, `select id from workflows where name = $1`, demo.DeteriorationWorkflowName)
		for _, path := range []string{"/v1/organizations/" + demo.DemoOrgID, "/v1/projects/" + sepsis, "/v1/agents/" + ward7, "/v1/workflows/" + wf} {
			if r := s.Do(http.MethodGet, path, key, nil); r.Status != http.StatusOK {
				t.Errorf("%s: HTTP %d %s", path, r.Status, r.Body)
			}
		}
		other := s.Key("northwind-health", access.Live)
		for _, path := range []string{"/v1/organizations/" + demo.DemoOrgID, "/v1/projects/" + sepsis, "/v1/agents/" + ward7, "/v1/workflows/" + wf,
			"/v1/deployments/dep_01aaaaaaaaaaaaaaaaaaaaaaaa", "/v1/workflow-runs/run_01aaaaaaaaaaaaaaaaaaaaaaaa"} {
			e := wantError(t, s.Do(http.MethodGet, path, other, nil), http.StatusNotFound, "NOT_FOUND")
			if e.Error.Details["id"] == nil {
				t.Errorf("%s: details lack the id: %+v", path, e.Error)
			}
		}
	})

	t.Run("assets: lowercase type, filters, envelope and item shape", func(t *testing.T) {
		r := s.Do(http.MethodGet, "/v1/assets?type=agent&limit=2", key, nil)
		var p struct {
			Data []map[string]json.RawMessage
			Meta struct {
				Total  int
				Cursor *string
			}
		}
		r.JSON(t, &p)
		if r.Status != http.StatusOK || len(p.Data) != 2 || p.Meta.Total < 3 || p.Meta.Cursor == nil {
			t.Fatalf("HTTP %d %s", r.Status, r.Body)
		}
		for _, f := range []string{"id", "name", "description", "type", "category", "version", "publisher", "pricing", "fhirResources",
			"complianceScore", "badges", "rating", "downloads", "status", "createdAt", "updatedAt"} {
			if _, ok := p.Data[0][f]; !ok {
				t.Errorf("asset lacks %s: %s", f, r.Body)
			}
		}
		if string(p.Data[0]["type"]) != `"AGENT"` {
			t.Fatalf("type filter: %s", p.Data[0]["type"])
		}
		next := s.Do(http.MethodGet, "/v1/assets?type=agent&limit=2&cursor="+url.QueryEscape(*p.Meta.Cursor), key, nil)
		var p2 struct{ Data []struct{ ID string } }
		next.JSON(t, &p2)
		if len(p2.Data) == 0 || strings.Contains(string(r.Body), p2.Data[0].ID) {
			t.Fatalf("second page repeats the first: %s", next.Body)
		}
		r = s.Do(http.MethodGet, "/v1/assets?type=model&category=Early%20Warning&minRating=4.5&badges=HIPAA,SOC%202&fhirResources=Patient&fhirResources=Observation", key, nil)
		var one struct {
			Data []struct {
				Name      string
				Publisher struct{ Name string }
			}
			Meta struct{ Total int }
		}
		r.JSON(t, &one)
		if len(one.Data) != 1 || one.Data[0].Name != demo.NEWS2ModelName || one.Meta.Total != 1 || one.Data[0].Publisher.Name != "VitalSignal Labs" {
			t.Fatalf("combined filters: %s", r.Body)
		}
		for _, q := range []string{"type=robot", "limit=0", "minRating=high", "status=pending", "cursor=nope"} {
			wantError(t, s.Do(http.MethodGet, "/v1/assets?"+q, key, nil), http.StatusBadRequest, "INVALID_REQUEST")
		}
	})

	t.Run("events: newest first, filters, cursor, limits", func(t *testing.T) {
		log := s.EventLog()
		base := time.Now().UTC().Truncate(time.Millisecond).Add(-time.Hour)
		var evs []events.Event
		for i := range 7 {
			typ := "device.observation_received"
			if i%3 == 0 {
				typ = "workflow.run.completed"
			}
			evs = append(evs, events.Event{ID: ids.New(ids.Event), Type: typ, OrgID: demo.DemoOrgID, ProjectID: sepsis, Source: "workflow",
				Severity: "info", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), CreatedAt: base.Add(time.Duration(i) * time.Minute)})
		}
		if err := log.AppendEvents(context.Background(), evs); err != nil {
			t.Fatal(err)
		}
		type page struct {
			Data []struct {
				ID, Type, ProjectID, Source, Severity, CreatedAt string
				Payload                                          struct{ N int }
			}
			Meta struct {
				Total  int
				Cursor *string
			}
		}
		var p page
		r := s.Do(http.MethodGet, "/v1/events?projectId="+sepsis+"&limit=4", key, nil)
		r.JSON(t, &p)
		if r.Status != http.StatusOK || p.Meta.Total != 7 || len(p.Data) != 4 || p.Data[0].Payload.N != 6 || p.Meta.Cursor == nil || p.Data[0].ProjectID != sepsis {
			t.Fatalf("first page: %s", r.Body)
		}
		var p2 page
		s.Do(http.MethodGet, "/v1/events?projectId="+sepsis+"&limit=4&cursor="+url.QueryEscape(*p.Meta.Cursor), key, nil).JSON(t, &p2)
		if len(p2.Data) != 3 || p2.Data[0].Payload.N != 2 || p2.Meta.Cursor != nil {
			t.Fatalf("second page: %+v", p2)
		}
		var typed page
		s.Do(http.MethodGet, "/v1/events?projectId="+sepsis+"&type=workflow.run.completed", key, nil).JSON(t, &typed)
		if typed.Meta.Total != 3 || len(typed.Data) != 3 {
			t.Fatalf("type filter: %+v", typed)
		}
		var since page
		s.Do(http.MethodGet, "/v1/events?projectId="+sepsis+"&since="+url.QueryEscape(base.Add(5*time.Minute).Format(time.RFC3339Nano)), key, nil).JSON(t, &since)
		if since.Meta.Total != 2 {
			t.Fatalf("since filter: %+v", since)
		}
		for _, q := range []string{"", "projectId=" + sepsis + "&limit=1001", "projectId=" + sepsis + "&since=yesterday", "projectId=" + sepsis + "&cursor=zzz"} {
			wantError(t, s.Do(http.MethodGet, "/v1/events?"+q, key, nil), http.StatusBadRequest, "INVALID_REQUEST")
		}
		wantError(t, s.Do(http.MethodGet, "/v1/events?projectId="+sepsis, s.Key("northwind-health", access.Live), nil), http.StatusNotFound, "NOT_FOUND")
	})

	t.Run("event types", func(t *testing.T) {
		r := s.Do(http.MethodGet, "/v1/event-types", "", nil)
		var p struct{ Data []struct{ Type string } }
		r.JSON(t, &p)
		var types []string
		for _, e := range p.Data {
			types = append(types, e.Type)
		}
		for _, want := range []string{"workflow.completed", "workflow.run.completed", "agent.run.failed", "agent.run_completed",
			"device.observation_received", "diagnostic.result_ready"} {
			if !slices.Contains(types, want) {
				t.Errorf("catalogue lacks %s", want)
			}
		}
	})

	t.Run("webhooks list masks secrets", func(t *testing.T) {
		r := s.Do(http.MethodGet, "/v1/webhooks", key, nil)
		wantError(t, r, http.StatusBadRequest, "INVALID_REQUEST")
		res := s.GraphQL(key, `mutation($p: ID!) { createWebhook(projectId: $p, url: "https://hooks.example.org/carehub", events: ["agent.*"]) { id secret } }`,
			map[string]any{"p": sepsis})
		if len(res.Errors) > 0 {
			t.Fatalf("createWebhook: %+v", res.Errors)
		}
		var created struct{ CreateWebhook struct{ ID, Secret string } }
		json.Unmarshal(res.Data, &created)
		r = s.Do(http.MethodGet, "/v1/webhooks?projectId="+sepsis, key, nil)
		var p struct {
			Data []struct {
				ID, URL, Status, Secret string
				Events                  []string
				FailureCount            int
			}
		}
		r.JSON(t, &p)
		if r.Status != http.StatusOK || len(p.Data) != 1 || p.Data[0].ID != created.CreateWebhook.ID || p.Data[0].Events[0] != "agent.*" {
			t.Fatalf("HTTP %d %s", r.Status, r.Body)
		}
		if !strings.HasPrefix(created.CreateWebhook.Secret, "whsec_") || p.Data[0].Secret == created.CreateWebhook.Secret || strings.Contains(string(r.Body), created.CreateWebhook.Secret) {
			t.Fatalf("the listing shows the secret: %s", r.Body)
		}
	})

	t.Run("POST /api/v1/workflows/runs", func(t *testing.T) {
		wf := scalar(t, s, `select id from workflows where name = $1`, demo.DeteriorationWorkflowName)
		body := map[string]any{"workflow_id": wf, "trigger": "event",
			"input": map[string]any{"observation_id": "obs_01aaaaaaaaaaaaaaaaaaaaaaaa", "patient_id": demo.DeterioratingPatientID, "device_type": "bedside-monitor"}}
		r := s.Do(http.MethodPost, "/api/v1/workflows/runs", key, body)
		var run struct {
			ID, WorkflowID, Status, Trigger string
			Input                           struct {
				PatientID string `json:"patient_id"`
			}
		}
		r.JSON(t, &run)
		if r.Status != http.StatusAccepted || run.Status != "QUEUED" || run.Trigger != "event" || run.WorkflowID != wf || run.Input.PatientID != demo.DeterioratingPatientID {
			t.Fatalf("HTTP %d %s", r.Status, r.Body)
		}
		if got := s.Do(http.MethodGet, "/v1/workflow-runs/"+run.ID, key, nil); got.Status != http.StatusOK {
			t.Fatalf("run read: %d", got.Status)
		}
		wantError(t, s.Do(http.MethodPost, "/api/v1/workflows/runs", key, map[string]any{"trigger": "event"}), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
		wantError(t, s.Do(http.MethodPost, "/api/v1/workflows/runs", key, map[string]any{"workflow_id": wf, "trigger": "telepathy"}), http.StatusUnprocessableEntity, "VALIDATION_FAILED")
		wantError(t, s.Do(http.MethodPost, "/api/v1/workflows/runs", key, `{"workflow_id":`), http.StatusBadRequest, "INVALID_REQUEST")
		wantError(t, s.Do(http.MethodPost, "/api/v1/workflows/runs", key, map[string]any{"workflow_id": "wf_01aaaaaaaaaaaaaaaaaaaaaaaa"}), http.StatusNotFound, "NOT_FOUND")
		wantError(t, s.Do(http.MethodPost, "/api/v1/workflows/runs", key, map[string]any{"workflow_id": wf, "input": map[string]any{"patient_id": "pat_01aaaaaaaaaaaaaaaaaaaaaaaa"}}),
			http.StatusNotFound, "NOT_FOUND")
		paused := scalar(t, s, `select id from workflows where status = 'PAUSED' limit 1`)
		wantError(t, s.Do(http.MethodPost, "/api/v1/workflows/runs", key, map[string]any{"workflow_id": paused}), http.StatusConflict, "CONFLICT")
		wantError(t, s.Do(http.MethodPost, "/api/v1/workflows/runs", s.Key(demo.DemoOrgSlug, access.Live, access.ExecAgents), body), http.StatusForbidden, "INSUFFICIENT_SCOPE")
		big := `{"workflow_id":"` + wf + `","input":{"pad":"` + strings.Repeat("x", 1<<20) + `"}}`
		wantError(t, s.Do(http.MethodPost, "/api/v1/workflows/runs", key, big), http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE")
	})
}

// TestOpenAPIMatchesRoutes walks the router of a running node: every REST route it serves must be
// in schemas/openapi/openapi.json with the same methods, and everything documented must be served.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	s := servertest.Start(t)
	raw, err := schemas.OpenAPI.ReadFile("openapi/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.1.0" {
		t.Fatalf("openapi %q", doc.OpenAPI)
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			documented[strings.ToUpper(method)+" "+path] = true
		}
	}
	served := map[string]bool{}
	err = s.Router().Walk(func(route *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		path, err := route.GetPathTemplate()
		if err != nil || !(strings.HasPrefix(path, "/v1/") || strings.HasPrefix(path, "/api/") || strings.HasPrefix(path, "/.well-known/")) {
			return nil // a subrouter, or not REST (/graphql, /graphiql, /healthz, /metrics, /docs/errors)
		}
		methods, err := route.GetMethods()
		if err != nil {
			t.Errorf("REST route %s accepts every method: document its methods", path)
			return nil
		}
		for _, m := range methods {
			served[m+" "+path] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for r := range served {
		if !documented[r] {
			t.Errorf("served but not in openapi.json: %s", r)
		}
	}
	for r := range documented {
		if !served[r] {
			t.Errorf("in openapi.json but not served: %s", r)
		}
	}
	if len(served) < 10 {
		t.Fatalf("walked only %d REST routes: %v", len(served), served)
	}
	// The document is served as it is, without a credential.
	r := s.Do(http.MethodGet, "/v1/openapi.json", "", nil)
	if r.Status != http.StatusOK || string(r.Body) != string(raw) {
		t.Fatalf("GET /v1/openapi.json: HTTP %d", r.Status)
	}
}

func scalar(t *testing.T, s *servertest.Server, sql string, args ...any) string {
	return pgtest.Scalar[string](t, s.Pool(), sql, args...)
}
