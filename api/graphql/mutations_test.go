package graphql_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// outboxEvents counts the events of type typ in the outbox whose payload field has value.
func (n *node) outboxEvents(typ, field, value string) int {
	return n.count(`select count(*) from outbox where topic = $4 and value->>'type' = $1
and value->'payload'->>$2 = $3`, typ, field, value, n.Topics().Events)
}

// TestMarketplaceMutations: submit, review, install, deprecate, each with its events.
func TestMarketplaceMutations(t *testing.T) {
	s := start(t)
	key := s.DemoKey()
	platform := s.PlatformKey()
	noScopes := s.Key(demo.DemoOrgSlug, access.Live)
	otherAdmin := s.Key("northwind-health", access.Live, access.AdminOrg)
	sepsis := s.ProjectID(demo.SepsisProjectName)

	submit := `mutation($in: SubmitAssetInput!) { submitAsset(input: $in) { id status message } }`
	input := map[string]any{"name": "Ward Sepsis Predictor", "description": strings.Repeat("Predicts sepsis on the ward. ", 10),
		"version": "1.2.3", "type": "MODEL", "category": "Sepsis", "fhirResources": []string{"Patient", "Observation"},
		"pricingType": "SUBSCRIPTION", "monthlyFee": 99.5, "documentationUrl": "https://docs.example.org/ward-sepsis",
		"supportEmail": "support@example.org"}
	var assetID string

	t.Run("submitAsset", func(t *testing.T) {
		var d struct {
			SubmitAsset struct{ ID, Status, Message string }
		}
		s.MustGraphQL(t, key, submit, map[string]any{"in": input}, &d)
		assetID = d.SubmitAsset.ID
		if d.SubmitAsset.Status != "UNDER_REVIEW" || !strings.HasPrefix(assetID, "ast_") || !strings.Contains(d.SubmitAsset.Message, "score") {
			t.Fatalf("submission: %+v", d.SubmitAsset)
		}
		// Rubric: security 40+20+20+20, privacy 90-2*5, clinical 40+20+20+20; overall 93.
		var a struct {
			Asset struct {
				Status          string
				ComplianceScore struct{ Overall, Security, Privacy, ClinicalSafety int }
				Pricing         struct {
					Type       string
					MonthlyFee float64
				}
				Publisher struct {
					Name     string
					Verified bool
				}
			}
		}
		s.MustGraphQL(t, key, `query($id: ID!) { asset(id: $id) { status complianceScore { overall security privacy clinicalSafety }
			pricing { type monthlyFee } publisher { name verified } } }`, map[string]any{"id": assetID}, &a)
		cs := a.Asset.ComplianceScore
		if cs.Security != 100 || cs.Privacy != 80 || cs.ClinicalSafety != 100 || cs.Overall != 93 {
			t.Fatalf("compliance score %+v", cs)
		}
		if a.Asset.Publisher.Name != "Demo Health" || a.Asset.Publisher.Verified || a.Asset.Pricing.MonthlyFee != 99.5 {
			t.Fatalf("asset: %+v", a.Asset)
		}
		if n := s.outboxEvents("asset.submitted", "assetId", assetID); n != 1 {
			t.Fatalf("asset.submitted in the outbox: %d", n)
		}
		// Another tenant does not see the submission.
		fails(t, s, otherAdmin, `query($id: ID!) { asset(id: $id) { id } }`, map[string]any{"id": assetID}, "NOT_FOUND")
	})

	t.Run("submitAsset rejects bad input and missing scope", func(t *testing.T) {
		bad := map[string]any{}
		for k, v := range input {
			bad[k] = v
		}
		bad["supportEmail"], bad["fhirResources"] = "not an email", []string{"Patient", "Spaceship"}
		res := fails(t, s, key, submit, map[string]any{"in": bad}, "BAD_USER_INPUT")
		fields, _ := res.Errors[0].Extensions["fields"].(map[string]any)
		if fields["supportEmail"] == nil || fields["fhirResources"] == nil {
			t.Fatalf("field details: %+v", res.Errors[0].Extensions)
		}
		fails(t, s, key, `mutation { submitAsset(input: {name: "x"}) { id } }`, nil, "BAD_USER_INPUT") // missing required fields
		fails(t, s, noScopes, submit, map[string]any{"in": input}, "FORBIDDEN")
	})

	t.Run("installAsset refuses an asset under review", func(t *testing.T) {
		fails(t, s, key, `mutation($a: ID!, $p: ID!) { installAsset(assetId: $a, projectId: $p) { id } }`,
			map[string]any{"a": assetID, "p": sepsis}, "CONFLICT")
	})

	t.Run("reviewAsset", func(t *testing.T) {
		q := `mutation($a: ID!, $d: String!) { reviewAsset(assetId: $a, decision: $d, notes: "validated") { status } }`
		fails(t, s, key, q, map[string]any{"a": assetID, "d": "APPROVED"}, "FORBIDDEN")
		fails(t, s, platform, q, map[string]any{"a": assetID, "d": "MAYBE"}, "BAD_USER_INPUT")
		fails(t, s, platform, q, map[string]any{"a": "ast_01aaaaaaaaaaaaaaaaaaaaaaaa", "d": "APPROVED"}, "NOT_FOUND")
		var d struct{ ReviewAsset struct{ Status string } }
		s.MustGraphQL(t, platform, q, map[string]any{"a": assetID, "d": "APPROVED"}, &d)
		if d.ReviewAsset.Status != "APPROVED" {
			t.Fatalf("review: %+v", d)
		}
		fails(t, s, platform, q, map[string]any{"a": assetID, "d": "REJECTED"}, "CONFLICT")
		if n := s.outboxEvents("asset.approved", "assetId", assetID); n != 1 {
			t.Fatalf("asset.approved in the outbox: %d", n)
		}
	})

	t.Run("installAsset", func(t *testing.T) {
		q := `mutation($a: ID!, $p: ID!, $c: JSON) { installAsset(assetId: $a, projectId: $p, config: $c) {
			id status config installedAt asset { name downloads } project { id } } }`
		var d struct {
			InstallAsset struct {
				ID, Status string
				Config     struct{ Threshold int }
				Asset      struct {
					Name      string
					Downloads int
				}
				Project struct{ ID string }
			}
		}
		s.MustGraphQL(t, key, q, map[string]any{"a": assetID, "p": sepsis, "c": map[string]any{"threshold": 3}}, &d)
		in := d.InstallAsset
		if !strings.HasPrefix(in.ID, "ins_") || in.Status != "installed" || in.Config.Threshold != 3 || in.Asset.Downloads != 1 || in.Project.ID != sepsis {
			t.Fatalf("installation: %+v", in)
		}
		if n := s.outboxEvents("asset.installed", "installationId", in.ID); n != 1 {
			t.Fatalf("asset.installed in the outbox: %d", n)
		}
		fails(t, s, otherAdmin, q, map[string]any{"a": assetID, "p": sepsis}, "NOT_FOUND") // another tenant's project
		fails(t, s, noScopes, q, map[string]any{"a": assetID, "p": sepsis}, "FORBIDDEN")
		fails(t, s, key, q, map[string]any{"a": "ast_01aaaaaaaaaaaaaaaaaaaaaaaa", "p": sepsis}, "NOT_FOUND")
	})

	t.Run("deprecateAsset", func(t *testing.T) {
		q := `mutation($a: ID!) { deprecateAsset(assetId: $a) { status } }`
		fails(t, s, otherAdmin, q, map[string]any{"a": s.assetID(demo.NEWS2ModelName)}, "FORBIDDEN") // not its publisher
		var d struct{ DeprecateAsset struct{ Status string } }
		s.MustGraphQL(t, key, q, map[string]any{"a": assetID}, &d) // demo-health published it
		if d.DeprecateAsset.Status != "DEPRECATED" {
			t.Fatalf("deprecate: %+v", d)
		}
		fails(t, s, key, q, map[string]any{"a": assetID}, "CONFLICT")
		fails(t, s, key, `mutation($a: ID!, $p: ID!) { installAsset(assetId: $a, projectId: $p) { id } }`,
			map[string]any{"a": assetID, "p": sepsis}, "CONFLICT")
	})
}

