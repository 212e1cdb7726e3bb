package subscriptiontest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"carehub/api/ws/wstest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

const (
	agentSessionQuery = `subscription($id: ID!) {
  agentSessionUpdated(agentId: $id) { id status patientId input output latencyMs tokensUsed startedAt completedAt agent { id } }
}`
	workflowRunQuery = `subscription($id: ID!) {
  workflowRunUpdated(workflowId: $id) { id status input output durationMs startedAt completedAt workflow { id } }
}`
	deploymentQuery = `subscription($id: ID!) {
  deploymentStatusChanged(deploymentId: $id) { id status environment replicas endpoint hipaaMode deployedAt project { id } }
}`
)

// TestConnectionInitRefused: a connection_init without a valid credential closes the socket with
// 4403 in both protocols, before any operation can run.
func TestConnectionInitRefused(t *testing.T) {
	n := startNode(t)
	cases := []struct{ name, authorization string }{
		{"missing", ""},
		{"not a key", "Bearer nonsense"},
		{"unknown key", "Bearer chk_live_0123456789abcdefghijABCDEFGHIJ01"},
		{"empty bearer", "Bearer "},
	}
	for _, p := range protocols {
		for _, tc := range cases {
			t.Run(p.name+"/"+tc.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				c, err := p.dial(ctx, n.wsURL(), tc.authorization)
				if err == nil {
					c.Close()
					t.Fatal("connection_init was acknowledged")
				}
				if code := websocket.CloseStatus(err); code != 4403 {
					t.Fatalf("dial: %v (close code %d), want close 4403", err, code)
				}
			})
		}
	}
	// The refused sockets left nothing behind.
	if got := n.metric(t, "carehub_ws_operations"); got != 0 {
		t.Fatalf("%v operations active after refused sockets", got)
	}
}

// TestSubscriptionScopes: agentSessionUpdated needs exec:agents and workflowRunUpdated
// exec:workflows (DECISIONS §2); without the scope the subscription fails at once with
// FORBIDDEN, with it the same subscription is accepted. eventStream and
// deploymentStatusChanged need no scope.
func TestSubscriptionScopes(t *testing.T) {
	n := startNode(t)
	admin := n.DemoKey()
	sepsis := n.projectID(t, admin, demo.DemoOrgSlug, demo.SepsisProjectName)
	agentID := n.agentID(t, admin, sepsis, demo.Ward7AgentName)
	workflowID := n.workflowID(t, admin, sepsis, demo.DeteriorationWorkflowName)

	noAgents := n.Key(demo.DemoOrgSlug, access.Live, access.ExecWorkflows, access.AdminOrg)
	noWorkflows := n.Key(demo.DemoOrgSlug, access.Live, access.ExecAgents, access.AdminOrg)
	cases := []struct {
		name, key, query, id string
		forbidden            bool
	}{
		{"agentSessionUpdated without exec:agents", noAgents, agentSessionQuery, agentID, true},
		{"agentSessionUpdated with exec:agents", noWorkflows, agentSessionQuery, agentID, false},
		{"workflowRunUpdated without exec:workflows", noWorkflows, workflowRunQuery, workflowID, true},
		{"workflowRunUpdated with exec:workflows", noAgents, workflowRunQuery, workflowID, false},
	}
	for _, p := range protocols {
		for i, tc := range cases {
			t.Run(p.name+"/"+tc.name, func(t *testing.T) {
				c := n.dial(t, p, tc.key)
				id := fmt.Sprint("op", i)
				ch := subscribe(t, c, id, tc.query, map[string]any{"id": tc.id})
				if tc.forbidden {
					if codes := rejection(t, c, id, ch); !slices.Equal(codes, []string{"FORBIDDEN"}) {
						t.Fatalf("rejected with %v, want FORBIDDEN", codes)
					}
					if n.subscribers(t) != 0 {
						t.Fatal("a refused subscription registered with the fan-out")
					}
					return
				}
				// Accepted: it registers with the fan-out and stays open.
				n.waitSubscribers(t, 1)
				select {
				case raw, ok := <-ch:
					t.Fatalf("accepted subscription delivered %s (open %v, err %v) with nothing happening", raw, ok, c.Err(id))
				case <-time.After(200 * time.Millisecond):
				}
				c.Close()
				n.waitSubscribers(t, 0)
			})
		}
	}
}

