package workflows_test

// Black-box tests: a whole carehub node (e2e/servertest) driven through its public API.
// They need the node to run the workflow runner and triggers (processors role) and the outbox
// relay, as the composition root wires them.

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"carehub/api/ws/wstest"
	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
	"carehub/storage/postgres"
)

type runView struct {
	ID, Status  string
	DurationMs  *int
	CompletedAt *string
	Output      struct {
		Severity       string
		AlertGenerated bool
		ReportIDs      []string
		Claims         int
		Steps          []struct {
			Step, Status, StartedAt string
		}
		Current *struct{ Step string }
	}
	Error *string
}

const runQuery = `query($id: ID!) { workflowRun(id: $id) { id status durationMs completedAt output } }`

func createWorkflow(t testing.TB, s *servertest.Server, key, project, name string, steps []string, triggers ...string) string {
	t.Helper()
	var d struct{ CreateWorkflow struct{ ID string } }
	vars := map[string]any{"n": name, "p": project, "s": steps}
	if triggers != nil {
		vars["t"] = triggers
	}
	s.MustGraphQL(t, key, `mutation($n: String!, $p: ID!, $s: [String!]!, $t: [String!]) { createWorkflow(name: $n, projectId: $p, steps: $s, triggers: $t) { id } }`,
		vars, &d)
	return d.CreateWorkflow.ID
}

func runWorkflow(t testing.TB, s *servertest.Server, key, workflow, patient string) string {
	t.Helper()
	var d struct{ RunWorkflow struct{ ID, Status string } }
	s.MustGraphQL(t, key, `mutation($w: ID!, $in: JSON) { runWorkflow(workflowId: $w, input: $in) { id status } }`,
		map[string]any{"w": workflow, "in": map[string]any{"patient_id": patient}}, &d)
	if d.RunWorkflow.Status != "QUEUED" {
		t.Fatalf("runWorkflow: %+v", d.RunWorkflow)
	}
	return d.RunWorkflow.ID
}

// waitRun polls workflowRun until cond holds.
func waitRun(t testing.TB, s *servertest.Server, key, id string, timeout time.Duration, what string, cond func(runView) bool) runView {
	t.Helper()
	var v runView
	servertest.Eventually(t, timeout, what, func() bool {
		var d struct{ WorkflowRun runView }
		s.MustGraphQL(t, key, runQuery, map[string]any{"id": id}, &d)
		v = d.WorkflowRun
		return cond(v)
	})
	return v
}

func finished(v runView) bool { return v.CompletedAt != nil }

// receiver is a webhook endpoint that keeps the bodies it receives.
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	bodies [][]byte
}

func newReceiver(t testing.TB) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.bodies = append(r.bodies, b)
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.Close)
	return r
}

// find returns the first received body whose event is typ and whose payload has key = value.
func (r *receiver) find(typ, key, value string) map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.bodies {
		var m map[string]any
		if json.Unmarshal(b, &m) != nil || m["event"] != typ {
			continue
		}
		if p, _ := m["payload"].(map[string]any); p[key] == value {
			return m
		}
	}
	return nil
}