// TestDeploymentMutations: createDeployment, hipaaMode rules, stopDeployment.
func TestDeploymentMutations(t *testing.T) {
	s := start(t)
	key := s.DemoKey()
	noScopes := s.Key(demo.DemoOrgSlug, access.Live)
	sepsis := s.ProjectID(demo.SepsisProjectName)
	hipaaInstall := s.id(`select i.id from installations i join assets a on a.id = i.asset_id where i.project_id = $1 and a.name = $2`,
		sepsis, demo.NEWS2ModelName)
	// An asset without HIPAA compliance, installed for the test.
	plain := s.id(`select id from assets where status = 'APPROVED' and not hipaa_compliant order by id limit 1`)
	var ins struct{ InstallAsset struct{ ID string } }
	s.MustGraphQL(t, key, `mutation($a: ID!, $p: ID!) { installAsset(assetId: $a, projectId: $p) { id } }`, map[string]any{"a": plain, "p": sepsis}, &ins)

	create := `mutation($i: ID!, $e: String!, $r: Int, $h: Boolean) { createDeployment(installationId: $i, environment: $e, replicas: $r, hipaaMode: $h) {
		id status replicas hipaaMode endpoint environment statusReason installation { id asset { name } } project { id } } }`
	var dep struct {
		CreateDeployment struct {
			ID, Status, Environment string
			Replicas                int
			HipaaMode               bool
			Endpoint                *string
			Installation            struct{ ID string }
			Project                 struct{ ID string }
		}
	}
	t.Run("createDeployment", func(t *testing.T) {
		s.MustGraphQL(t, key, create, map[string]any{"i": hipaaInstall, "e": "production", "r": 3, "h": true}, &dep)
		d := dep.CreateDeployment
		if d.Status != "PENDING" || d.Replicas != 3 || !d.HipaaMode || d.Installation.ID != hipaaInstall || d.Project.ID != sepsis || d.Endpoint != nil {
			t.Fatalf("deployment: %+v", d)
		}
		// The creation's PENDING event; the controller may already have added RUNNING.
		if n := s.count(`select count(*) from outbox where value->>'type' = 'deployment.status_changed' and value->'payload'->>'deploymentId' = $1 and value->'payload'->>'to' = 'PENDING'`, d.ID); n != 1 {
			t.Fatalf("deployment.status_changed to PENDING in the outbox: %d", n)
		}
		var q struct {
			Deployments []struct{ ID string }
			Deployment  struct{ Status string }
		}
		s.MustGraphQL(t, key, `query($p: ID!, $d: ID!) { deployments(projectId: $p) { id } deployment(id: $d) { status } }`,
			map[string]any{"p": sepsis, "d": d.ID}, &q)
		// The controller, which this test does not control, may already have moved it on.
		if len(q.Deployments) != 1 || q.Deployments[0].ID != d.ID || (q.Deployment.Status != "PENDING" && q.Deployment.Status != "RUNNING") {
			t.Fatalf("reads: %+v", q)
		}
	})
	t.Run("createDeployment rejects", func(t *testing.T) {
		fails(t, s, key, create, map[string]any{"i": ins.InstallAsset.ID, "e": "production", "h": true}, "BAD_USER_INPUT") // asset not HIPAA
		fails(t, s, key, create, map[string]any{"i": hipaaInstall, "e": "production", "r": 0}, "BAD_USER_INPUT")
		fails(t, s, key, create, map[string]any{"i": hipaaInstall, "e": "Prod Env!"}, "BAD_USER_INPUT")
		fails(t, s, key, create, map[string]any{"i": "ins_01aaaaaaaaaaaaaaaaaaaaaaaa", "e": "staging"}, "NOT_FOUND")
		fails(t, s, noScopes, create, map[string]any{"i": hipaaInstall, "e": "staging"}, "FORBIDDEN")
		// Cardiolytics has no BAA on file.
		cardio := s.Key("cardiolytics", access.Live, access.AdminOrg)
		cproj := s.id(`select id from projects where org_id = $1`, s.OrgID("cardiolytics"))
		var ci struct{ InstallAsset struct{ ID string } }
		s.MustGraphQL(t, cardio, `mutation($a: ID!, $p: ID!) { installAsset(assetId: $a, projectId: $p) { id } }`,
			map[string]any{"a": s.assetID(demo.NEWS2ModelName), "p": cproj}, &ci)
		res := fails(t, s, cardio, create, map[string]any{"i": ci.InstallAsset.ID, "e": "production", "h": true}, "BAD_USER_INPUT")
		if !strings.Contains(res.Errors[0].Message, "BAA") {
			t.Fatalf("message: %s", res.Errors[0].Message)
		}
	})
	t.Run("stopDeployment", func(t *testing.T) {
		q := `mutation($id: ID!) { stopDeployment(id: $id) { status endpoint } }`
		otherAdmin := s.Key("northwind-health", access.Live, access.AdminOrg)
		fails(t, s, otherAdmin, q, map[string]any{"id": dep.CreateDeployment.ID}, "NOT_FOUND")
		var d struct{ StopDeployment struct{ Status string } }
		s.MustGraphQL(t, key, q, map[string]any{"id": dep.CreateDeployment.ID}, &d)
		if d.StopDeployment.Status != "STOPPED" {
			t.Fatalf("stop: %+v", d)
		}
		fails(t, s, key, q, map[string]any{"id": dep.CreateDeployment.ID}, "CONFLICT")
		if n := s.count(`select count(*) from outbox where value->>'type' = 'deployment.status_changed' and value->'payload'->>'deploymentId' = $1 and value->'payload'->>'to' = 'STOPPED'`, dep.CreateDeployment.ID); n != 1 {
			t.Fatalf("deployment.status_changed to STOPPED: %d, want 1", n)
		}
	})
}

