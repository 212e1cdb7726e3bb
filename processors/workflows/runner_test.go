package workflows

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/internal/testenv"
	"carehub/kernel/clinical"
	"carehub/storage/demo"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/postgres"
)

func kadmClient(cl *kgo.Client) *kadm.Client { return kadm.NewClient(cl) }

// TestRunnerExecutesEveryStep: a run of the whole catalogue on the deteriorating patient ends
// COMPLETED with each step's result, CRITICAL severity, an alert with one report per qualifying
// score, the patient's riskLevel updated, and every state change announced through the outbox.
func TestRunnerExecutesEveryStep(t *testing.T) {
	h := newHarness(t)
	h.relay()
	h.startRunner(RunnerConfig{})
	if _, err := h.pool.Exec(h.ctx, `update patients set risk_level = 'low' where id = $1`, demo.DeterioratingPatientID); err != nil {
		t.Fatal(err)
	}
	steps := []string{"load_patient", "latest_vitals", "score_news2", "score_qsofa", "vitals_trend", "run_agent:" + h.ward7,
		"assess_risk", "update_risk_level", "create_alert", "notify", "wait:1s"}
	w := h.workflow("Everything", steps)
	run := h.start(w, demo.DeterioratingPatientID)
	r, out := h.wait(run.ID, 20*time.Second, "the run to end", ended)
	if r.Status != RunCompleted || r.Error != nil || r.DurationMs == nil || *r.DurationMs < 1000 {
		t.Fatalf("run %+v", r)
	}
	if len(out.Steps) != len(steps) || out.Current != nil || out.Claims != 1 || out.PatientID != demo.DeterioratingPatientID {
		t.Fatalf("output %+v", out)
	}
	for i, s := range out.Steps {
		if s.Step != steps[i] || s.Status != RunCompleted || len(s.Output) == 0 {
			t.Errorf("step %d: %+v", i, s)
		}
	}
	var news2 clinical.Output
	if err := json.Unmarshal(out.Steps[2].Output, &news2); err != nil || news2.Score == nil || *news2.Score != 11 {
		t.Fatalf("score_news2 output %s", out.Steps[2].Output)
	}
	var agent agentStepOutput
	if err := json.Unmarshal(out.Steps[5].Output, &agent); err != nil || agent.Status != "COMPLETED" || agent.ReportID == "" {
		t.Fatalf("run_agent output %s", out.Steps[5].Output)
	}
	if n := h.count(`select count(*) from agent_sessions where id = $1 and run_id = $2`, agent.SessionID, run.ID); n != 1 {
		t.Fatalf("the step's agent session is not tied to the run: %d", n)
	}
	// Reports: the NEWS2 and qSOFA of the score steps (created by create_alert) and the agent's own.
	if out.Severity != "CRITICAL" || !out.AlertGenerated || len(out.ReportIDs) != 3 {
		t.Fatalf("severity %s alert %v reports %v", out.Severity, out.AlertGenerated, out.ReportIDs)
	}
	if n := h.count(`select count(*) from reports where run_id = $1`, run.ID); n != 3 {
		t.Fatalf("reports of the run: %d", n)
	}
	if n := h.count(`select count(*) from outbox where value->>'type' = 'diagnostic.result_ready' and value->>'source' = 'workflow'
and value->'payload'->>'reportId' in (select id from reports where run_id = $1 and session_id is null)`, run.ID); n != 2 {
		t.Fatalf("diagnostic.result_ready from the workflow: %d", n)
	}
	if level := h.scalar(`select risk_level from patients where id = $1`, demo.DeterioratingPatientID); level != "critical" {
		t.Fatalf("riskLevel %s", level)
	}
	if got := h.eventStatuses("workflow.run.updated", "runId", run.ID); !slices.Equal(got, []string{"QUEUED", "RUNNING", "COMPLETED"}) {
		t.Fatalf("workflow.run.updated %v", got)
	}
	p := h.payload("workflow.run.completed", "run_id", run.ID)
	if p["workflow_id"] != w.ID || p["status"] != "COMPLETED" || p["alert_generated"] != true || p["severity"] != "CRITICAL" ||
		p["duration_ms"] != float64(*r.DurationMs) || len(p) != 6 {
		t.Fatalf("workflow.run.completed %v", p)
	}
	c := h.payload("workflow.completed", "runId", run.ID)
	if c["workflowId"] != w.ID || c["status"] != "COMPLETED" || c["durationMs"] != float64(*r.DurationMs) {
		t.Fatalf("workflow.completed %v", c)
	}
}