// TestTenancy: another organization's project, agent, workflow or deployment is NOT_FOUND at
// subscribe time, worded exactly as one that does not exist (existence does not leak); and two
// organizations publishing into their own projects at once each see only their own events.
func TestTenancy(t *testing.T) {
	n := startNode(t)
	demoKey := n.DemoKey()
	northKey := n.Key("northwind-health", access.Live, access.Scopes...)
	demoProject := n.projectID(t, demoKey, demo.DemoOrgSlug, demo.SepsisProjectName)
	northProject := n.projectID(t, northKey, "northwind-health", "ICU Sepsis Bundle")
	northAgent := n.agentID(t, northKey, northProject, "ICU Sepsis Sentinel")
	var wf struct{ CreateWorkflow struct{ ID string } }
	n.mustGQL(t, northKey, `mutation($p: ID!) { createWorkflow(name: "ICU screen", projectId: $p, steps: ["load_patient"]) { id } }`,
		map[string]any{"p": northProject}, &wf)
	northDeployment := n.createDeployment(t, northKey, northProject)
	n.ready(t, demoKey, demoProject)
	n.ready(t, northKey, northProject)

	t.Run("other tenant is NOT_FOUND", func(t *testing.T) {
		cases := []struct {
			field, query, foreign, missing string
		}{
			{"eventStream", `subscription($id: ID!) { eventStream(projectId: $id) { id } }`, northProject, "prj_01k0000000000000000000000z"},
			{"agentSessionUpdated", agentSessionQuery, northAgent, "agt_01k0000000000000000000000z"},
			{"workflowRunUpdated", workflowRunQuery, wf.CreateWorkflow.ID, "wf_01k0000000000000000000000z"},
			{"deploymentStatusChanged", deploymentQuery, northDeployment, "dep_01k0000000000000000000000z"},
		}
		for _, p := range protocols {
			c := n.dial(t, p, demoKey)
			for _, tc := range cases {
				foreign := n.rejectionMessage(t, c, tc.query, tc.foreign)
				missing := n.rejectionMessage(t, c, tc.query, tc.missing)
				if foreign.code != "NOT_FOUND" || missing.code != "NOT_FOUND" {
					t.Errorf("%s %s: another tenant's: %+v; a missing one: %+v; want NOT_FOUND for both", p.name, tc.field, foreign, missing)
				}
				// The same answer but for the id itself.
				if f, m := strings.ReplaceAll(foreign.message, tc.foreign, "<id>"), strings.ReplaceAll(missing.message, tc.missing, "<id>"); f != m {
					t.Errorf("%s %s: another tenant's says %q, a missing one %q", p.name, tc.field, foreign.message, missing.message)
				}
			}
		}
		if got := n.subscribers(t); got != 0 {
			t.Fatalf("%d refused subscriptions registered with the fan-out", got)
		}
	})

	t.Run("each tenant sees its own events", func(t *testing.T) {
		type tenant struct {
			name, key, project string
			arrivals           []<-chan arrival
		}
		tenants := []*tenant{{name: "demo-health", key: demoKey, project: demoProject}, {name: "northwind-health", key: northKey, project: northProject}}
		for _, tn := range tenants {
			for _, p := range protocols {
				c := n.dial(t, p, tn.key)
				tn.arrivals = append(tn.arrivals, watch(subscribe(t, c, "all", eventStreamQuery, map[string]any{"projectId": tn.project}), "eventStream"))
			}
		}
		n.waitSubscribers(t, 2*len(protocols))

		const each = 20
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		errs := make(chan error, len(tenants))
		for _, tn := range tenants {
			go func() {
				var err error
				for i := range each + 1 {
					typ := "tenant.event"
					if i == each {
						typ = "tenant.sentinel"
					}
					if _, err = n.publish(ctx, tn.key, tn.project, typ, map[string]any{"seq": i, "tenant": tn.name}); err != nil {
						break
					}
				}
				errs <- err
			}()
		}
		for range tenants {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		for _, tn := range tenants {
			for i, arrivals := range tn.arrivals {
				var seqs []int
				for {
					a := next(t, arrivals, 10*time.Second, fmt.Sprintf("%s subscriber %d", tn.name, i))
					if a.ev.ProjectID != tn.project {
						t.Fatalf("%s subscriber %d received another project's event %s", tn.name, i, a.obj)
					}
					if !strings.HasPrefix(a.ev.Type, "tenant.") {
						continue // the project's own platform events (its deployment starting, say)
					}
					if a.ev.Payload["tenant"] != tn.name {
						t.Fatalf("%s subscriber %d received another tenant's event %s", tn.name, i, a.obj)
					}
					if a.ev.Type == "tenant.sentinel" {
						break
					}
					seqs = append(seqs, a.ev.seq())
				}
				if len(seqs) != each || !slices.IsSorted(seqs) || seqs[0] != 0 {
					t.Fatalf("%s subscriber %d received seqs %v, want 0..%d in order", tn.name, i, seqs, each-1)
				}
			}
		}
	})
}

type gqlError struct{ code, message string }

// rejectionMessage subscribes to query with $id and returns the single error it is rejected with.
func (n *testNode) rejectionMessage(t *testing.T, c *wstest.Client, query, id string) gqlError {
	t.Helper()
	opID := "reject-" + id
	ch := subscribe(t, c, opID, query, map[string]any{"id": id})
	codes := rejection(t, c, opID, ch)
	var oe *wstest.OperationError
	if !errors.As(c.Err(opID), &oe) || len(oe.Errors) != 1 || len(codes) != 1 {
		t.Fatalf("rejected with %v, want one error", c.Err(opID))
	}
	var e struct{ Message string }
	_ = json.Unmarshal(oe.Errors[0], &e)
	return gqlError{codes[0], e.Message}
}

func (n *testNode) agentID(t testing.TB, key, projectID, name string) string {
	t.Helper()
	var data struct{ Agents []struct{ ID, Name string } }
	n.mustGQL(t, key, `query($p: ID!) { agents(projectId: $p, limit: 100) { id name } }`, map[string]any{"p": projectID}, &data)
	for _, a := range data.Agents {
		if a.Name == name {
			return a.ID
		}
	}
	t.Fatalf("project %s has no agent %q", projectID, name)
	return ""
}

func (n *testNode) workflowID(t testing.TB, key, projectID, name string) string {
	t.Helper()
	var data struct{ Workflows []struct{ ID, Name string } }
	n.mustGQL(t, key, `query($p: ID!) { workflows(projectId: $p, limit: 100) { id name } }`, map[string]any{"p": projectID}, &data)
	for _, w := range data.Workflows {
		if w.Name == name {
			return w.ID
		}
	}
	t.Fatalf("project %s has no workflow %q", projectID, name)
	return ""
}

// createDeployment deploys the first installation of the project (staging) and returns its id.
func (n *testNode) createDeployment(t testing.TB, key, projectID string) string {
	t.Helper()
	var ins struct{ Installations []struct{ ID string } }
	n.mustGQL(t, key, `query($p: ID!) { installations(projectId: $p) { id } }`, map[string]any{"p": projectID}, &ins)
	if len(ins.Installations) == 0 {
		t.Fatalf("project %s has no installation", projectID)
	}
	var dep struct{ CreateDeployment struct{ ID, Status string } }
	n.mustGQL(t, key, `mutation($i: ID!) { createDeployment(installationId: $i, environment: "staging") { id status } }`,
		map[string]any{"i": ins.Installations[0].ID}, &dep)
	return dep.CreateDeployment.ID
}