// TestAgentMutations: createAgent and runAgent in both run modes.
func TestAgentMutations(t *testing.T) {
	s := start(t)
	key := s.DemoKey()
	// The session's output is patient data: the test key reads it with the patient scopes.
	testKey := s.Key(demo.DemoOrgSlug, access.Test, access.ExecAgents, access.ReadPatients, access.ReadObservations)
	noScopes := s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients)
	sepsis := s.ProjectID(demo.SepsisProjectName)
	news2Agent := s.assetID(demo.NEWS2AgentName)
	ward7 := s.id(`select id from agents where name = $1`, demo.Ward7AgentName)

	create := `mutation($n: String!, $p: ID!, $m: String, $a: ID, $s: String) { createAgent(name: $n, projectId: $p, runMode: $m, assetId: $a, skill: $s) {
		id name runMode skill status description project { id } sessions { id } } }`
	t.Run("createAgent", func(t *testing.T) {
		var d struct {
			CreateAgent struct{ ID, RunMode, Skill, Status string }
		}
		s.MustGraphQL(t, key, create, map[string]any{"n": "Sepsis bot", "p": sepsis, "s": "qsofa"}, &d)
		if d.CreateAgent.RunMode != "sync" || d.CreateAgent.Skill != "qsofa" || d.CreateAgent.Status != "active" {
			t.Fatalf("agent: %+v", d.CreateAgent)
		}
		s.MustGraphQL(t, key, create, map[string]any{"n": "From asset", "p": sepsis, "a": news2Agent, "m": "async"}, &d)
		if d.CreateAgent.Skill != "news2" || d.CreateAgent.RunMode != "async" {
			t.Fatalf("agent from asset: %+v", d.CreateAgent)
		}
		for _, vars := range []map[string]any{
			{"n": "x", "p": sepsis, "s": "astrology"},
			{"n": "x", "p": sepsis, "m": "sometimes"},
			{"n": "", "p": sepsis},
			{"n": "x", "p": sepsis, "a": news2Agent, "s": "qsofa"},       // contradicts the asset
			{"n": "x", "p": sepsis, "a": s.assetID(demo.NEWS2ModelName)}, // a MODEL
			{"n": "x", "p": sepsis, "a": s.assetID(demo.QSOFAAgentName)}, // not installed here
		} {
			fails(t, s, key, create, vars, "BAD_USER_INPUT")
		}
		fails(t, s, key, create, map[string]any{"n": "x", "p": s.ProjectID("ICU Sepsis Bundle")}, "NOT_FOUND")
		fails(t, s, noScopes, create, map[string]any{"n": "x", "p": sepsis}, "FORBIDDEN")
	})

	run := `mutation($a: ID!, $p: String!, $in: JSON) { runAgent(agentId: $a, patientId: $p, input: $in) {
		id status patientId input output latencyMs tokensUsed startedAt completedAt error agent { id } } }`
	type session struct {
		ID, Status, PatientID string
		Output                struct {
			Skill          string
			Score          *int
			Band           string
			ObservationIDs []string
			Components     []json.RawMessage
		}
		LatencyMs, TokensUsed *int
		CompletedAt           *string
		Error                 *string
		Agent                 struct{ ID string }
	}
	t.Run("runAgent sync completes with NEWS2", func(t *testing.T) {
		var d struct{ RunAgent session }
		s.MustGraphQL(t, key, run, map[string]any{"a": ward7, "p": demo.DeterioratingPatientID, "in": map[string]any{"note": "rounds"}}, &d)
		r := d.RunAgent
		if r.Status != "COMPLETED" || r.CompletedAt == nil || r.Output.Skill != "news2" || r.Output.Score == nil || *r.Output.Score != 11 {
			t.Fatalf("session: %+v", r)
		}
		if r.TokensUsed == nil || *r.TokensUsed <= 0 || r.LatencyMs == nil || *r.LatencyMs < 0 || len(r.Output.ObservationIDs) == 0 {
			t.Fatalf("session accounting: %+v", r)
		}
		if n := s.outboxEvents("agent.run_completed", "sessionId", r.ID); n != 1 {
			t.Fatalf("agent.run_completed: %d", n)
		}
		if n := s.outboxEvents("agent.session.updated", "sessionId", r.ID); n != 1 {
			t.Fatalf("agent.session.updated: %d", n)
		}
		if n := s.count(`select count(*) from agent_sessions where id = $1 and status = 'COMPLETED' and tokens_used > 0`, r.ID); n != 1 {
			t.Fatal("session not stored")
		}
		var a struct {
			Agent struct{ Sessions []struct{ ID string } }
		}
		s.MustGraphQL(t, key, `query($a: ID!) { agent(id: $a) { sessions { id } } }`, map[string]any{"a": ward7}, &a)
		if len(a.Agent.Sessions) == 0 || a.Agent.Sessions[0].ID != r.ID {
			t.Fatalf("agent sessions: %+v", a)
		}
	})
	t.Run("runAgent fails clearly on missing vitals", func(t *testing.T) {
		// A patient without observations.
		if _, err := s.Pool().Exec(t.Context(), `insert into patients (id, org_id, synthetic, name) values ('pat_01jx0000000000000000000000', $1, true, '[]')`, demo.DemoOrgID); err != nil {
			t.Fatal(err)
		}
		var d struct{ RunAgent session }
		s.MustGraphQL(t, key, run, map[string]any{"a": ward7, "p": "pat_01jx0000000000000000000000"}, &d)
		r := d.RunAgent
		if r.Status != "FAILED" || r.Error == nil || !strings.Contains(*r.Error, "respiratory_rate") || r.CompletedAt == nil {
			t.Fatalf("session: %+v", r)
		}
		if n := s.outboxEvents("agent.run.failed", "sessionId", r.ID); n != 1 {
			t.Fatalf("agent.run.failed: %d", n)
		}
	})
	t.Run("runAgent NOT_FOUND for unknown, foreign and (to test keys) real patients", func(t *testing.T) {
		fails(t, s, key, run, map[string]any{"a": ward7, "p": "pat_01aaaaaaaaaaaaaaaaaaaaaaaa"}, "NOT_FOUND")
		fails(t, s, key, run, map[string]any{"a": ward7, "p": s.id(`select id from patients where org_id = $1 limit 1`, s.OrgID("northwind-health"))}, "NOT_FOUND")
		fails(t, s, testKey, run, map[string]any{"a": ward7, "p": demo.RealPatientID}, "NOT_FOUND")
		var d struct{ RunAgent session }
		s.MustGraphQL(t, testKey, run, map[string]any{"a": ward7, "p": demo.StablePatientID}, &d)
		if d.RunAgent.Status != "COMPLETED" || *d.RunAgent.Output.Score != 0 {
			t.Fatalf("stable patient: %+v", d.RunAgent)
		}
		fails(t, s, noScopes, run, map[string]any{"a": ward7, "p": demo.StablePatientID}, "FORBIDDEN")
		fails(t, s, key, run, map[string]any{"a": ward7, "p": demo.StablePatientID, "in": []int{1}}, "BAD_USER_INPUT")
		fails(t, s, key, run, map[string]any{"a": "agt_01aaaaaaaaaaaaaaaaaaaaaaaa", "p": demo.StablePatientID}, "NOT_FOUND")
	})
	t.Run("runAgent async is QUEUED then COMPLETED", func(t *testing.T) {
		var c struct{ CreateAgent struct{ ID string } }
		s.MustGraphQL(t, key, create, map[string]any{"n": "Async qSOFA", "p": sepsis, "s": "qsofa", "m": "async"}, &c)
		var d struct{ RunAgent session }
		s.MustGraphQL(t, key, run, map[string]any{"a": c.CreateAgent.ID, "p": demo.DeterioratingPatientID}, &d)
		if d.RunAgent.Status != "QUEUED" || d.RunAgent.CompletedAt != nil {
			t.Fatalf("async session: %+v", d.RunAgent)
		}
		id := d.RunAgent.ID
		servertest.Eventually(t, 10*time.Second, "the async session to complete", func() bool {
			return s.count(`select count(*) from agent_sessions where id = $1 and status = 'COMPLETED'`, id) == 1
		})
		var a struct {
			Agent struct{ Sessions []session }
		}
		s.MustGraphQL(t, key, `query($a: ID!) { agent(id: $a) { sessions { id status output } } }`, map[string]any{"a": c.CreateAgent.ID}, &a)
		if len(a.Agent.Sessions) != 1 || *a.Agent.Sessions[0].Output.Score != 2 {
			t.Fatalf("async result: %+v", a.Agent.Sessions)
		}
		// QUEUED, RUNNING, COMPLETED.
		if n := s.outboxEvents("agent.session.updated", "sessionId", id); n != 3 {
			t.Fatalf("agent.session.updated events: %d, want 3", n)
		}
	})
}