// TestWorkflowRunEndToEnd: [load_patient, score_news2, assess_risk, create_alert] on the
// deteriorating patient (NEWS2 11) ends COMPLETED with an alert and CRITICAL severity; a webhook
// on workflow.* receives workflow.run.completed in the spec's delivered shape, the event log has
// it, and a workflowRunUpdated subscriber sees the run finish.
func TestWorkflowRunEndToEnd(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	sepsis := s.ProjectID(demo.SepsisProjectName)
	hook := newReceiver(t)
	s.MustGraphQL(t, key, `mutation($p: ID!, $u: String!) { createWebhook(projectId: $p, url: $u, events: ["workflow.*"]) { id } }`,
		map[string]any{"p": sepsis, "u": hook.URL}, nil)
	wf := createWorkflow(t, s, key, sepsis, "Deterioration", []string{"load_patient", "score_news2", "assess_risk", "create_alert"})

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ws, err := wstest.Dial(ctx, "ws"+strings.TrimPrefix(s.URL, "http")+"/graphql", "Bearer "+key)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	updates, err := ws.Subscribe(ctx, "runs", `subscription($w: ID!) { workflowRunUpdated(workflowId: $w) { id status } }`, map[string]any{"w": wf})
	if err != nil {
		t.Fatal(err)
	}
	s.WaitSubscribers(1) // the subscription is registered before the run starts

	id := runWorkflow(t, s, key, wf, demo.DeterioratingPatientID)
	v := waitRun(t, s, key, id, 30*time.Second, "the run to end", finished)
	if v.Status != "COMPLETED" || !v.Output.AlertGenerated || v.Output.Severity != "CRITICAL" || len(v.Output.ReportIDs) != 1 ||
		len(v.Output.Steps) != 4 || v.DurationMs == nil {
		t.Fatalf("run %+v", v)
	}

	seen := false
	for !seen {
		select {
		case msg, ok := <-updates:
			if !ok {
				t.Fatalf("subscription ended: %v", ws.Err("runs"))
			}
			var d struct {
				Data struct{ WorkflowRunUpdated struct{ ID, Status string } }
			}
			_ = json.Unmarshal(msg, &d)
			seen = d.Data.WorkflowRunUpdated.ID == id && d.Data.WorkflowRunUpdated.Status == "COMPLETED"
		case <-ctx.Done():
			t.Fatal("workflowRunUpdated did not deliver the completed run")
		}
	}

	var body map[string]any
	servertest.Eventually(t, 30*time.Second, "the webhook delivery", func() bool {
		body = hook.find("workflow.run.completed", "run_id", id)
		return body != nil
	})
	payload, _ := body["payload"].(map[string]any)
	if len(body) != 5 || body["org_id"] != demo.DemoOrgID || body["project_id"] != sepsis || body["timestamp"] == nil {
		t.Fatalf("delivered body %v", body)
	}
	if _, err := time.Parse(time.RFC3339, body["timestamp"].(string)); err != nil {
		t.Fatalf("timestamp %v", body["timestamp"])
	}
	if len(payload) != 6 || payload["workflow_id"] != wf || payload["status"] != "COMPLETED" || payload["alert_generated"] != true ||
		payload["severity"] != "CRITICAL" || payload["duration_ms"] != float64(*v.DurationMs) {
		t.Fatalf("delivered payload %v", payload)
	}

	var list struct {
		Data []struct {
			Type    string
			Payload map[string]any
		}
	}
	servertest.Eventually(t, 30*time.Second, "workflow.run.completed in GET /v1/events", func() bool {
		r := s.Do(http.MethodGet, "/v1/events?projectId="+sepsis+"&type=workflow.run.completed", key, nil)
		r.JSON(t, &list)
		for _, e := range list.Data {
			if e.Payload["run_id"] == id {
				return true
			}
		}
		return false
	})
}

// TestRunResumesOnAnotherNode: a node stopped in the middle of a run hands it back; a new node on
// the same database and broker resumes it after the steps already done and ends it.
func TestRunResumesOnAnotherNode(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	sepsis := s.ProjectID(demo.SepsisProjectName)
	wf := createWorkflow(t, s, key, sepsis, "Recheck", []string{"load_patient", "score_news2", "wait:5s", "assess_risk", "create_alert"})
	id := runWorkflow(t, s, key, wf, demo.DeterioratingPatientID)
	before := waitRun(t, s, key, id, 30*time.Second, "the run to wait", func(v runView) bool { return v.Output.Current != nil })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Stopped mid-run, the node handed the run back rather than leaving it RUNNING.
	db, err := postgres.Connect(ctx, s.Cfg().DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	var status string
	err = db.QueryRow(ctx, `select status from workflow_runs where id = $1`, id).Scan(&status)
	db.Close()
	if err != nil || status != "QUEUED" {
		t.Fatalf("after the node stopped the run is %q (%v)", status, err)
	}

	s2 := servertest.StartConfig(t, s.Cfg())
	v := waitRun(t, s2, key, id, 60*time.Second, "the run to end on the new node", finished)
	if v.Status != "COMPLETED" || v.Output.Claims != 2 || len(v.Output.Steps) != 5 || !v.Output.AlertGenerated || len(v.Output.ReportIDs) != 1 {
		t.Fatalf("resumed run %+v", v)
	}
	for i := range 2 {
		if v.Output.Steps[i].StartedAt != before.Output.Steps[i].StartedAt {
			t.Errorf("step %d ran again: %s then %s", i, before.Output.Steps[i].StartedAt, v.Output.Steps[i].StartedAt)
		}
	}
	var statuses []string
	rows, err := s2.Pool().Query(context.Background(), `select value->'payload'->>'status' from outbox
where value->>'type' = 'workflow.run.updated' and value->'payload'->>'runId' = $1 order by seq`, id)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var st string
		_ = rows.Scan(&st)
		statuses = append(statuses, st)
	}
	if strings.Join(statuses, ",") != "QUEUED,RUNNING,QUEUED,RUNNING,COMPLETED" {
		t.Fatalf("workflow.run.updated %v", statuses)
	}
}

