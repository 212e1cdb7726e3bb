package rest_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/schemas"
	"carehub/storage/demo"
)

// Wherever a route takes an organization id it takes the slug too (the CLI and GET
// /v1/organizations/{id} do): a newcomer knows "demo-health" long before an org_ id.
func TestOrganizationSlugs(t *testing.T) {
	s := servertest.Start(t)
	platform := s.PlatformKey()
	admin := s.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg)
	northwind := s.OrgID("northwind-health")

	t.Run("POST /v1/api-keys orgId by slug", func(t *testing.T) {
		for _, c := range []struct{ key, ref, wantOrg string }{
			{platform, "northwind-health", northwind},
			{admin, demo.DemoOrgSlug, s.OrgID(demo.DemoOrgSlug)},
		} {
			r := s.Do(http.MethodPost, "/v1/api-keys", c.key, map[string]any{"orgId": c.ref, "mode": "test", "name": "slug"})
			var k struct{ OrgID string }
			r.JSON(t, &k)
			if r.Status != http.StatusCreated || k.OrgID != c.wantOrg {
				t.Fatalf("orgId %q: HTTP %d, key of %q; want 201 and a key of %s: %s", c.ref, r.Status, k.OrgID, c.wantOrg, r.Body)
			}
		}
		// Another tenant's slug is as unknown as a made-up one.
		for _, ref := range []string{"northwind-health", "no-such-org"} {
			wantError(t, s.Do(http.MethodPost, "/v1/api-keys", admin, map[string]any{"orgId": ref, "mode": "test"}), http.StatusNotFound, "NOT_FOUND")
		}
		wantError(t, s.Do(http.MethodPost, "/v1/api-keys", platform, map[string]any{"orgId": "no-such-org", "mode": "test"}), http.StatusNotFound, "NOT_FOUND")
	})

	t.Run("GET /v1/audit orgId by slug", func(t *testing.T) {
		// A live northwind key's call is audited; wait until the log has it, then read it by slug.
		nwKey := s.Key("northwind-health", access.Live, access.ReadPatients)
		if r := s.Do(http.MethodGet, "/v1/patients?limit=1", nwKey, nil); r.Status != http.StatusOK {
			t.Fatalf("northwind call: HTTP %d %s", r.Status, r.Body)
		}
		audit := func(ref string) []struct{ OrgID string } {
			r := s.Do(http.MethodGet, "/v1/audit?limit=100&orgId="+ref, platform, nil)
			var page struct{ Data []struct{ OrgID string } }
			r.JSON(t, &page)
			if r.Status != http.StatusOK {
				t.Fatalf("GET /v1/audit?orgId=%s: HTTP %d %s", ref, r.Status, r.Body)
			}
			return page.Data
		}
		deadline := time.Now().Add(30 * time.Second)
		for len(audit(northwind)) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the northwind call never reached the audit log")
			}
			time.Sleep(50 * time.Millisecond)
		}
		bySlug := audit("northwind-health")
		if len(bySlug) == 0 {
			t.Fatal("GET /v1/audit?orgId=northwind-health: no records; by id there are some")
		}
		for _, rec := range bySlug {
			if rec.OrgID != northwind {
				t.Fatalf("orgId=northwind-health returned a record of %s", rec.OrgID)
			}
		}
		wantError(t, s.Do(http.MethodGet, "/v1/audit?orgId=no-such-org", platform, nil), http.StatusNotFound, "NOT_FOUND")
	})

	t.Run("every list route that needs a projectId says where to find one", func(t *testing.T) {
		key := s.DemoKey()
		routes := routesRequiringProject(t)
		if len(routes) < 2 {
			t.Fatalf("the OpenAPI document has %d GET routes requiring projectId: %v", len(routes), routes)
		}
		for _, path := range routes {
			e := wantError(t, s.Do(http.MethodGet, path, key, nil), http.StatusBadRequest, "INVALID_REQUEST")
			if !strings.Contains(e.Error.Message, "GET /v1/projects") {
				t.Errorf("GET %s without projectId: %q does not say where to find one", path, e.Error.Message)
			}
		}
	})
}

// routesRequiringProject returns the GET paths of the OpenAPI document with a required
// projectId query parameter (and no path parameter).
func routesRequiringProject(t *testing.T) []string {
	t.Helper()
	b, err := schemas.OpenAPI.ReadFile("openapi/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	type param struct {
		Ref      string `json:"$ref"`
		Name     string `json:"name"`
		In       string `json:"in"`
		Required bool   `json:"required"`
	}
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []param `json:"parameters"`
		} `json:"paths"`
		Components struct {
			Parameters map[string]param `json:"parameters"`
		} `json:"components"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var out []string
	for path, item := range doc.Paths {
		for _, p := range item["get"].Parameters {
			if name, ok := strings.CutPrefix(p.Ref, "#/components/parameters/"); ok {
				p = doc.Components.Parameters[name]
			}
			if p.Name == "projectId" && p.In == "query" && p.Required && !strings.Contains(path, "{") {
				out = append(out, path)
			}
		}
	}
	return out
}