// TestWorkflowMutations: create, run, pause/resume/archive, cancel, and publishEvent.
func TestWorkflowMutations(t *testing.T) {
	s := start(t)
	key := s.DemoKey()
	noScopes := s.Key(demo.DemoOrgSlug, access.Live, access.ExecAgents)
	sepsis := s.ProjectID(demo.SepsisProjectName)
	ward7 := s.id(`select id from agents where name = $1`, demo.Ward7AgentName)

	create := `mutation($n: String!, $p: ID!, $s: [String!]!, $t: [String!]) { createWorkflow(name: $n, projectId: $p, steps: $s, triggers: $t) {
		id name status nodes steps triggers project { id } runs { id } } }`
	var wf struct {
		CreateWorkflow struct {
			ID, Status string
			Nodes      int
			Steps      []string
			Triggers   []string
		}
	}
	t.Run("createWorkflow", func(t *testing.T) {
		steps := []string{"load_patient", "latest_vitals", "score_news2", "run_agent:" + ward7, "assess_risk", "create_alert", "notify"}
		s.MustGraphQL(t, key, create, map[string]any{"n": "Vitals alert", "p": sepsis, "s": steps, "t": []string{"device.observation_received"}}, &wf)
		w := wf.CreateWorkflow
		if w.Status != "ACTIVE" || w.Nodes != 7 || len(w.Steps) != 7 || w.Triggers[0] != "device.observation_received" {
			t.Fatalf("workflow: %+v", w)
		}
		res := fails(t, s, key, create, map[string]any{"n": "x", "p": sepsis, "s": []string{"load_patient", "summon_doctor"}}, "BAD_USER_INPUT")
		if msg := fmt.Sprint(res.Errors[0].Extensions["fields"]); !strings.Contains(msg, "summon_doctor") || !strings.Contains(msg, "score_qsofa") {
			t.Fatalf("the error should name the bad step and the valid ones: %+v", res.Errors[0])
		}
		fails(t, s, key, create, map[string]any{"n": "x", "p": sepsis, "s": []string{}}, "BAD_USER_INPUT")
		fails(t, s, key, create, map[string]any{"n": "x", "p": sepsis, "s": []string{"run_agent:agt_01aaaaaaaaaaaaaaaaaaaaaaaa"}}, "BAD_USER_INPUT")
		fails(t, s, key, create, map[string]any{"n": "x", "p": sepsis, "s": []string{"notify"}, "t": []string{"Bad Pattern"}}, "BAD_USER_INPUT")
		fails(t, s, key, create, map[string]any{"n": "x", "p": s.ProjectID("ICU Sepsis Bundle"), "s": []string{"notify"}}, "NOT_FOUND")
		fails(t, s, noScopes, create, map[string]any{"n": "x", "p": sepsis, "s": []string{"notify"}}, "FORBIDDEN")
	})

	runQ := `mutation($w: ID!, $in: JSON) { runWorkflow(workflowId: $w, input: $in) { id status input startedAt completedAt durationMs workflow { id } } }`
	var run struct {
		RunWorkflow struct {
			ID, Status  string
			Input       struct{ PatientID string }
			CompletedAt *string
			Workflow    struct{ ID string }
		}
	}
	// The runner executes runs within milliseconds; a run that waits first stays cancellable.
	var slow struct{ CreateWorkflow struct{ ID string } }
	s.MustGraphQL(t, key, create, map[string]any{"n": "Slow", "p": sepsis, "s": []string{"wait:15m", "load_patient"}}, &slow)
	t.Run("runWorkflow queues a run and its command", func(t *testing.T) {
		s.MustGraphQL(t, key, runQ, map[string]any{"w": slow.CreateWorkflow.ID, "in": map[string]any{"patientId": demo.DeterioratingPatientID}}, &run)
		r := run.RunWorkflow
		if r.Status != "QUEUED" || r.Input.PatientID != demo.DeterioratingPatientID || r.CompletedAt != nil || r.Workflow.ID != slow.CreateWorkflow.ID {
			t.Fatalf("run: %+v", r)
		}
		if n := s.count(`select count(*) from outbox where topic = $2 and key = $1 and value->>'runId' = $1 and (value->>'attempt')::int = 1`, r.ID, s.Topics().WorkflowRuns); n != 1 {
			t.Fatalf("run command in the outbox: %d", n)
		}
		// The mutation queues exactly one QUEUED update; the runner, which this test does not
		// control, may already have added RUNNING.
		if n := s.count(`select count(*) from outbox where topic = $2 and value->>'type' = 'workflow.run.updated'
and value->'payload'->>'runId' = $1 and value->'payload'->>'status' = 'QUEUED'`, r.ID, s.Topics().Events); n != 1 {
			t.Fatalf("workflow.run.updated to QUEUED: %d", n)
		}
		var q struct {
			WorkflowRun struct{ Status string }
			Workflow    struct{ Runs []struct{ ID string } }
		}
		s.MustGraphQL(t, key, `query($r: ID!, $w: ID!) { workflowRun(id: $r) { status } workflow(id: $w) { runs { id } } }`,
			map[string]any{"r": r.ID, "w": slow.CreateWorkflow.ID}, &q)
		if (q.WorkflowRun.Status != "QUEUED" && q.WorkflowRun.Status != "RUNNING") || len(q.Workflow.Runs) != 1 {
			t.Fatalf("reads: %+v", q)
		}
		fails(t, s, key, runQ, map[string]any{"w": slow.CreateWorkflow.ID, "in": "not an object"}, "BAD_USER_INPUT")
		fails(t, s, key, runQ, map[string]any{"w": "wf_01aaaaaaaaaaaaaaaaaaaaaaaa"}, "NOT_FOUND")
	})

	t.Run("cancelWorkflowRun", func(t *testing.T) {
		q := `mutation($r: ID!) { cancelWorkflowRun(runId: $r) { status completedAt durationMs } }`
		var d struct {
			CancelWorkflowRun struct {
				Status      string
				CompletedAt *string
				DurationMs  *int
			}
		}
		s.MustGraphQL(t, key, q, map[string]any{"r": run.RunWorkflow.ID}, &d)
		if d.CancelWorkflowRun.Status != "CANCELLED" || d.CancelWorkflowRun.CompletedAt == nil || d.CancelWorkflowRun.DurationMs == nil {
			t.Fatalf("cancel: %+v", d)
		}
		fails(t, s, key, q, map[string]any{"r": run.RunWorkflow.ID}, "CONFLICT")
		if n := s.outboxEvents("workflow.run.completed", "run_id", run.RunWorkflow.ID); n != 1 {
			t.Fatalf("workflow.run.completed: %d", n)
		}
		if n := s.outboxEvents("workflow.completed", "runId", run.RunWorkflow.ID); n != 1 {
			t.Fatalf("workflow.completed: %d", n)
		}
	})

	t.Run("pause, resume, archive", func(t *testing.T) {
		id := wf.CreateWorkflow.ID
		var d struct {
			PauseWorkflow, ResumeWorkflow, ArchiveWorkflow struct{ Status string }
		}
		s.MustGraphQL(t, key, `mutation($id: ID!) { pauseWorkflow(id: $id) { status } }`, map[string]any{"id": id}, &d)
		if d.PauseWorkflow.Status != "PAUSED" {
			t.Fatalf("pause: %+v", d)
		}
		fails(t, s, key, runQ, map[string]any{"w": id}, "CONFLICT")
		s.MustGraphQL(t, key, `mutation($id: ID!) { resumeWorkflow(id: $id) { status } }`, map[string]any{"id": id}, &d)
		if d.ResumeWorkflow.Status != "ACTIVE" {
			t.Fatalf("resume: %+v", d)
		}
		s.MustGraphQL(t, key, `mutation($id: ID!) { archiveWorkflow(id: $id) { status } }`, map[string]any{"id": id}, &d)
		if d.ArchiveWorkflow.Status != "ARCHIVED" {
			t.Fatalf("archive: %+v", d)
		}
		fails(t, s, key, `mutation($id: ID!) { resumeWorkflow(id: $id) { status } }`, map[string]any{"id": id}, "CONFLICT")
		fails(t, s, key, runQ, map[string]any{"w": id}, "CONFLICT")
		fails(t, s, noScopes, `mutation($id: ID!) { pauseWorkflow(id: $id) { status } }`, map[string]any{"id": id}, "FORBIDDEN")
	})

	t.Run("publishEvent", func(t *testing.T) {
		q := `mutation($t: String!, $p: JSON!, $prj: ID!) { publishEvent(type: $t, payload: $p, projectId: $prj) { id type payload source timestamp projectId severity } }`
		var d struct {
			PublishEvent struct {
				ID, Type, Source, ProjectID, Severity, Timestamp string
				Payload                                          struct{ Glucose int }
			}
		}
		s.MustGraphQL(t, key, q, map[string]any{"t": "lab.glucose_measured", "p": map[string]any{"glucose": 140}, "prj": sepsis}, &d)
		e := d.PublishEvent
		if !strings.HasPrefix(e.ID, "evt_") || e.Source != "integration" || e.Payload.Glucose != 140 || e.ProjectID != sepsis {
			t.Fatalf("event: %+v", e)
		}
		// Straight to the events topic (feed.Config.Producer), so the log is where it shows.
		var logged struct{ Events []struct{ ID string } }
		servertest.Eventually(t, 30*time.Second, "the published event in the log", func() bool {
			s.MustGraphQL(t, key, `query($p: ID!) { events(projectId: $p, type: "lab.glucose_measured", limit: 100) { id } }`, map[string]any{"p": sepsis}, &logged)
			return slices.ContainsFunc(logged.Events, func(l struct{ ID string }) bool { return l.ID == e.ID })
		})
		for _, vars := range []map[string]any{
			{"t": "NoDots", "p": map[string]any{}, "prj": sepsis},
			{"t": "a..b", "p": map[string]any{}, "prj": sepsis},
			{"t": "lab.result", "p": []int{1, 2}, "prj": sepsis},
			{"t": "lab.result", "p": map[string]any{"blob": strings.Repeat("x", 256<<10)}, "prj": sepsis},
		} {
			fails(t, s, key, q, vars, "BAD_USER_INPUT")
		}
		fails(t, s, key, q, map[string]any{"t": "lab.result", "p": map[string]any{}, "prj": s.ProjectID("ICU Sepsis Bundle")}, "NOT_FOUND")
		fails(t, s, noScopes, q, map[string]any{"t": "lab.result", "p": map[string]any{}, "prj": sepsis}, "FORBIDDEN")
	})
}