// TestObservationTriggersARun: a device.observation_received event (published by a client) starts
// a run of the workflow whose trigger matches, with trigger "event" and the spec's input.
func TestObservationTriggersARun(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	sepsis := s.ProjectID(demo.SepsisProjectName)
	wf := createWorkflow(t, s, key, sepsis, "On vitals", []string{"load_patient", "score_news2", "assess_risk", "create_alert"},
		"device.observation_received")
	publish := `mutation($p: JSON!, $prj: ID!) { publishEvent(type: "device.observation_received", payload: $p, projectId: $prj) { id } }`
	var run struct {
		ID, Trigger string
		Input       map[string]string
	}
	// The trigger group joins in the background; publish until it has taken an event.
	servertest.Eventually(t, 30*time.Second, "a triggered run", func() bool {
		s.MustGraphQL(t, key, publish, map[string]any{"prj": sepsis, "p": map[string]any{"observationId": "obs_01jx00000000000000000000e1",
			"patientId": demo.DeterioratingPatientID, "deviceType": "bedside_monitor", "code": "8867-4", "value": 118}}, nil)
		err := s.Pool().QueryRow(context.Background(), `select id, trigger, input from workflow_runs where workflow_id = $1 order by started_at limit 1`, wf).
			Scan(&run.ID, &run.Trigger, &run.Input)
		if err != nil {
			time.Sleep(500 * time.Millisecond)
		}
		return err == nil
	})
	if run.Trigger != "event" || run.Input["observation_id"] != "obs_01jx00000000000000000000e1" ||
		run.Input["patient_id"] != demo.DeterioratingPatientID || run.Input["device_type"] != "bedside_monitor" || len(run.Input) != 3 {
		t.Fatalf("triggered run %+v", run)
	}
	if v := waitRun(t, s, key, run.ID, 30*time.Second, "the triggered run to end", finished); v.Status != "COMPLETED" || !v.Output.AlertGenerated {
		t.Fatalf("triggered run %+v", v)
	}
}

// TestStartRunREST: POST /api/v1/workflows/runs starts a run with trigger "event" and answers
// 202 with it; it honours the caller's mode and the workflow's status.
func TestStartRunREST(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	sepsis := s.ProjectID(demo.SepsisProjectName)
	wf := createWorkflow(t, s, key, sepsis, "REST", []string{"load_patient", "score_qsofa", "assess_risk", "create_alert"})
	body := map[string]any{"workflow_id": wf, "trigger": "event", "input": map[string]any{
		"observation_id": "obs_01jx00000000000000000000e2", "patient_id": demo.DeterioratingPatientID, "device_type": "pulse_oximeter"}}
	r := s.Do(http.MethodPost, "/api/v1/workflows/runs", key, body)
	var run struct {
		ID, WorkflowID, Status, Trigger string
		Input                           map[string]string
	}
	r.JSON(t, &run)
	if r.Status != http.StatusAccepted || run.Status != "QUEUED" || run.Trigger != "event" || run.WorkflowID != wf ||
		run.Input["device_type"] != "pulse_oximeter" || r.Header.Get("Location") != "/v1/workflow-runs/"+run.ID {
		t.Fatalf("HTTP %d %s", r.Status, r.Body)
	}
	v := waitRun(t, s, key, run.ID, 30*time.Second, "the run to end", finished)
	if v.Status != "COMPLETED" || v.Output.Severity != "HIGH" || !v.Output.AlertGenerated { // qSOFA 2: positive
		t.Fatalf("run %+v", v)
	}
	testKey := s.Key(demo.DemoOrgSlug, access.Test, access.ExecWorkflows)
	body["input"] = map[string]any{"observation_id": "obs_x", "patient_id": demo.RealPatientID, "device_type": "x"}
	if r := s.Do(http.MethodPost, "/api/v1/workflows/runs", testKey, body); r.Status != http.StatusNotFound {
		t.Fatalf("test key, real patient: HTTP %d %s", r.Status, r.Body)
	}
	s.MustGraphQL(t, key, `mutation($id: ID!) { pauseWorkflow(id: $id) { status } }`, map[string]any{"id": wf}, nil)
	if r := s.Do(http.MethodPost, "/api/v1/workflows/runs", key, body); r.Status != http.StatusConflict {
		t.Fatalf("paused workflow: HTTP %d %s", r.Status, r.Body)
	}
}
