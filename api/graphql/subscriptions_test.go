package graphql_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/api/ws/wstest"
	"carehub/kernel/access"
	"carehub/kernel/events"
	"carehub/storage/demo"
)

// TestSubscriptions drives the subscription fields over WebSocket, feeding events into the events
// topic the way the outbox relay does, and checks filtering, tenancy and scopes.
func TestSubscriptions(t *testing.T) {
	s := start(t)
	key := s.DemoKey()
	sepsis := s.ProjectID(demo.SepsisProjectName)
	rpm := s.ProjectID(demo.RPMProjectName)
	ward7 := s.id(`select id from agents where name = $1`, demo.Ward7AgentName)
	workflow := s.id(`select id from workflows where name = $1`, demo.DeteriorationWorkflowName)

	prod, err := kgo.NewClient(kgo.SeedBrokers(s.Brokers()...), kgo.DefaultProduceTopic(s.Topics().Events))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	send := func(typ, orgID, projectID string, payload map[string]any) error {
		ev, err := events.New(typ, orgID, projectID, events.SourceIntegration, events.SeverityInfo, payload)
		if err != nil {
			return err
		}
		b, _ := json.Marshal(ev)
		return prod.ProduceSync(context.Background(), &kgo.Record{Key: []byte(projectID), Value: b}).FirstErr()
	}
	produce := func(typ, orgID, projectID string, payload map[string]any) {
		t.Helper()
		if err := send(typ, orgID, projectID, payload); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dial := func(k string) *wstest.Client {
		c, err := wstest.Dial(ctx, "ws://"+s.Addr()+"/graphql", "Bearer "+k)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	c := dial(key)

	// The fan-out reads from the tail: a subscription sees what is published once it is registered.
	stream, err := c.Subscribe(ctx, "stream", `subscription($p: ID!) { eventStream(projectId: $p, types: ["lab.*"]) { id type payload projectId source } }`,
		map[string]any{"p": sepsis})
	if err != nil {
		t.Fatal(err)
	}
	s.WaitSubscribers(1)
	next := func(ch <-chan json.RawMessage, what string) json.RawMessage {
		t.Helper()
		select {
		case m, ok := <-ch:
			if !ok {
				t.Fatalf("%s: subscription ended: %v", what, c.Err("stream"))
			}
			return m
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: nothing arrived", what)
		}
		return nil
	}

	t.Run("eventStream filters by project, type and tenant", func(t *testing.T) {
		produce("lab.result", s.OrgID("northwind-health"), sepsis, map[string]any{"n": 1}) // another tenant's (forged) event
		produce("lab.result", demo.DemoOrgID, rpm, map[string]any{"n": 2})                 // another project
		produce("agent.run_completed", demo.DemoOrgID, sepsis, map[string]any{"n": 3})     // another type
		produce("lab.result", demo.DemoOrgID, sepsis, map[string]any{"n": 4})
		var got struct {
			Data struct {
				EventStream struct {
					Type, ProjectID string
					Payload         struct{ N int }
				}
			}
		}
		if err := json.Unmarshal(next(stream, "lab.result"), &got); err != nil {
			t.Fatal(err)
		}
		if e := got.Data.EventStream; e.Type != "lab.result" || e.Payload.N != 4 || e.ProjectID != sepsis {
			t.Fatalf("delivered %+v", e)
		}
	})

	t.Run("agentSessionUpdated pushes the reloaded session", func(t *testing.T) {
		sessions, err := c.Subscribe(ctx, "sessions", `subscription($a: ID!) { agentSessionUpdated(agentId: $a) { id status output agent { name } } }`,
			map[string]any{"a": ward7})
		if err != nil {
			t.Fatal(err)
		}
		s.WaitSubscribers(2)
		var run struct{ RunAgent struct{ ID string } }
		s.MustGraphQL(t, key, `mutation($a: ID!, $p: String!) { runAgent(agentId: $a, patientId: $p) { id } }`,
			map[string]any{"a": ward7, "p": demo.DeterioratingPatientID}, &run)
		payload := map[string]any{"sessionId": run.RunAgent.ID, "agentId": ward7, "patientId": demo.DeterioratingPatientID, "status": "COMPLETED"}
		produce("agent.session.updated", demo.DemoOrgID, sepsis, payload)
		produce("agent.run_completed", demo.DemoOrgID, sepsis, payload) // the same change: pushed once
		var got struct {
			Data struct {
				AgentSessionUpdated struct {
					ID, Status string
					Output     struct{ Score int }
					Agent      struct{ Name string }
				}
			}
		}
		if err := json.Unmarshal(next(sessions, "session"), &got); err != nil {
			t.Fatal(err)
		}
		if u := got.Data.AgentSessionUpdated; u.ID != run.RunAgent.ID || u.Status != "COMPLETED" || u.Output.Score != 11 || u.Agent.Name != demo.Ward7AgentName {
			t.Fatalf("session pushed: %+v", u)
		}
		select {
		case m := <-sessions:
			t.Fatalf("the same change was pushed twice: %s", m)
		case <-time.After(time.Second):
		}
	})

	t.Run("workflowRunUpdated and deploymentStatusChanged", func(t *testing.T) {
		runs, err := c.Subscribe(ctx, "runs", `subscription($w: ID!) { workflowRunUpdated(workflowId: $w) { id status workflow { name } } }`, map[string]any{"w": workflow})
		if err != nil {
			t.Fatal(err)
		}
		s.WaitSubscribers(3)
		var run struct{ RunWorkflow struct{ ID string } }
		s.MustGraphQL(t, key, `mutation($w: ID!) { runWorkflow(workflowId: $w) { id } }`, map[string]any{"w": workflow}, &run)
		produce("workflow.run.updated", demo.DemoOrgID, sepsis, map[string]any{"runId": run.RunWorkflow.ID, "workflowId": workflow, "status": "QUEUED"})
		var got struct {
			Data struct {
				WorkflowRunUpdated struct {
					ID, Status string
					Workflow   struct{ Name string }
				}
			}
		}
		// The runner moves the real run on meanwhile; its own updates may come first.
		for got.Data.WorkflowRunUpdated.Status != "QUEUED" {
			if err := json.Unmarshal(next(runs, "run"), &got); err != nil {
				t.Fatal(err)
			}
		}
		if u := got.Data.WorkflowRunUpdated; u.ID != run.RunWorkflow.ID || u.Status != "QUEUED" || u.Workflow.Name != demo.DeteriorationWorkflowName {
			t.Fatalf("run pushed: %+v", u)
		}

		ins := s.id(`select i.id from installations i join assets a on a.id = i.asset_id where i.project_id = $1 and a.name = $2`, sepsis, demo.NEWS2ModelName)
		var dep struct{ CreateDeployment struct{ ID string } }
		s.MustGraphQL(t, key, `mutation($i: ID!) { createDeployment(installationId: $i, environment: "staging") { id } }`, map[string]any{"i": ins}, &dep)
		deps, err := c.Subscribe(ctx, "deps", `subscription($d: ID!) { deploymentStatusChanged(deploymentId: $d) { id status environment } }`, map[string]any{"d": dep.CreateDeployment.ID})
		if err != nil {
			t.Fatal(err)
		}
		s.WaitSubscribers(4)
		produce("deployment.status_changed", demo.DemoOrgID, sepsis, map[string]any{"deploymentId": dep.CreateDeployment.ID, "from": "", "to": "PENDING"})
		var d struct {
			Data struct {
				DeploymentStatusChanged struct{ ID, Status, Environment string }
			}
		}
		// The controller may already have moved the deployment to RUNNING; that push can come first.
		for d.Data.DeploymentStatusChanged.Status != "PENDING" {
			if err := json.Unmarshal(next(deps, "deployment"), &d); err != nil {
				t.Fatal(err)
			}
		}
		if u := d.Data.DeploymentStatusChanged; u.ID != dep.CreateDeployment.ID || u.Status != "PENDING" || u.Environment != "staging" {
			t.Fatalf("deployment pushed: %+v", u)
		}
	})

	t.Run("scope and tenancy are checked at subscribe time", func(t *testing.T) {
		weak := dial(s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients))
		for id, tc := range map[string]struct {
			client *wstest.Client
			query  string
			vars   map[string]any
			code   string
		}{
			"no-exec-agents":    {weak, `subscription($a: ID!) { agentSessionUpdated(agentId: $a) { id } }`, map[string]any{"a": ward7}, "FORBIDDEN"},
			"no-exec-workflows": {weak, `subscription($w: ID!) { workflowRunUpdated(workflowId: $w) { id } }`, map[string]any{"w": workflow}, "FORBIDDEN"},
			"foreign-project":   {c, `subscription($p: ID!) { eventStream(projectId: $p) { id } }`, map[string]any{"p": s.ProjectID("ICU Sepsis Bundle")}, "NOT_FOUND"},
			"bad-pattern":       {c, `subscription($p: ID!) { eventStream(projectId: $p, types: ["Not A Type"]) { id } }`, map[string]any{"p": sepsis}, "BAD_USER_INPUT"},
		} {
			ch, err := tc.client.Subscribe(ctx, id, tc.query, tc.vars)
			if err != nil {
				t.Fatal(err)
			}
			var payloads []string
			for m := range ch {
				payloads = append(payloads, string(m))
			}
			var opErr *wstest.OperationError
			err = tc.client.Err(id)
			if errors.As(err, &opErr) {
				payloads = append(payloads, string(opErr.Errors[0]))
			}
			if len(payloads) != 1 || !strings.Contains(payloads[0], `"code":"`+tc.code+`"`) {
				t.Errorf("%s: got %v (err %v), want one %s error", id, payloads, err, tc.code)
			}
		}
	})

	t.Run("connection_init with a bad key is refused", func(t *testing.T) {
		if _, err := wstest.Dial(ctx, "ws://"+s.Addr()+"/graphql", "Bearer chk_live_00000000000000000000000000000000"); err == nil {
			t.Fatal("dial with a bad key succeeded")
		}
	})
}