// TestWebhookOperations: the webhook fields, served by the webhook service.
func TestWebhookOperations(t *testing.T) {
	s := start(t)
	key := s.DemoKey()
	other := s.Key("northwind-health", access.Live, access.Scopes...)
	sepsis := s.ProjectID(demo.SepsisProjectName)

	create := `mutation($p: ID!, $u: String!, $e: [String!]!) { createWebhook(projectId: $p, url: $u, events: $e) {
		id url events status secret failureCount lastDeliveredAt createdAt project { id } } }`
	var c struct {
		CreateWebhook struct {
			ID, URL, Status, Secret string
			Events                  []string
			FailureCount            int
			Project                 struct{ ID string }
		}
	}
	s.MustGraphQL(t, key, create, map[string]any{"p": sepsis, "u": "https://hooks.example.org/carehub", "e": []string{"agent.*", "workflow.run.completed"}}, &c)
	w := c.CreateWebhook
	if !strings.HasPrefix(w.ID, "wh_") || !strings.HasPrefix(w.Secret, "whsec_") || w.Status != "active" || w.Project.ID != sepsis || len(w.Events) != 2 {
		t.Fatalf("created: %+v", w)
	}
	fails(t, s, key, create, map[string]any{"p": sepsis, "u": "https://hooks.example.org/x", "e": []string{"Not A Pattern"}}, "BAD_USER_INPUT")
	fails(t, s, other, create, map[string]any{"p": sepsis, "u": "https://hooks.example.org/x", "e": []string{"agent.*"}}, "NOT_FOUND")

	var list struct {
		Webhooks []struct{ ID, Secret string }
	}
	s.MustGraphQL(t, key, `query($p: ID!) { webhooks(projectId: $p) { id secret } }`, map[string]any{"p": sepsis}, &list)
	if len(list.Webhooks) != 1 || list.Webhooks[0].Secret == w.Secret {
		t.Fatalf("listing: %+v (the secret must be masked)", list.Webhooks)
	}
	fails(t, s, other, `query($p: ID!) { webhooks(projectId: $p) { id } }`, map[string]any{"p": sepsis}, "NOT_FOUND")

	var u struct{ UpdateWebhook struct{ Status string } }
	s.MustGraphQL(t, key, `mutation($id: ID!) { updateWebhook(id: $id, status: "paused") { status } }`, map[string]any{"id": w.ID}, &u)
	if u.UpdateWebhook.Status != "paused" {
		t.Fatalf("update: %+v", u)
	}
	fails(t, s, key, `mutation($id: ID!) { updateWebhook(id: $id, url: "ftp://nope") { status } }`, map[string]any{"id": w.ID}, "BAD_USER_INPUT")
	var r struct{ RotateWebhookSecret struct{ Secret string } }
	s.MustGraphQL(t, key, `mutation($id: ID!) { rotateWebhookSecret(id: $id) { secret } }`, map[string]any{"id": w.ID}, &r)
	if !strings.HasPrefix(r.RotateWebhookSecret.Secret, "whsec_") || r.RotateWebhookSecret.Secret == w.Secret {
		t.Fatalf("rotate: %+v", r)
	}
	var d struct {
		WebhookDeliveries []struct{ ID string }
	}
	s.MustGraphQL(t, key, `query($id: ID!) { webhookDeliveries(webhookId: $id) { id status attempts { id } webhook { id } } }`, map[string]any{"id": w.ID}, &d)
	fails(t, s, key, `query($id: ID!) { webhookDeliveries(webhookId: $id, limit: 0) { id } }`, map[string]any{"id": w.ID}, "BAD_USER_INPUT")
	fails(t, s, key, `mutation { redeliverWebhookDelivery(deliveryId: "dlv_01aaaaaaaaaaaaaaaaaaaaaaaa") { id } }`, nil, "NOT_FOUND")
	var rec struct{ RecoverWebhookDeliveries int }
	s.MustGraphQL(t, key, `mutation($id: ID!, $since: DateTime!) { recoverWebhookDeliveries(webhookId: $id, since: $since) }`,
		map[string]any{"id": w.ID, "since": time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)}, &rec)
	fails(t, s, other, `mutation($id: ID!) { rotateWebhookSecret(id: $id) { id } }`, map[string]any{"id": w.ID}, "NOT_FOUND")
	fails(t, s, s.Key(demo.DemoOrgSlug, access.Live, access.ExecAgents), `mutation($id: ID!) { deleteWebhook(id: $id) }`, map[string]any{"id": w.ID}, "FORBIDDEN")
	var del struct{ DeleteWebhook bool }
	s.MustGraphQL(t, key, `mutation($id: ID!) { deleteWebhook(id: $id) }`, map[string]any{"id": w.ID}, &del)
	if !del.DeleteWebhook {
		t.Fatal("deleteWebhook returned false")
	}
	fails(t, s, key, `mutation($id: ID!) { deleteWebhook(id: $id) }`, map[string]any{"id": w.ID}, "NOT_FOUND")
}
