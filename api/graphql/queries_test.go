package graphql_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"carehub/kernel/access"
	"carehub/kernel/events"
	"carehub/kernel/ids"
	"carehub/storage/demo"
)

// TestQueries drives every query field through the running server: valid input, bad input,
// NOT_FOUND, another tenant's ids and missing scopes.
func TestQueries(t *testing.T) {
	s := start(t)
	key := s.DemoKey()
	platform := s.PlatformKey()
	noScopes := s.Key(demo.DemoOrgSlug, access.Live)
	testKey := s.Key(demo.DemoOrgSlug, access.Test, access.Scopes...)
	otherKey := s.Key("northwind-health", access.Live, access.Scopes...)

	sepsis := s.ProjectID(demo.SepsisProjectName)
	northwindProject := s.ProjectID("ICU Sepsis Bundle")
	ward7 := s.id(`select id from agents where name = $1`, demo.Ward7AgentName)
	northwindAgent := s.id(`select id from agents where name = 'ICU Sepsis Sentinel'`)
	workflow := s.id(`select id from workflows where name = $1`, demo.DeteriorationWorkflowName)
	news2Model := s.assetID(demo.NEWS2ModelName)
	draftAsset := s.id(`select id from assets where status = 'DRAFT' order by id limit 1`)
	northwindPatient := s.id(`select id from patients where org_id = $1 order by id limit 1`, s.OrgID("northwind-health"))

	t.Run("apiVersion", func(t *testing.T) {
		var d struct{ APIVersion string }
		s.MustGraphQL(t, noScopes, `{ apiVersion }`, nil, &d)
		if d.APIVersion != "2.0" {
			t.Fatalf("apiVersion %q", d.APIVersion)
		}
	})

	t.Run("organizations", func(t *testing.T) {
		var d struct {
			Organizations []struct {
				ID, Name, Slug, Plan string
				MemberCount          int
				CreatedAt            string
			}
		}
		s.MustGraphQL(t, noScopes, `{ organizations { id name slug plan memberCount createdAt } }`, nil, &d)
		if len(d.Organizations) != 1 || d.Organizations[0].Slug != demo.DemoOrgSlug || d.Organizations[0].MemberCount != 48 {
			t.Fatalf("a tenant sees its own organization only: %+v", d.Organizations)
		}
		if _, err := time.Parse(time.RFC3339, d.Organizations[0].CreatedAt); err != nil || d.Organizations[0].CreatedAt[len(d.Organizations[0].CreatedAt)-1] != 'Z' {
			t.Fatalf("createdAt %q is not RFC 3339 UTC", d.Organizations[0].CreatedAt)
		}
		s.MustGraphQL(t, platform, `{ organizations(limit: 100) { id slug } }`, nil, &d)
		if len(d.Organizations) != 10 {
			t.Fatalf("platform operator sees %d organizations, want 10", len(d.Organizations))
		}
		var page struct{ Organizations []struct{ Slug string } }
		s.MustGraphQL(t, platform, `{ organizations(limit: 3, offset: 2) { slug } }`, nil, &page)
		if len(page.Organizations) != 3 || page.Organizations[0].Slug != d.Organizations[2].Slug {
			t.Fatalf("offset page %+v does not continue %+v", page.Organizations, d.Organizations[:3])
		}
	})

	t.Run("pagination arguments out of range", func(t *testing.T) {
		for _, q := range []string{
			`{ organizations(limit: 0) { id } }`,
			`{ organizations(limit: 101) { id } }`,
			`{ organizations(offset: -1) { id } }`,
			`{ assets(limit: 1000) { id } }`,
			`{ publishers(limit: -5) { id } }`,
			`{ patients(limit: 0) { id } }`,
			fmt.Sprintf(`{ agents(projectId: %q, limit: 0) { id } }`, sepsis),
			fmt.Sprintf(`{ workflows(projectId: %q, limit: 200) { id } }`, sepsis),
			fmt.Sprintf(`{ events(projectId: %q, limit: 101) { id } }`, sepsis),
			fmt.Sprintf(`{ projects(organizationId: %q, offset: -1) { id } }`, demo.DemoOrgID),
			fmt.Sprintf(`{ patient(id: %q) { observations(limit: 101) { id } } }`, demo.StablePatientID),
		} {
			res := fails(t, s, key, q, nil, "BAD_USER_INPUT")
			if res.Errors[0].Path == nil {
				t.Errorf("%s: error without path", q)
			}
		}
	})

	t.Run("single lookups NOT_FOUND", func(t *testing.T) {
		for _, tc := range []struct{ field, id string }{
			{"organization", "org_01aaaaaaaaaaaaaaaaaaaaaaaa"},
			{"organization", s.OrgID("northwind-health")}, // another tenant's
			{"project", "prj_01aaaaaaaaaaaaaaaaaaaaaaaa"},
			{"project", northwindProject},
			{"asset", "ast_01aaaaaaaaaaaaaaaaaaaaaaaa"},
			{"asset", draftAsset}, // another organization's draft
			{"agent", northwindAgent},
			{"workflow", "wf_01aaaaaaaaaaaaaaaaaaaaaaaa"},
			{"patient", northwindPatient},
			{"patient", "pat_01aaaaaaaaaaaaaaaaaaaaaaaa"},
			{"workflowRun", "run_01aaaaaaaaaaaaaaaaaaaaaaaa"},
			{"deployment", "dep_01aaaaaaaaaaaaaaaaaaaaaaaa"},
		} {
			q := fmt.Sprintf(`{ %s(id: %q) { id } }`, tc.field, tc.id)
			res := fails(t, s, key, q, nil, "NOT_FOUND")
			if !dataIsNull(res) {
				t.Errorf("%s: data %s, want null", q, res.Data)
			}
			e := res.Errors[0]
			if e.Extensions["id"] != tc.id || len(e.Path) != 1 || e.Path[0] != tc.field || len(e.Locations) != 1 {
				t.Errorf("%s: error %+v lacks the id, path or location", q, e)
			}
		}
		// With another root field that succeeds, its data is kept and only the lookup is null.
		res := s.GraphQL(key, `{ apiVersion organization(id: "org_01aaaaaaaaaaaaaaaaaaaaaaaa") { id } }`, nil)
		if string(res.Data) != `{"apiVersion":"2.0","organization":null}` || len(res.Errors) != 1 {
			t.Errorf("partial result: %s %+v", res.Data, res.Errors)
		}
	})

	t.Run("lists of another tenant's project are NOT_FOUND", func(t *testing.T) {
		for _, q := range []string{
			fmt.Sprintf(`{ agents(projectId: %q) { id } }`, northwindProject),
			fmt.Sprintf(`{ workflows(projectId: %q) { id } }`, northwindProject),
			fmt.Sprintf(`{ deployments(projectId: %q) { id } }`, northwindProject),
			fmt.Sprintf(`{ installations(projectId: %q) { id } }`, northwindProject),
			fmt.Sprintf(`{ events(projectId: %q) { id } }`, northwindProject),
			fmt.Sprintf(`{ projects(organizationId: %q) { id } }`, s.OrgID("northwind-health")),
		} {
			fails(t, s, key, q, nil, "NOT_FOUND")
		}
		// The other tenant sees its own.
		var d struct{ Agents []struct{ Name string } }
		s.MustGraphQL(t, otherKey, fmt.Sprintf(`{ agents(projectId: %q) { name } }`, northwindProject), nil, &d)
		if len(d.Agents) != 1 || d.Agents[0].Name != "ICU Sepsis Sentinel" {
			t.Fatalf("northwind agents: %+v", d.Agents)
		}
	})

	t.Run("project with nested lists", func(t *testing.T) {
		var d struct {
			Project struct {
				Name         string
				Organization struct{ Slug string }
				Assets       []struct {
					Status string
					Config json.RawMessage
					Asset  struct{ Name string }
				}
				Deployments []struct{ ID string }
				Workflows   []struct {
					Name   string
					Nodes  int
					Steps  []string
					Status string
				}
			}
		}
		s.MustGraphQL(t, key, `query($id: ID!) { project(id: $id) { name organization { slug }
			assets { status config asset { name } } deployments { id } workflows { name nodes steps status } } }`,
			map[string]any{"id": sepsis}, &d)
		p := d.Project
		if p.Name != demo.SepsisProjectName || p.Organization.Slug != demo.DemoOrgSlug || len(p.Assets) != 4 || len(p.Workflows) != 2 {
			t.Fatalf("project: %+v", p)
		}
		for _, w := range p.Workflows {
			if w.Nodes != len(w.Steps) || w.Nodes == 0 {
				t.Errorf("workflow %s: nodes %d, steps %v", w.Name, w.Nodes, w.Steps)
			}
		}
		var projects struct{ Projects []struct{ Name string } }
		s.MustGraphQL(t, key, `query($o: ID!) { projects(organizationId: $o, limit: 2) { name } }`, map[string]any{"o": demo.DemoOrgID}, &projects)
		if len(projects.Projects) != 2 {
			t.Fatalf("projects: %+v", projects.Projects)
		}
	})

	t.Run("assets with every filter combined", func(t *testing.T) {
		var d struct {
			Assets []struct {
				Name, Type, Category, Status string
				Rating                       *float64
				Badges, FhirResources        []string
				Pricing                      struct{ Type string }
				ComplianceScore              struct {
					Overall        int
					HipaaCompliant bool
				}
				Publisher struct{ Name string }
			}
		}
		s.MustGraphQL(t, noScopes, `{ assets(type: MODEL, category: "Early Warning", status: APPROVED, minRating: 4.5,
			badges: ["HIPAA", "SOC 2"], fhirResources: ["Patient", "Observation"], limit: 5) {
			name type category status rating badges fhirResources pricing { type } complianceScore { overall hipaaCompliant } publisher { name } } }`, nil, &d)
		if len(d.Assets) != 1 || d.Assets[0].Name != demo.NEWS2ModelName {
			t.Fatalf("assets: %+v", d.Assets)
		}
		a := d.Assets[0]
		if !slices.Contains(a.Badges, "HIPAA") || !a.ComplianceScore.HipaaCompliant || a.Publisher.Name != "VitalSignal Labs" {
			t.Fatalf("asset: %+v", a)
		}
		// Each filter excludes on its own.
		for _, q := range []string{
			`{ assets(type: MODEL, minRating: 4.9) { name } }`,
			`{ assets(badges: ["HIPAA", "no such badge"]) { name } }`,
			`{ assets(fhirResources: ["Patient", "Practitioner", "CarePlan", "Device"]) { name } }`,
			`{ assets(category: "no such category") { name } }`,
		} {
			var e struct{ Assets []struct{ Name string } }
			s.MustGraphQL(t, noScopes, q, nil, &e)
			for _, x := range e.Assets {
				if x.Name == demo.NEWS2ModelName {
					t.Errorf("%s returned %s", q, x.Name)
				}
			}
		}
		var agents struct{ Assets []struct{ Type string } }
		s.MustGraphQL(t, noScopes, `{ assets(type: AGENT, limit: 100) { type } }`, nil, &agents)
		if len(agents.Assets) == 0 {
			t.Fatal("no AGENT assets")
		}
		for _, x := range agents.Assets {
			if x.Type != "AGENT" {
				t.Fatalf("type filter returned %s", x.Type)
			}
		}
		fails(t, s, noScopes, `{ assets(type: ROBOT) { id } }`, nil, "BAD_USER_INPUT")
		// Tenants see approved assets and their own submissions only.
		var all struct{ Assets []struct{ Status string } }
		s.MustGraphQL(t, key, `{ assets(limit: 100) { status } }`, nil, &all)
		for _, x := range all.Assets {
			if x.Status != "APPROVED" && x.Status != "DEPRECATED" {
				t.Fatalf("demo-health sees another organization's %s asset", x.Status)
			}
		}
		s.MustGraphQL(t, platform, `{ assets(status: DRAFT, limit: 100) { status } }`, nil, &all)
		if len(all.Assets) == 0 {
			t.Fatal("the platform operator sees drafts")
		}
		var one struct{ Asset struct{ Name string } }
		s.MustGraphQL(t, noScopes, `query($id: ID!) { asset(id: $id) { name } }`, map[string]any{"id": news2Model}, &one)
		if one.Asset.Name != demo.NEWS2ModelName {
			t.Fatalf("asset: %+v", one)
		}
	})

	t.Run("publishers", func(t *testing.T) {
		var d struct {
			Publishers []struct {
				Name         string
				Verified     bool
				TotalApps    int
				Organization *struct{ Slug string }
			}
		}
		s.MustGraphQL(t, platform, `{ publishers(verified: true, limit: 100) { name verified totalApps organization { slug } } }`, nil, &d)
		if len(d.Publishers) != 7 {
			t.Fatalf("verified publishers: %d, want 7", len(d.Publishers))
		}
		var withOrg int
		for _, p := range d.Publishers {
			if !p.Verified {
				t.Fatalf("unverified %s", p.Name)
			}
			if p.Organization != nil {
				withOrg++
			}
		}
		if withOrg != 4 {
			t.Fatalf("%d verified publishers with an organization, want 4", withOrg)
		}
		s.MustGraphQL(t, key, `{ publishers(verified: false) { name verified organization { slug } } }`, nil, &d)
		if len(d.Publishers) != 3 {
			t.Fatalf("unverified publishers: %+v", d.Publishers)
		}
		s.MustGraphQL(t, key, `{ publishers(verified: true, limit: 100) { name organization { slug } } }`, nil, &d)
		for _, p := range d.Publishers {
			if p.Organization != nil {
				t.Fatalf("a tenant sees another tenant's organization through publisher %s", p.Name)
			}
		}
	})

	t.Run("agent with sessions and workflow with runs", func(t *testing.T) {
		var d struct {
			Agent struct {
				Name, RunMode, Skill, Status string
				Project                      struct{ ID string }
				Sessions                     []struct{ ID string }
			}
			Workflow struct {
				Name, Status string
				Runs         []struct{ ID string }
				Project      struct{ Name string }
				Triggers     []string
			}
		}
		s.MustGraphQL(t, key, `query($a: ID!, $w: ID!) { agent(id: $a) { name runMode skill status project { id } sessions { id } }
			workflow(id: $w) { name status runs { id } project { name } triggers } }`,
			map[string]any{"a": ward7, "w": workflow}, &d)
		if d.Agent.Skill != "news2" || d.Agent.RunMode != "sync" || d.Agent.Project.ID != sepsis || d.Agent.Sessions == nil {
			t.Fatalf("agent: %+v", d.Agent)
		}
		if d.Workflow.Status != "ACTIVE" || d.Workflow.Project.Name != demo.SepsisProjectName || d.Workflow.Triggers == nil {
			t.Fatalf("workflow: %+v", d.Workflow)
		}
		var list struct{ Workflows []struct{ Name string } }
		s.MustGraphQL(t, key, `query($p: ID!) { workflows(projectId: $p, status: PAUSED) { name } }`, map[string]any{"p": sepsis}, &list)
		if len(list.Workflows) != 1 || list.Workflows[0].Name != "Sepsis screen" {
			t.Fatalf("paused workflows: %+v", list.Workflows)
		}
	})

	t.Run("patients need read:patients; observations read:observations", func(t *testing.T) {
		q := fmt.Sprintf(`{ patient(id: %q) { id } }`, demo.StablePatientID)
		fails(t, s, noScopes, q, nil, "FORBIDDEN")
		fails(t, s, noScopes, `{ patients { id } }`, nil, "FORBIDDEN")
		readOnly := s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients)
		res := s.GraphQL(readOnly, fmt.Sprintf(`{ patient(id: %q) { id riskLevel observations { id } } }`, demo.StablePatientID), nil)
		if len(res.Errors) != 1 || res.Errors[0].Code() != "FORBIDDEN" || res.Errors[0].Extensions["requiredScope"] != "read:observations" {
			t.Fatalf("observations without read:observations: %s %+v", res.Data, res.Errors)
		}
	})

	t.Run("patient with FHIR data", func(t *testing.T) {
		var d struct {
			Patient struct {
				ID, ResourceType string
				Name             []struct {
					Family string
					Given  []string
				}
				Gender, BirthDate, RiskLevel *string
				Address, Telecom             []json.RawMessage
				Synthetic                    bool
				Programs                     []string
				Observations                 []struct {
					ID, ResourceType, Status string
					Code                     struct {
						Coding []struct{ System, Code string }
					}
					Subject       struct{ Reference string }
					ValueQuantity struct {
						Value float64
						Unit  string
					}
					EffectiveDateTime string
				}
				Encounters []struct {
					ResourceType, Status string
					Class                struct{ Code string }
					Period               struct{ Start string }
				}
			}
		}
		s.MustGraphQL(t, key, `query($id: ID!) { patient(id: $id) { id resourceType name gender birthDate address telecom riskLevel synthetic programs
			observations(code: "8867-4", limit: 3) { id resourceType status code subject valueQuantity effectiveDateTime }
			encounters { resourceType status class period } } }`, map[string]any{"id": demo.DeterioratingPatientID}, &d)
		p := d.Patient
		if p.ResourceType != "Patient" || len(p.Name) == 0 || p.Name[0].Family == "" || p.RiskLevel == nil || *p.RiskLevel != "critical" || !p.Synthetic {
			t.Fatalf("patient: %+v", p)
		}
		if len(p.Observations) != 3 {
			t.Fatalf("observations: %d, want 3", len(p.Observations))
		}
		o := p.Observations[0]
		if o.Code.Coding[0].Code != "8867-4" || o.ValueQuantity.Value != 118 || o.Subject.Reference != "Patient/"+demo.DeterioratingPatientID {
			t.Fatalf("latest heart rate: %+v", o)
		}
		if p.Observations[1].EffectiveDateTime >= o.EffectiveDateTime {
			t.Fatalf("observations not newest first: %s then %s", o.EffectiveDateTime, p.Observations[1].EffectiveDateTime)
		}
		if len(p.Encounters) == 0 || p.Encounters[0].ResourceType != "Encounter" || p.Encounters[0].Class.Code == "" {
			t.Fatalf("encounters: %+v", p.Encounters)
		}
		var list struct {
			Patients []struct {
				RiskLevel string
				Programs  []string
			}
		}
		s.MustGraphQL(t, key, `{ patients(riskLevel: "high", limit: 100) { riskLevel programs } }`, nil, &list)
		if len(list.Patients) == 0 {
			t.Fatal("no high-risk patients")
		}
		for _, x := range list.Patients {
			if x.RiskLevel != "high" {
				t.Fatalf("riskLevel filter returned %s", x.RiskLevel)
			}
		}
		s.MustGraphQL(t, key, `{ patients(program: "copd-home", limit: 100) { riskLevel programs } }`, nil, &list)
		if len(list.Patients) == 0 {
			t.Fatal("no patients in copd-home")
		}
		for _, x := range list.Patients {
			if !slices.Contains(x.Programs, "copd-home") {
				t.Fatalf("program filter returned %v", x.Programs)
			}
		}
	})

	t.Run("test keys see synthetic patients only", func(t *testing.T) {
		fails(t, s, testKey, fmt.Sprintf(`{ patient(id: %q) { id } }`, demo.RealPatientID), nil, "NOT_FOUND")
		var d struct{ Patient struct{ ID string } }
		s.MustGraphQL(t, key, fmt.Sprintf(`{ patient(id: %q) { id } }`, demo.RealPatientID), nil, &d)
		var list struct{ Patients []struct{ Synthetic bool } }
		s.MustGraphQL(t, testKey, `{ patients(limit: 100, offset: 0) { synthetic } }`, nil, &list)
		s.MustGraphQL(t, testKey, `{ patients(limit: 100, offset: 100) { synthetic } }`, nil, &list)
		for _, p := range list.Patients {
			if !p.Synthetic {
				t.Fatal("a test key listed a real patient")
			}
		}
		if n := s.count(`select count(*) from patients where org_id = $1 and not synthetic`, demo.DemoOrgID); n == 0 {
			t.Fatal("the demo data has no real patient: the test proves nothing")
		}
	})

	t.Run("events newest first with type and since filters", func(t *testing.T) {
		log := s.EventLog()
		base := time.Now().UTC().Truncate(time.Second).Add(-time.Hour)
		var evs []events.Event
		for i := range 5 {
			typ := "integration.reading" // names no patient: served whole to a key without patient scopes
			if i%2 == 1 {
				typ = "workflow.completed"
			}
			evs = append(evs, events.Event{ID: ids.New(ids.Event), Type: typ, OrgID: demo.DemoOrgID, ProjectID: sepsis,
				Source: "integration", Severity: "info", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), CreatedAt: base.Add(time.Duration(i) * time.Minute)})
		}
		if err := log.AppendEvents(context.Background(), evs); err != nil {
			t.Fatal(err)
		}
		var d struct {
			Events []struct {
				ID, Type, Source, Timestamp, ProjectID, Severity string
				Payload                                          struct{ N int }
			}
		}
		s.MustGraphQL(t, noScopes, `query($p: ID!) { events(projectId: $p) { id type source timestamp projectId severity payload } }`, map[string]any{"p": sepsis}, &d)
		if len(d.Events) != 5 || d.Events[0].Payload.N != 4 || d.Events[4].Payload.N != 0 || d.Events[0].ProjectID != sepsis {
			t.Fatalf("events: %+v", d.Events)
		}
		s.MustGraphQL(t, noScopes, `query($p: ID!) { events(projectId: $p, type: "workflow.completed", limit: 1) { id type payload } }`, map[string]any{"p": sepsis}, &d)
		if len(d.Events) != 1 || d.Events[0].Type != "workflow.completed" || d.Events[0].Payload.N != 3 {
			t.Fatalf("typed events: %+v", d.Events)
		}
		s.MustGraphQL(t, noScopes, `query($p: ID!, $since: DateTime) { events(projectId: $p, since: $since) { payload } }`,
			map[string]any{"p": sepsis, "since": base.Add(3 * time.Minute).Format(time.RFC3339)}, &d)
		if len(d.Events) != 2 {
			t.Fatalf("events since: %+v", d.Events)
		}
		fails(t, s, noScopes, `query($p: ID!) { events(projectId: $p, since: "yesterday") { id } }`, map[string]any{"p": sepsis}, "BAD_USER_INPUT")
	})
}
