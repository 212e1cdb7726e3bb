package attacktest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// Finding 3 of issue 51: a workflow a test key created, triggered by an event naming a real
// patient, ran in live mode, changed the patient's risk level, added a RiskAssessment, and the
// test key read the result. Test mode must hold through triggers: the test key cannot publish
// an event naming a real patient, and a test workflow's runs reach only synthetic patients
// whoever publishes the event that starts them. A live workflow still reaches real patients.

// scoringSteps score the run's patient and write the result to it.
var scoringSteps = []string{"load_patient", "score_news2", "assess_risk", "update_risk_level", "create_alert"}

// triggeredRun is a run as a workflow's runs list serves it.
type triggeredRun struct {
	ID       string          `json:"id"`
	Status   string          `json:"status"`
	Output   json.RawMessage `json:"output"`
	Redacted bool            `json:"redacted"`
}

func createTriggered(t *testing.T, s *servertest.Server, key, project, name, trigger string) string {
	t.Helper()
	var out struct{ CreateWorkflow struct{ ID string } }
	s.MustGraphQL(t, key, `mutation($p: ID!, $n: String!, $s: [String!]!, $t: [String!]) {
		createWorkflow(name: $n, projectId: $p, steps: $s, triggers: $t) { id } }`,
		map[string]any{"p": project, "n": name, "s": scoringSteps, "t": []string{trigger}}, &out)
	return out.CreateWorkflow.ID
}

func publishAbout(s *servertest.Server, key, project, typ, patient string) *servertest.GraphQLResponse {
	return s.GraphQL(key, `mutation($t: String!, $p: ID!, $pl: JSON!) { publishEvent(type: $t, payload: $pl, projectId: $p) { id } }`,
		map[string]any{"t": typ, "p": project, "pl": map[string]any{"patientId": patient, "reason": "attack"}})
}

// endedRun waits for the one run of workflow to end and returns it as key reads it.
func endedRun(t *testing.T, s *servertest.Server, key, workflow string) triggeredRun {
	t.Helper()
	var run triggeredRun
	servertest.Eventually(t, 60*time.Second, "the triggered run of "+workflow+" to end", func() bool {
		var out struct{ Workflow struct{ Runs []triggeredRun } }
		s.MustGraphQL(t, key, `query($w: ID!) { workflow(id: $w) { runs { id status output redacted } } }`,
			map[string]any{"w": workflow}, &out)
		if len(out.Workflow.Runs) == 0 {
			return false
		}
		run = out.Workflow.Runs[0]
		return run.Status == "COMPLETED" || run.Status == "FAILED" || run.Status == "CANCELLED"
	})
	return run
}

// patientState is what a run may change about a patient: its risk level and its reports.
type patientState struct {
	risk    *string
	reports int
}

func stateOf(t *testing.T, s *servertest.Server, patient string) patientState {
	t.Helper()
	var st patientState
	err := s.Pool().QueryRow(context.Background(), `select risk_level, (select count(*) from reports where patient_id = $1)
from patients where id = $1`, patient).Scan(&st.risk, &st.reports)
	if err != nil {
		t.Fatalf("patient %s: %v", patient, err)
	}
	return st
}

func TestTestKeyCannotWriteRealPatientThroughTriggers(t *testing.T) {
	s := servertest.Start(t)
	project := s.ProjectID(demo.SepsisProjectName)
	live := s.DemoKey()
	test := s.Key(demo.DemoOrgSlug, access.Test, access.ExecWorkflows, access.ReadPatients, access.ReadObservations)
	before := stateOf(t, s, demo.RealPatientID)

	testFlow := createTriggered(t, s, test, project, "attacker's scorer", "attack.vitals_checked")

	// The attack as reported: the test key's own event naming the real patient is refused as an
	// unknown patient would be, and so starts nothing.
	res := publishAbout(s, test, project, "attack.vitals_checked", demo.RealPatientID)
	if len(res.Errors) == 0 || res.Errors[0].Code() != "NOT_FOUND" {
		t.Fatalf("test key published an event naming a real patient: %s %+v", res.Data, res.Errors)
	}
	unknown := publishAbout(s, test, project, "attack.vitals_checked", "pat_01kf3fm8c0xbzcfajp6n9d2emz")
	if len(unknown.Errors) == 0 || unknown.Errors[0].Message != strings.Replace(res.Errors[0].Message, demo.RealPatientID, "pat_01kf3fm8c0xbzcfajp6n9d2emz", 1) {
		t.Fatalf("a real patient is refused otherwise than an unknown one: %+v, %+v", res.Errors, unknown.Errors)
	}

	// The same event from a live integration still reaches the test workflow: its run is in
	// test mode and fails at its first patient step, writing nothing to the real patient.
	if res := publishAbout(s, live, project, "attack.vitals_checked", demo.RealPatientID); len(res.Errors) > 0 {
		t.Fatalf("live publish: %+v", res.Errors)
	}
	run := endedRun(t, s, live, testFlow)
	if run.Status != "FAILED" || !strings.Contains(string(run.Output), "synthetic patients a test-mode run may reach") {
		t.Fatalf("test workflow's run on a real patient: %s %s; want FAILED at load_patient", run.Status, run.Output)
	}
	if after := stateOf(t, s, demo.RealPatientID); after.reports != before.reports || !sameRisk(after.risk, before.risk) {
		t.Fatalf("the real patient changed: risk %v → %v, reports %d → %d", deref(before.risk), deref(after.risk), before.reports, after.reports)
	}
	seen := endedRun(t, s, test, testFlow)
	if !seen.Redacted || strings.Contains(string(seen.Output), "CRITICAL") || strings.Contains(string(seen.Output), demo.RealPatientID) {
		t.Fatalf("the test key read the run about a real patient: %+v", seen)
	}

	// A synthetic patient is the test workflow's to score, from the test key's own event.
	synthFlow := createTriggered(t, s, test, project, "synthetic scorer", "attack.synthetic_checked")
	if res := publishAbout(s, test, project, "attack.synthetic_checked", demo.DeterioratingPatientID); len(res.Errors) > 0 {
		t.Fatalf("test key, synthetic patient: %+v", res.Errors)
	}
	if run := endedRun(t, s, test, synthFlow); run.Status != "COMPLETED" || run.Redacted {
		t.Fatalf("test workflow on a synthetic patient: %+v", run)
	}

	// Legitimate live use is unchanged: a live workflow scores the real patient.
	liveFlow := createTriggered(t, s, live, project, "live scorer", "attack.live_checked")
	if res := publishAbout(s, live, project, "attack.live_checked", demo.RealPatientID); len(res.Errors) > 0 {
		t.Fatalf("live publish: %+v", res.Errors)
	}
	if run := endedRun(t, s, live, liveFlow); run.Status != "COMPLETED" || !strings.Contains(string(run.Output), demo.RealPatientID) {
		t.Fatalf("live workflow on a real patient: %s %s", run.Status, run.Output)
	}
}

func sameRisk(a, b *string) bool { return deref(a) == deref(b) }

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
