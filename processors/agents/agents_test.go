package agents_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
	"carehub/kernel/clinical"
	"carehub/kernel/fault"
	"carehub/processors/agents"
	"carehub/storage/demo"
)

func newAgent(t *testing.T, svc *agents.Service, ctx context.Context, pool *pgxpool.Pool, skill, mode string) *agents.Agent {
	t.Helper()
	var project string
	if err := pool.QueryRow(ctx, `select id from projects where name = $1`, demo.SepsisProjectName).Scan(&project); err != nil {
		t.Fatal(err)
	}
	a, err := svc.Create(ctx, agents.NewAgent{Name: skill + " " + mode, ProjectID: project, RunMode: mode, Skill: skill})
	if err != nil {
		t.Fatalf("create agent: %v", err)
	}
	return a
}

// TestRunScoresStoredVitals: a sync run reads the patient's latest stored vitals and its score,
// per-parameter points and observation ids match a hand computation over the same rows; a
// qualifying score makes a report and diagnostic.result_ready, a reassuring one neither.
func TestRunScoresStoredVitals(t *testing.T) {
	pool := seeded(t)
	ctx := caller(t)
	svc := agents.New(pool, agents.Config{})
	for _, tc := range []struct {
		skill, patient string
		qualifies      bool
	}{
		{clinical.SkillNEWS2, demo.DeterioratingPatientID, true},
		{clinical.SkillNEWS2, demo.StablePatientID, false},
		{clinical.SkillQSOFA, demo.DeterioratingPatientID, true},
		{clinical.SkillQSOFA, demo.StablePatientID, false},
	} {
		t.Run(tc.skill+" "+tc.patient, func(t *testing.T) {
			a := newAgent(t, svc, ctx, pool, tc.skill, agents.ModeSync)
			ses, err := svc.Run(ctx, a.ID, tc.patient, json.RawMessage(`{"note":"ward round"}`))
			if err != nil {
				t.Fatal(err)
			}
			if ses.Status != agents.StatusCompleted || ses.CompletedAt == nil || ses.Error != nil {
				t.Fatalf("session %+v", ses)
			}
			if ses.LatencyMs == nil || *ses.LatencyMs < 0 || ses.TokensUsed == nil || *ses.TokensUsed < 50 {
				t.Fatalf("accounting: latency %v tokens %v", ses.LatencyMs, ses.TokensUsed)
			}
			rows := latest(t, pool, tc.patient)
			out := decodeOutput(t, ses.Output)
			var codes []string
			switch tc.skill {
			case clinical.SkillNEWS2:
				total, points := handNEWS2(rows)
				if out.Score == nil || *out.Score != total {
					t.Fatalf("NEWS2 score %v, hand-computed %d from %v", deref(out.Score), total, rows)
				}
				for _, c := range out.Components {
					if c.Score == nil || *c.Score != points[c.Name] {
						t.Errorf("component %s: %v points, hand-computed %d", c.Name, c.Score, points[c.Name])
					}
				}
				codes = []string{clinical.LOINCRespiratoryRate, clinical.LOINCOxygenSaturation, clinical.LOINCInhaledOxygenFlow,
					clinical.LOINCSystolicBP, clinical.LOINCHeartRate, clinical.LOINCGlasgowComaScore, clinical.LOINCBodyTemperature}
			case clinical.SkillQSOFA:
				if out.Score == nil || *out.Score != handQSOFA(rows) || *out.Positive != (handQSOFA(rows) >= 2) {
					t.Fatalf("qSOFA %v positive %v, hand-computed %d", deref(out.Score), out.Positive, handQSOFA(rows))
				}
				codes = []string{clinical.LOINCRespiratoryRate, clinical.LOINCSystolicBP, clinical.LOINCGlasgowComaScore}
			}
			var want []string
			for _, c := range codes {
				want = append(want, rows[c].id)
			}
			if !sameSet(out.ObservationIDs, want) {
				t.Fatalf("observationIds %v, want the latest rows %v", out.ObservationIDs, want)
			}
			reports := count(t, pool, `select count(*) from reports where session_id = $1`, ses.ID)
			ready := count(t, pool, `select count(*) from outbox where value->>'type' = 'diagnostic.result_ready' and value->'payload'->>'reportId' = $1`, out.ReportID)
			if tc.qualifies != (out.ReportID != "") || tc.qualifies != (reports == 1) || tc.qualifies != (ready == 1) {
				t.Fatalf("qualifies %v: reportId %q, reports %d, diagnostic.result_ready %d", tc.qualifies, out.ReportID, reports, ready)
			}
			if n := count(t, pool, `select count(*) from outbox where value->>'type' = 'agent.run_completed' and value->'payload'->>'sessionId' = $1
and (value->'payload'->>'tokensUsed')::int = $2`, ses.ID, *ses.TokensUsed); n != 1 {
				t.Fatalf("agent.run_completed: %d", n)
			}
		})
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestReportIsRiskAssessment: the stored report of a qualifying NEWS2 is a FHIR R4
// RiskAssessment about the patient, based on the observations used, with a high qualitative risk,
// and diagnostic.result_ready carries its conclusion and severity.
func TestReportIsRiskAssessment(t *testing.T) {
	pool := seeded(t)
	ctx := caller(t)
	svc := agents.New(pool, agents.Config{})
	a := newAgent(t, svc, ctx, pool, clinical.SkillNEWS2, agents.ModeSync)
	ses, err := svc.Run(ctx, a.ID, demo.DeterioratingPatientID, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := decodeOutput(t, ses.Output)
	r, err := svc.Report(ctx, out.ReportID)
	if err != nil {
		t.Fatal(err)
	}
	var ra struct {
		ResourceType string                       `json:"resourceType"`
		ID           string                       `json:"id"`
		Status       string                       `json:"status"`
		Subject      struct{ Reference string }   `json:"subject"`
		Basis        []struct{ Reference string } `json:"basis"`
		Prediction   []struct {
			QualitativeRisk struct {
				Coding []struct{ System, Code string } `json:"coding"`
			} `json:"qualitativeRisk"`
			Rationale string `json:"rationale"`
		} `json:"prediction"`
		Mitigation string `json:"mitigation"`
	}
	if err := json.Unmarshal(r.Resource, &ra); err != nil {
		t.Fatal(err)
	}
	if ra.ResourceType != "RiskAssessment" || ra.ID != r.ID || ra.Status != "final" || ra.Subject.Reference != "Patient/"+demo.DeterioratingPatientID {
		t.Fatalf("resource %s", r.Resource)
	}
	if len(ra.Basis) != len(out.ObservationIDs) || ra.Basis[0].Reference != "Observation/"+out.ObservationIDs[0] {
		t.Fatalf("basis %+v, observations %v", ra.Basis, out.ObservationIDs)
	}
	if len(ra.Prediction) != 1 || ra.Prediction[0].QualitativeRisk.Coding[0].Code != "high" ||
		ra.Prediction[0].QualitativeRisk.Coding[0].System != "http://terminology.hl7.org/CodeSystem/risk-probability" {
		t.Fatalf("prediction %+v", ra.Prediction)
	}
	if r.Severity != "CRITICAL" || r.Code != "news2" || !strings.HasPrefix(r.Conclusion, "NEWS2 11 (high)") || ra.Mitigation == "" {
		t.Fatalf("report %+v", r)
	}
	var payload map[string]any
	if err := pool.QueryRow(ctx, `select value->'payload' from outbox where value->>'type' = 'diagnostic.result_ready'
and value->'payload'->>'reportId' = $1`, r.ID).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	if payload["patientId"] != demo.DeterioratingPatientID || payload["code"] != "news2" || payload["severity"] != "CRITICAL" ||
		payload["conclusion"] != r.Conclusion {
		t.Fatalf("diagnostic.result_ready payload %v", payload)
	}
	// A test key does not reach the report of a real patient; this one is synthetic.
	testCtx := access.With(t.Context(), &access.Principal{OrgID: demo.DemoOrgID, Mode: access.Test, Scopes: access.Scopes})
	if _, err := svc.Report(testCtx, r.ID); err != nil {
		t.Fatalf("test key on a synthetic patient's report: %v", err)
	}
}

// TestRunNeverFabricates: missing vitals end the session FAILED naming them, with no output and
// agent.run.failed; unknown, foreign and (for test keys) real patients are NOT_FOUND before any
// session exists.
func TestRunNeverFabricates(t *testing.T) {
	pool := seeded(t)
	ctx := caller(t)
	svc := agents.New(pool, agents.Config{})
	a := newAgent(t, svc, ctx, pool, clinical.SkillNEWS2, agents.ModeSync)
	const partial = "pat_01jx0000000000000000000001"
	if _, err := pool.Exec(ctx, `insert into patients (id, org_id, synthetic, name) values ($1, $2, true, '[]')`, partial, demo.DemoOrgID); err != nil {
		t.Fatal(err)
	}
	for i, o := range []struct {
		code  string
		value float64
	}{{clinical.LOINCHeartRate, 88}, {clinical.LOINCRespiratoryRate, 18}} {
		if _, err := pool.Exec(ctx, `insert into observations (id, org_id, patient_id, status, code, loinc, subject, value, unit, effective_at)
values ($1, $2, $3, 'final', '{}', $4, '{}', $5, '/min', now())`, "obs_01jx00000000000000000000a"+string(rune('0'+i)), demo.DemoOrgID, partial, o.code, o.value); err != nil {
			t.Fatal(err)
		}
	}
	ses, err := svc.Run(ctx, a.ID, partial, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ses.Status != agents.StatusFailed || ses.Output != nil || ses.Error == nil {
		t.Fatalf("session %+v", ses)
	}
	for _, missing := range []string{"spo2", "systolic_bp", "temperature"} {
		if !strings.Contains(*ses.Error, missing) {
			t.Errorf("error %q does not name %s", *ses.Error, missing)
		}
	}
	if strings.Contains(*ses.Error, "heart_rate") {
		t.Errorf("error %q names a vital the patient has", *ses.Error)
	}
	if n := count(t, pool, `select count(*) from outbox where value->>'type' = 'agent.run.failed' and value->'payload'->>'sessionId' = $1`, ses.ID); n != 1 {
		t.Fatalf("agent.run.failed: %d", n)
	}
	if n := count(t, pool, `select count(*) from reports where patient_id = $1`, partial); n != 0 {
		t.Fatalf("reports of a patient without a score: %d", n)
	}

	testCtx := access.With(t.Context(), &access.Principal{OrgID: demo.DemoOrgID, Mode: access.Test, Scopes: access.Scopes})
	var foreign string
	if err := pool.QueryRow(ctx, `select id from patients where org_id <> $1 limit 1`, demo.DemoOrgID).Scan(&foreign); err != nil {
		t.Fatal(err)
	}
	before := count(t, pool, `select count(*) from agent_sessions`)
	for _, tc := range []struct {
		ctx     context.Context
		patient string
	}{{ctx, "pat_01aaaaaaaaaaaaaaaaaaaaaaaa"}, {ctx, foreign}, {testCtx, demo.RealPatientID}} {
		if _, err := svc.Run(tc.ctx, a.ID, tc.patient, nil); fault.KindOf(err) != fault.KindNotFound {
			t.Errorf("patient %s: %v, want NOT_FOUND", tc.patient, err)
		}
	}
	if after := count(t, pool, `select count(*) from agent_sessions`); after != before {
		t.Fatalf("refused runs stored sessions: %d → %d", before, after)
	}
}

// TestWorkerRecoversStuckSessions: the state a crash leaves — a QUEUED session nobody runs, a
// RUNNING one whose worker died (lease expired) — is finished by the next worker; a session that
// already used its attempts is FAILED cleanly rather than run again.
func TestWorkerRecoversStuckSessions(t *testing.T) {
	pool := seeded(t)
	ctx := caller(t)
	svc := agents.New(pool, agents.Config{})
	a := newAgent(t, svc, ctx, pool, clinical.SkillQSOFA, agents.ModeAsync)
	var ids []string
	for range 3 {
		ses, err := svc.Run(ctx, a.ID, demo.DeterioratingPatientID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ses.Status != agents.StatusQueued || ses.CompletedAt != nil {
			t.Fatalf("async session %+v", ses)
		}
		ids = append(ids, ses.ID)
	}
	queued, died, exhausted := ids[0], ids[1], ids[2]
	if _, err := pool.Exec(ctx, `update agent_sessions set status = 'RUNNING', attempts = 1, lease_until = now() - interval '1 second' where id = $1`, died); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `update agent_sessions set status = 'RUNNING', attempts = 3, lease_until = now() - interval '1 second' where id = $1`, exhausted); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = svc.Worker(agents.WorkerConfig{Workers: 2, Lease: time.Second, PollInterval: 20 * time.Millisecond, MaxAttempts: 3}).Run(wctx)
	}()
	defer func() { stop(); <-done }()

	deadline := time.Now().Add(10 * time.Second)
	for count(t, pool, `select count(*) from agent_sessions where id = any($1) and status in ('COMPLETED', 'FAILED')`, ids) < 3 {
		if time.Now().After(deadline) {
			t.Fatal("sessions not finished")
		}
		time.Sleep(20 * time.Millisecond)
	}
	status := func(id string) (string, *string, json.RawMessage) {
		var s string
		var e *string
		var o json.RawMessage
		if err := pool.QueryRow(ctx, `select status, error, output from agent_sessions where id = $1`, id).Scan(&s, &e, &o); err != nil {
			t.Fatal(err)
		}
		return s, e, o
	}
	for _, id := range []string{queued, died} {
		s, _, o := status(id)
		if s != agents.StatusCompleted || decodeOutput(t, o).Score == nil || *decodeOutput(t, o).Score != 2 {
			t.Fatalf("session %s: %s %s", id, s, o)
		}
	}
	if s, e, o := status(exhausted); s != agents.StatusFailed || e == nil || !strings.Contains(*e, "interrupted") || o != nil {
		t.Fatalf("exhausted session: %s %v %s", s, e, o)
	}
	// QUEUED (runAgent), RUNNING, COMPLETED for the queued one; every change has its event.
	var statuses []string
	rows, _ := pool.Query(ctx, `select value->'payload'->>'status' from outbox where value->>'type' = 'agent.session.updated'
and value->'payload'->>'sessionId' = $1 order by seq`, queued)
	statuses, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(statuses, []string{"QUEUED", "RUNNING", "COMPLETED"}) {
		t.Fatalf("agent.session.updated statuses %v", statuses)
	}
	if n := count(t, pool, `select count(*) from outbox where value->>'type' = 'agent.run.failed' and value->'payload'->>'sessionId' = $1`, exhausted); n != 1 {
		t.Fatalf("agent.run.failed of the exhausted session: %d", n)
	}
}

// TestAsyncQueueIsBounded: beyond the per-organization bound runAgent refuses with RATE_LIMITED
// and stores nothing.
func TestAsyncQueueIsBounded(t *testing.T) {
	pool := seeded(t)
	ctx := caller(t)
	svc := agents.New(pool, agents.Config{MaxQueued: 2})
	a := newAgent(t, svc, ctx, pool, clinical.SkillNEWS2, agents.ModeAsync)
	for i := range 3 {
		_, err := svc.Run(ctx, a.ID, demo.StablePatientID, nil)
		if i < 2 && err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		if i == 2 && fault.KindOf(err) != fault.KindRateLimited {
			t.Fatalf("run beyond the bound: %v", err)
		}
	}
	if n := count(t, pool, `select count(*) from agent_sessions where agent_id = $1`, a.ID); n != 2 {
		t.Fatalf("sessions %d, want 2", n)
	}
}

// TestExecuteCommitsWithTheCaller: a session made by Execute exists exactly when the caller's
// transaction commits.
func TestExecuteCommitsWithTheCaller(t *testing.T) {
	pool := seeded(t)
	ctx := caller(t)
	svc := agents.New(pool, agents.Config{})
	a := newAgent(t, svc, ctx, pool, clinical.SkillNEWS2, agents.ModeAsync) // Execute ignores the run mode
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ses, rep, err := svc.Execute(ctx, tx, agents.ExecRequest{AgentID: a.ID, ProjectID: a.ProjectID, PatientID: demo.DeterioratingPatientID})
	if err != nil {
		t.Fatal(err)
	}
	if ses.Status != agents.StatusCompleted || rep == nil {
		t.Fatalf("session %+v report %v", ses, rep)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `select count(*) from agent_sessions where id = $1`, ses.ID) + count(t, pool, `select count(*) from reports where id = $1`, rep.ID); n != 0 {
		t.Fatalf("rolled-back session or report persisted: %d", n)
	}
	if _, _, err := svc.Execute(ctx, mustBegin(t, pool), agents.ExecRequest{AgentID: a.ID, ProjectID: "prj_01aaaaaaaaaaaaaaaaaaaaaaaa",
		PatientID: demo.DeterioratingPatientID}); fault.KindOf(err) != fault.KindNotFound {
		t.Fatalf("agent of another project: %v", err)
	}
}

func mustBegin(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}
