package graphql_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"carehub/api/graphql/spectest"
	"carehub/storage/demo"
)

// TestTransport covers what POST /graphql does around execution: authentication failures, limits,
// malformed requests, and the schema the live server introspects.
func TestTransport(t *testing.T) {
	s := start(t)
	key := s.DemoKey()

	t.Run("introspection matches the spec", func(t *testing.T) {
		model, err := spectest.LoadSpec("")
		if err != nil {
			t.Fatal(err)
		}
		h := http.Header{"Authorization": {"Bearer " + key}}
		got, err := spectest.FetchIntrospection(context.Background(), nil, s.URL+"/graphql", h)
		if err != nil {
			t.Fatal(err)
		}
		if diffs := spectest.Compare(model, got); len(diffs) > 0 {
			t.Fatalf("%d differences from the spec:\n%s", len(diffs), strings.Join(diffs, "\n"))
		}
		if got.Type("WebhookDelivery") == nil || got.Type("Query").Field("apiVersion") == nil {
			t.Fatal("the extensions are not served")
		}
		// A query field description reached introspection (UseStringDescriptions).
		if f := got.Type("Query").Field("organizations"); f == nil || !strings.Contains(f.Description, "visible to the caller") {
			t.Fatalf("descriptions are not served: %+v", f)
		}
	})

	t.Run("missing or bad credential is 401 with both envelopes", func(t *testing.T) {
		for _, k := range []string{"", "chk_live_00000000000000000000000000000000", "garbage"} {
			r := s.Do(http.MethodPost, "/graphql", k, map[string]any{"query": "{ apiVersion }"})
			if r.Status != http.StatusUnauthorized {
				t.Fatalf("key %q: HTTP %d %s", k, r.Status, r.Body)
			}
			var body struct {
				Error struct {
					Code, Message, RequestID, DocsURL string
				}
				Errors []struct {
					Message    string
					Extensions struct{ Code string }
				}
			}
			r.JSON(t, &body)
			if body.Error.Code != "UNAUTHORIZED" || body.Error.RequestID == "" || body.Error.RequestID != r.Header.Get("Request-Id") ||
				!strings.Contains(body.Error.DocsURL, "/docs/errors#UNAUTHORIZED") || body.Error.Message == "" {
				t.Fatalf("REST error object: %+v", body.Error)
			}
			if len(body.Errors) != 1 || body.Errors[0].Extensions.Code != "UNAUTHENTICATED" || body.Errors[0].Message == "" {
				t.Fatalf("GraphQL errors: %+v", body.Errors)
			}
		}
	})

	t.Run("executed operations answer 200, errors included", func(t *testing.T) {
		r := s.Do(http.MethodPost, "/graphql", key, map[string]any{"query": `{ organization(id: "org_01aaaaaaaaaaaaaaaaaaaaaaaa") { id } }`})
		if r.Status != http.StatusOK || r.Header.Get("Request-Id") == "" {
			t.Fatalf("HTTP %d, Request-Id %q", r.Status, r.Header.Get("Request-Id"))
		}
		if !strings.Contains(string(r.Body), `"data":null`) {
			t.Fatalf("data must be null: %s", r.Body)
		}
	})

	t.Run("requests rejected before execution", func(t *testing.T) {
		for name, body := range map[string]any{
			"syntax":            map[string]any{"query": "{ organizations { id "},
			"unknown field":     map[string]any{"query": "{ organisations { id } }"},
			"missing argument":  map[string]any{"query": "{ organization { id } }"},
			"bad variable type": map[string]any{"query": "query($l: Int) { organizations(limit: $l) { id } }", "variables": map[string]any{"l": "ten"}},
			"not JSON":          "{query: nope}",
			"empty query":       map[string]any{"query": "  "},
			"subscription":      map[string]any{"query": `subscription { eventStream(projectId: "x") { id } }`},
			"query too long":    map[string]any{"query": "{ apiVersion " + strings.Repeat(" ", 32<<10) + "}"},
		} {
			r := s.Do(http.MethodPost, "/graphql", key, body)
			var res struct {
				Data   json.RawMessage
				Errors []struct {
					Message    string
					Extensions struct{ Code string }
				}
			}
			r.JSON(t, &res)
			if r.Status != http.StatusOK || len(res.Errors) == 0 || res.Errors[0].Extensions.Code != "BAD_USER_INPUT" {
				t.Errorf("%s: HTTP %d %s", name, r.Status, r.Body)
			}
			if name == "query too long" && !strings.Contains(res.Errors[0].Message, "at most 32768") {
				t.Errorf("query too long: %s", res.Errors[0].Message)
			}
		}
	})

	t.Run("depth limit 12", func(t *testing.T) {
		// deployments(1) installation(2) asset(3) publisher(4) organization(5) projects(6)
		// organization(7) … : 12 levels pass, 13 do not. (The single objects keep the cost of the
		// nested lists within the budget.)
		nest := func(levels int) string {
			q := `deployments(projectId: "` + s.ProjectID(demo.SepsisProjectName) + `", limit: 1) { installation { asset { publisher { organization { `
			close := "}}}}}"
			for i := 6; i < levels; i++ {
				if i%2 == 0 {
					q += "projects { "
				} else {
					q += "organization { "
				}
				close += "}"
			}
			return "{ " + q + "id " + close + " }"
		}
		s.MustGraphQL(t, key, nest(12), nil, nil)
		res := fails(t, s, key, nest(13), nil, "BAD_USER_INPUT")
		if !strings.Contains(res.Errors[0].Message, "depth") {
			t.Fatalf("depth error: %+v", res.Errors)
		}
		// Introspection alone may nest deeper (the standard query does), data may not hide in it.
		// __schema(1) types(2) fields(3) type(4) ofType×8(5–12) name(13).
		deep := `__schema { types { fields { type { ofType { ofType { ofType { ofType { ofType { ofType { ofType { ofType { name } } } } } } } } } } } }`
		s.MustGraphQL(t, key, "{ "+deep+" }", nil, nil)
		fails(t, s, key, "{ apiVersion "+deep+" }", nil, "BAD_USER_INPUT")
	})

	t.Run("body over 1 MiB is 413", func(t *testing.T) {
		r := s.Do(http.MethodPost, "/graphql", key, `{"query": "{ apiVersion }", "pad": "`+strings.Repeat("x", 1<<20)+`"}`)
		if r.Status != http.StatusRequestEntityTooLarge || !strings.Contains(string(r.Body), "PAYLOAD_TOO_LARGE") {
			t.Fatalf("HTTP %d %.200s", r.Status, r.Body)
		}
	})

	t.Run("GET without upgrade", func(t *testing.T) {
		r := s.Do(http.MethodGet, "/graphql", key, nil)
		if r.Status != http.StatusMethodNotAllowed {
			t.Fatalf("HTTP %d %s", r.Status, r.Body)
		}
	})

	t.Run("explorer", func(t *testing.T) {
		for _, p := range []string{"/graphiql", "/graphiql/"} {
			r := s.Do(http.MethodGet, p, "", nil)
			if r.Status != http.StatusOK || !strings.Contains(string(r.Body), "<html") {
				t.Fatalf("%s: HTTP %d", p, r.Status)
			}
		}
	})

	t.Run("operationName selects the operation and locates errors", func(t *testing.T) {
		r := s.Do(http.MethodPost, "/graphql", key, map[string]any{"operationName": "B",
			"query": "query A { apiVersion }\nquery B {\n  apiVersion\n  project(id: \"prj_01aaaaaaaaaaaaaaaaaaaaaaaa\") { id }\n}"})
		var res struct {
			Data   map[string]any
			Errors []struct {
				Locations []struct{ Line, Column int }
			}
		}
		r.JSON(t, &res)
		if len(res.Errors) != 1 || len(res.Errors[0].Locations) != 1 || res.Errors[0].Locations[0].Line != 4 || res.Errors[0].Locations[0].Column != 3 {
			t.Fatalf("locations: %s", r.Body)
		}
		_ = demo.DemoOrgID
	})
}