// TestRunnerFailsWithoutFabricating: a patient without vitals fails the run at its score step,
// names what is missing, raises no alert and reports NONE.
func TestRunnerFailsWithoutFabricating(t *testing.T) {
	h := newHarness(t)
	h.relay()
	h.startRunner(RunnerConfig{})
	const bare = "pat_01jx0000000000000000000002"
	if _, err := h.pool.Exec(h.ctx, `insert into patients (id, org_id, synthetic, name) values ($1, $2, true, '[]')`, bare, demo.DemoOrgID); err != nil {
		t.Fatal(err)
	}
	w := h.workflow("Score", []string{"load_patient", "score_news2", "assess_risk", "create_alert"})
	run := h.start(w, bare)
	r, out := h.wait(run.ID, 20*time.Second, "the run to end", ended)
	if r.Status != RunFailed || r.Error == nil || !strings.Contains(*r.Error, "step 2 (score_news2)") || !strings.Contains(*r.Error, "respiratory_rate") {
		t.Fatalf("run %s error %v", r.Status, r.Error)
	}
	if len(out.Steps) != 2 || out.Steps[1].Status != RunFailed || out.AlertGenerated || out.Severity != "NONE" {
		t.Fatalf("output %+v", out)
	}
	p := h.payload("workflow.run.completed", "run_id", run.ID)
	if p["status"] != "FAILED" || p["alert_generated"] != false || p["severity"] != "NONE" {
		t.Fatalf("workflow.run.completed %v", p)
	}
	// A run without a patient fails at its first step that needs one.
	run2, err := h.svc.Start(h.ctx, w.ID, nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := h.wait(run2.ID, 20*time.Second, "the run to end", ended); r.Status != RunFailed || !strings.Contains(*r.Error, "patient_id") {
		t.Fatalf("run without patient: %s %v", r.Status, r.Error)
	}
}

// TestRedeliveredCommandIsSkipped: a command delivered again after its run ended changes nothing.
func TestRedeliveredCommandIsSkipped(t *testing.T) {
	h := newHarness(t)
	h.relay()
	group := kafkatest.Group(t, "runner")
	h.startRunner(RunnerConfig{Group: group})
	w := h.workflow("Alert", []string{"load_patient", "score_news2", "assess_risk", "create_alert"})
	run := h.start(w, demo.DeterioratingPatientID)
	h.wait(run.ID, 20*time.Second, "the run to end", ended)
	cmd, _ := json.Marshal(Command{RunID: run.ID, WorkflowID: w.ID, OrgID: run.OrgID, ProjectID: run.ProjectID, Attempt: 1})
	cl := kafkatest.Client(t)
	for range 2 {
		if err := cl.ProduceSync(h.ctx, &kgo.Record{Topic: h.runs, Key: []byte(run.ID), Value: cmd}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	h.drained(group, h.runs, 20*time.Second)
	_, out := h.run(run.ID)
	if out.Claims != 1 {
		t.Fatalf("claims %d", out.Claims)
	}
	if n := h.count(`select count(*) from reports where run_id = $1`, run.ID); n != 1 {
		t.Fatalf("reports %d", n)
	}
	if got := h.eventStatuses("workflow.run.completed", "run_id", run.ID); len(got) != 1 {
		t.Fatalf("workflow.run.completed events %v", got)
	}
}

// TestCancelStopsARunningRun: a run cancelled while it waits stops before its next step: no
// score, no alert, and the only end event is the cancel's.
func TestCancelStopsARunningRun(t *testing.T) {
	h := newHarness(t)
	h.relay()
	group := kafkatest.Group(t, "runner")
	h.startRunner(RunnerConfig{Group: group})
	w := h.workflow("Slow", []string{"load_patient", "wait:3s", "score_news2", "assess_risk", "create_alert"})
	run := h.start(w, demo.DeterioratingPatientID)
	h.wait(run.ID, 20*time.Second, "the run to wait", func(r *Run, o RunOutput) bool { return o.Current != nil })
	if _, err := h.svc.Cancel(h.ctx, run.ID); err != nil {
		t.Fatal(err)
	}
	// The runner commits a command only once it is done with the run: a runner that missed the
	// cancel would have scored by then.
	h.drained(group, h.runs, 20*time.Second)
	r, out := h.run(run.ID)
	if r.Status != RunCancelled || len(out.Steps) != 1 {
		t.Fatalf("run %s, steps %+v", r.Status, out.Steps)
	}
	if n := h.count(`select count(*) from reports where run_id = $1`, run.ID); n != 0 {
		t.Fatalf("reports of a cancelled run: %d", n)
	}
	if got := h.eventStatuses("workflow.run.completed", "run_id", run.ID); !slices.Equal(got, []string{"CANCELLED"}) {
		t.Fatalf("workflow.run.completed %v", got)
	}
}

// TestPausedWorkflowRefusesRuns: only ACTIVE workflows start runs.
func TestPausedWorkflowRefusesRuns(t *testing.T) {
	h := newHarness(t)
	w := h.workflow("Paused", []string{"load_patient"})
	if _, err := h.svc.SetStatus(h.ctx, w.ID, StatusPaused); err != nil {
		t.Fatal(err)
	}
	if _, err := h.svc.Start(h.ctx, w.ID, nil, RunOptions{}); err == nil || !strings.Contains(err.Error(), "ACTIVE") {
		t.Fatalf("start on a paused workflow: %v", err)
	}
}

// crashChildEnv makes the test binary a runner (crashChild) instead of running tests.
const crashChildEnv = "CAREHUB_WORKFLOWS_CRASH_CHILD"

// crashChild runs a runner on the database and topics the parent passes until it is killed.
func crashChild() int {
	env := func(k string) string { return os.Getenv("CRASH_" + k) }
	ctx := context.Background()
	pool, err := postgres.Connect(ctx, env("DSN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	svc := New(pool, Config{EventsTopic: env("EVENTS"), RunsTopic: env("RUNS")})
	r, err := NewRunner(RunnerConfig{Brokers: strings.Split(env("BROKERS"), ","), Service: svc, Group: env("GROUP"),
		Lease: 2 * time.Second, SweepInterval: time.Hour,
		ClientOpts: []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(time.Second)}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	_ = r.Run(ctx) // until SIGKILL
	return 0
}

// TestKilledRunnerRunIsResumed: a runner killed with SIGKILL in the middle of a run leaves it
// RUNNING under a lease; once the lease runs out another runner resumes it after its last
// committed step (no step runs twice, one alert) and ends it COMPLETED.
func TestKilledRunnerRunIsResumed(t *testing.T) {
	h := newHarness(t)
	h.relay()
	group := kafkatest.Group(t, "runner")
	child := testenv.StartChild(t, crashChildEnv+"=1", "CRASH_DSN="+h.dsn, "CRASH_BROKERS="+strings.Join(h.brokers, ","),
		"CRASH_EVENTS="+h.events, "CRASH_RUNS="+h.runs, "CRASH_GROUP="+group)

	w := h.workflow("Crash", []string{"load_patient", "score_news2", "wait:4s", "assess_risk", "create_alert"})
	run := h.start(w, demo.DeterioratingPatientID)
	_, before := h.wait(run.ID, 30*time.Second, "the child to reach the wait", func(r *Run, o RunOutput) bool {
		return r.Status == RunRunning && o.Current != nil
	})
	if err := child.Kill(); err != nil {
		t.Fatal(err)
	}
	if r, _ := h.run(run.ID); r.Status != RunRunning {
		t.Fatalf("after the kill the run is %s", r.Status)
	}

	h.startRunner(RunnerConfig{Group: group, Lease: 2 * time.Second})
	r, out := h.wait(run.ID, 60*time.Second, "the run to end", ended)
	if r.Status != RunCompleted || out.Claims != 2 || len(out.Steps) != 5 || !out.AlertGenerated || out.Severity != "CRITICAL" {
		t.Fatalf("run %s output %+v", r.Status, out)
	}
	for i := range 2 { // the steps the killed runner committed were not run again
		if !out.Steps[i].StartedAt.Equal(before.Steps[i].StartedAt) {
			t.Errorf("step %d re-run: %v then %v", i, before.Steps[i].StartedAt, out.Steps[i].StartedAt)
		}
	}
	if n := h.count(`select count(*) from reports where run_id = $1`, run.ID); n != 1 {
		t.Fatalf("reports %d", n)
	}
	got := h.eventStatuses("workflow.run.updated", "runId", run.ID)
	if !slices.Equal(got, []string{"QUEUED", "RUNNING", "QUEUED", "RUNNING", "COMPLETED"}) {
		t.Fatalf("workflow.run.updated %v", got)
	}
}

// TestRunOutOfAttemptsFails: a run whose lease expires after its last allowed claim is FAILED by
// the sweeper, with its end events, instead of being retried for ever.
func TestRunOutOfAttemptsFails(t *testing.T) {
	h := newHarness(t)
	h.relay()
	w := h.workflow("Doomed", []string{"load_patient"})
	run := h.start(w, demo.DeterioratingPatientID)
	if _, err := h.pool.Exec(h.ctx, `update workflow_runs set status = 'RUNNING', attempts = 3, lease_owner = 'rnr_dead',
lease_until = now() - interval '1 second' where id = $1`, run.ID); err != nil {
		t.Fatal(err)
	}
	h.startRunner(RunnerConfig{MaxAttempts: 3})
	r, _ := h.wait(run.ID, 20*time.Second, "the run to end", ended)
	if r.Status != RunFailed || !strings.Contains(*r.Error, "interrupted 3 times") {
		t.Fatalf("run %s %v", r.Status, r.Error)
	}
	if p := h.payload("workflow.run.completed", "run_id", run.ID); p["status"] != "FAILED" {
		t.Fatalf("workflow.run.completed %v", p)
	}
}

// TestLostCommandIsResent: a run QUEUED without a command on the broker is re-sent by the
// sweeper and then runs.
func TestLostCommandIsResent(t *testing.T) {
	h := newHarness(t)
	w := h.workflow("Lost", []string{"load_patient"})
	run := h.start(w, demo.DeterioratingPatientID)
	// The command never reaches the broker: drop it from the outbox before any relay runs.
	if _, err := h.pool.Exec(h.ctx, `delete from outbox where topic = $1`, h.runs); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(h.ctx, `update workflow_runs set updated_at = now() - interval '1 hour' where id = $1`, run.ID); err != nil {
		t.Fatal(err)
	}
	h.relay()
	h.startRunner(RunnerConfig{RequeueAfter: time.Minute})
	if r, _ := h.wait(run.ID, 20*time.Second, "the run to end", ended); r.Status != RunCompleted {
		t.Fatalf("run %s", r.Status)
	}
}
