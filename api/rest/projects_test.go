package rest_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

type projectPage struct {
	Data []struct{ ID, OrganizationID, Name, CreatedAt string }
	Meta struct {
		Total  int
		Cursor *string
	}
}

// walkProjects follows GET path's cursor to the last page and returns every project id seen.
func walkProjects(t *testing.T, s *servertest.Server, key, path string) []projectPage {
	t.Helper()
	var pages []projectPage
	cursor := ""
	for len(pages) < 20 {
		p := path
		if cursor != "" {
			p += "&cursor=" + url.QueryEscape(cursor)
		}
		r := s.Do(http.MethodGet, p, key, nil)
		var page projectPage
		r.JSON(t, &page)
		if r.Status != http.StatusOK {
			t.Fatalf("GET %s: HTTP %d %s", p, r.Status, r.Body)
		}
		pages = append(pages, page)
		if page.Meta.Cursor == nil {
			return pages
		}
		cursor = *page.Meta.Cursor
	}
	t.Fatalf("GET %s: more than 20 pages", path)
	return nil
}

func projectsOf(pages []projectPage) map[string]string {
	out := map[string]string{}
	for _, p := range pages {
		for _, d := range p.Data {
			out[d.ID] = d.OrganizationID
		}
	}
	return out
}

// A newcomer with a key finds the projectId that /v1/events and /v1/webhooks need, by
// organization id or slug, and never another tenant's projects.
func TestProjects(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	platform := s.PlatformKey()
	demoOrg := s.OrgID(demo.DemoOrgSlug)
	northwind := s.OrgID("northwind-health")
	northwindKey := s.Key("northwind-health", access.Test, access.ReadPatients)

	t.Run("a key lists its organization's projects, cursor to the end", func(t *testing.T) {
		pages := walkProjects(t, s, key, "/v1/projects?limit=2")
		got := projectsOf(pages)
		if len(pages) != 2 || len(got) != 3 || pages[0].Meta.Total != 3 {
			t.Fatalf("want 3 projects over 2 pages, got %d over %d: %+v", len(got), len(pages), pages)
		}
		for id, org := range got {
			if org != demoOrg {
				t.Errorf("project %s of %s listed to a %s key", id, org, demo.DemoOrgSlug)
			}
		}
		if _, ok := got[s.ProjectID(demo.SepsisProjectName)]; !ok {
			t.Errorf("%q missing: %v", demo.SepsisProjectName, got)
		}
	})

	t.Run("organization filter by id and by slug", func(t *testing.T) {
		byID := projectsOf(walkProjects(t, s, key, "/v1/projects?organizationId="+demoOrg))
		bySlug := projectsOf(walkProjects(t, s, key, "/v1/projects?organizationId="+demo.DemoOrgSlug))
		if len(byID) != 3 || len(bySlug) != 3 {
			t.Fatalf("by id %v, by slug %v", byID, bySlug)
		}
	})

	t.Run("the platform operator sees every organization's projects and filters by orgId", func(t *testing.T) {
		all := walkProjects(t, s, platform, "/v1/projects?limit=5")
		orgsSeen := map[string]bool{}
		for _, org := range projectsOf(all) {
			orgsSeen[org] = true
		}
		if !orgsSeen[demoOrg] || !orgsSeen[northwind] || all[0].Meta.Total != len(projectsOf(all)) {
			t.Fatalf("platform listing: %d projects of %d organizations, total %d", len(projectsOf(all)), len(orgsSeen), all[0].Meta.Total)
		}
		nw := projectsOf(walkProjects(t, s, platform, "/v1/projects?organizationId=northwind-health"))
		if len(nw) != 2 {
			t.Fatalf("northwind-health has 2 projects, got %v", nw)
		}
		for _, org := range nw {
			if org != northwind {
				t.Fatalf("filter by northwind-health returned a project of %s", org)
			}
		}
	})

	t.Run("cross-tenant: another organization, by id or slug, is NOT_FOUND", func(t *testing.T) {
		for _, ref := range []string{demoOrg, demo.DemoOrgSlug} {
			wantError(t, s.Do(http.MethodGet, "/v1/projects?organizationId="+ref, northwindKey, nil), http.StatusNotFound, "NOT_FOUND")
			wantError(t, s.Do(http.MethodGet, "/v1/organizations/"+ref, northwindKey, nil), http.StatusNotFound, "NOT_FOUND")
		}
		for id := range projectsOf(walkProjects(t, s, northwindKey, "/v1/projects?limit=100")) {
			if got := scalar(t, s, `select org_id from projects where id = $1`, id); got != northwind {
				t.Fatalf("a northwind key listed project %s of %s", id, got)
			}
		}
		// Unknown and another tenant's organizations answer alike: existence does not leak.
		unknown := wantError(t, s.Do(http.MethodGet, "/v1/projects?organizationId=no-such-org", northwindKey, nil), http.StatusNotFound, "NOT_FOUND")
		other := wantError(t, s.Do(http.MethodGet, "/v1/projects?organizationId=demo-health", northwindKey, nil), http.StatusNotFound, "NOT_FOUND")
		if strings.Replace(unknown.Error.Message, "no-such-org", "X", 1) != strings.Replace(other.Error.Message, "demo-health", "X", 1) {
			t.Errorf("unknown %q vs another tenant's %q", unknown.Error.Message, other.Error.Message)
		}
	})

	t.Run("a bad cursor is 400", func(t *testing.T) {
		wantError(t, s.Do(http.MethodGet, "/v1/projects?cursor=bm9wZQ", key, nil), http.StatusBadRequest, "INVALID_REQUEST")
	})

	t.Run("an organization by slug, REST and GraphQL", func(t *testing.T) {
		r := s.Do(http.MethodGet, "/v1/organizations/"+demo.DemoOrgSlug, key, nil)
		var o struct{ ID, Slug string }
		r.JSON(t, &o)
		if r.Status != http.StatusOK || o.ID != demoOrg {
			t.Fatalf("GET /v1/organizations/%s: %d %s", demo.DemoOrgSlug, r.Status, r.Body)
		}
		g := s.GraphQL(key, `query($o: ID!) { organization(id: $o) { id } projects(organizationId: $o) { id } }`,
			map[string]any{"o": demo.DemoOrgSlug})
		var data struct {
			Organization struct{ ID string }
			Projects     []struct{ ID string }
		}
		if err := json.Unmarshal(g.Data, &data); err != nil || len(g.Errors) > 0 {
			t.Fatalf("GraphQL by slug: %v %+v", err, g.Errors)
		}
		if data.Organization.ID != demoOrg || len(data.Projects) != 3 {
			t.Fatalf("GraphQL by slug: %+v", data)
		}
		g = s.GraphQL(northwindKey, `{ organization(id: "demo-health") { id } }`, nil)
		if len(g.Errors) != 1 || g.Errors[0].Code() != "NOT_FOUND" {
			t.Fatalf("another tenant's slug over GraphQL: %+v", g)
		}
	})

	t.Run("list routes that need a project say how to find one", func(t *testing.T) {
		for _, path := range []string{"/v1/events", "/v1/webhooks"} {
			e := wantError(t, s.Do(http.MethodGet, path, key, nil), http.StatusBadRequest, "INVALID_REQUEST")
			if !strings.Contains(e.Error.Message, "GET /v1/projects") {
				t.Errorf("%s without projectId: %q does not say where to find one", path, e.Error.Message)
			}
		}
	})
}
