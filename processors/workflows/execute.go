package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/clinical"
	"carehub/kernel/events"
	"carehub/kernel/fault"
	"carehub/processors/agents"
	"carehub/storage/outbox"
)

// errLost means the run is no longer this runner's to execute: it was cancelled, finished, or
// taken over after its lease ran out. The runner stops without writing anything.
var errLost = errors.New("workflow run no longer held by this runner")

// stepFailure is a step that cannot succeed for this run (a missing patient or vital sign, an
// agent session that failed): the run ends FAILED with its message. Any other error is the
// infrastructure's, and the run is left to its lease.
type stepFailure struct{ msg string }

func (f *stepFailure) Error() string { return f.msg }

func failf(format string, args ...any) error { return &stepFailure{fmt.Sprintf(format, args...)} }

// engine claims and executes runs. The Runner's consumer and its sweeper share one.
type engine struct {
	s           *Service
	agents      *agents.Service
	owner       string // this runner's lease owner id
	lease       time.Duration
	maxAttempts int
	log         *slog.Logger
	m           *runnerMetrics
}

// runState is a claimed run being executed.
type runState struct {
	run      *Run
	attempts int
	mode     string
	steps    []string
	out      RunOutput
	patient  *patientInfo
}

type patientInfo struct {
	ID        string  `json:"patientId"`
	RiskLevel *string `json:"riskLevel"`
	Synthetic bool    `json:"synthetic"`
}

// claim moves run runID to RUNNING under this runner's lease (from QUEUED, or from RUNNING whose
// lease ran out) with workflow.run.updated, in one transaction. It returns nil when there is
// nothing to execute: the run is finished, held by a live lease, unknown, or was FAILED here
// because it had been claimed MaxAttempts times already.
func (e *engine) claim(ctx context.Context, runID string) (*runState, error) {
	var st *runState
	err := pgx.BeginFunc(ctx, e.s.pool, func(tx pgx.Tx) error {
		r := &Run{}
		var attempts int
		var mode string
		err := tx.QueryRow(ctx, `update workflow_runs set status = 'RUNNING', attempts = attempts + 1, lease_owner = $2,
	lease_until = now() + make_interval(secs => $3), updated_at = now()
where id = $1 and (status = 'QUEUED' or (status = 'RUNNING' and lease_until < now()))
returning `+runColumns+`, attempts, mode`, runID, e.owner, e.lease.Seconds()).Scan(
			&r.ID, &r.OrgID, &r.ProjectID, &r.WorkflowID, &r.Status, &r.Trigger, &r.Input, &r.Output, &r.Error,
			&r.DurationMs, &r.StartedAt, &r.CompletedAt, &attempts, &mode)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("claim run: %w", err)
		}
		s := &runState{run: r, attempts: attempts, mode: mode, out: RunOutput{Severity: string(clinical.SeverityNone), ReportIDs: []string{}, Steps: []StepResult{}}}
		if len(r.Output) > 0 {
			if err := json.Unmarshal(r.Output, &s.out); err != nil {
				return fmt.Errorf("run %s output: %w", r.ID, err)
			}
		}
		s.out.Claims++
		if attempts > e.maxAttempts {
			msg := fmt.Sprintf("the run was interrupted %d times (its runner stopped before it finished); not retried", e.maxAttempts)
			e.log.Warn("workflow run failed after repeated interruptions", "run_id", r.ID, "attempts", e.maxAttempts)
			return e.end(ctx, tx, s, RunFailed, msg)
		}
		if err := tx.QueryRow(ctx, `select steps from workflows where id = $1`, r.WorkflowID).Scan(&s.steps); err != nil {
			return fmt.Errorf("workflow %s: %w", r.WorkflowID, err)
		}
		if err := e.save(ctx, tx, s); err != nil {
			return fmt.Errorf("claim run: %w", err)
		}
		evs, err := runEvents(r)
		if err != nil {
			return err
		}
		st = s
		return outbox.AppendEvents(ctx, tx, e.s.eventsTopic, evs...)
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// execute runs the claimed run's remaining steps and ends it. It returns errLost when the run
// stopped being this runner's (cancelled between steps), ctx's error when ctx ended (the caller
// re-queues the run), and other errors when the database failed (the run is left to its lease).
func (e *engine) execute(ctx context.Context, st *runState) error {
	for i := len(st.out.Steps); i < len(st.steps); i++ {
		name := st.steps[i]
		spec, ok := parseStep(name)
		if !ok { // the catalogue shrank under a stored workflow
			return e.finish(ctx, st, RunFailed, fmt.Sprintf("step %d: %q is not in this version's step catalogue", i+1, name))
		}
		if spec.kind == WaitPrefix {
			if err := e.wait(ctx, st, i, spec); err != nil {
				return err
			}
		}
		if err := e.step(ctx, st, i, spec); err != nil {
			var f *stepFailure
			if errors.As(err, &f) {
				return e.finish(ctx, st, RunFailed, fmt.Sprintf("step %d (%s): %s", i+1, name, f.msg))
			}
			return err
		}
	}
	return e.finish(ctx, st, RunCompleted, "")
}

// hold locks the run's row in tx and checks it is still RUNNING under this runner's lease and
// claim; otherwise errLost. Every write of a run goes through it, so a cancel (which locks the
// row too) lands between two steps, never inside one.
func (e *engine) hold(ctx context.Context, tx pgx.Tx, st *runState) error {
	var status string
	var owner *string
	var attempts int
	err := tx.QueryRow(ctx, `select status, lease_owner, attempts from workflow_runs where id = $1 for update`, st.run.ID).
		Scan(&status, &owner, &attempts)
	if err != nil {
		return fmt.Errorf("lock run: %w", err)
	}
	if status != RunRunning || owner == nil || *owner != e.owner || attempts != st.attempts {
		return errLost
	}
	return nil
}

// save writes the run's output and renews its lease in tx.
func (e *engine) save(ctx context.Context, tx pgx.Tx, st *runState) error {
	out, err := json.Marshal(st.out)
	if err != nil {
		return err
	}
	st.run.Output = out
	_, err = tx.Exec(ctx, `update workflow_runs set output = $2, lease_until = now() + make_interval(secs => $3), updated_at = now()
where id = $1`, st.run.ID, out, e.lease.Seconds())
	return err
}

// step executes step i and commits its effects with its result. A failing step rolls back.
func (e *engine) step(ctx context.Context, st *runState, i int, spec stepSpec) error {
	started := time.Now()
	saved := st.out.clone()
	err := pgx.BeginFunc(ctx, e.s.pool, func(tx pgx.Tx) error {
		if err := e.hold(ctx, tx, st); err != nil {
			return err
		}
		output, err := e.runStep(ctx, tx, st, spec)
		if err != nil {
			return err
		}
		raw, err := json.Marshal(output)
		if err != nil {
			return err
		}
		st.out.Current = nil
		st.out.Steps = append(st.out.Steps, StepResult{Step: st.steps[i], Status: RunCompleted, StartedAt: started.UTC(),
			DurationMs: time.Since(started).Milliseconds(), Output: raw})
		return e.save(ctx, tx, st)
	})
	if err != nil {
		st.out = saved
		var f *stepFailure
		if errors.As(err, &f) {
			st.out.Current = nil
			st.out.Steps = append(st.out.Steps, StepResult{Step: st.steps[i], Status: RunFailed, StartedAt: started.UTC(),
				DurationMs: time.Since(started).Milliseconds(), Error: f.msg})
		}
		e.m.steps.WithLabelValues(spec.kind, "failed").Inc()
		return err
	}
	e.m.steps.WithLabelValues(spec.kind, "completed").Inc()
	return nil
}

// wait sleeps until the wait step's deadline, recording the deadline first so a resumed run
// waits only for the time left.
func (e *engine) wait(ctx context.Context, st *runState, i int, spec stepSpec) error {
	cur := st.out.Current
	if cur == nil || cur.Index != i || cur.WaitUntil == nil {
		now := time.Now().UTC()
		until := now.Add(spec.wait)
		cur = &CurrentStep{Index: i, Step: st.steps[i], StartedAt: now, WaitUntil: &until}
		prev := st.out.Current
		st.out.Current = cur
		err := pgx.BeginFunc(ctx, e.s.pool, func(tx pgx.Tx) error {
			if err := e.hold(ctx, tx, st); err != nil {
				return err
			}
			return e.save(ctx, tx, st)
		})
		if err != nil {
			st.out.Current = prev
			return err
		}
	}
	t := time.NewTimer(time.Until(*cur.WaitUntil))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// finish ends the run in status with msg (the error of a FAILED run), unless it is no longer
// held.
func (e *engine) finish(ctx context.Context, st *runState, status, msg string) error {
	err := pgx.BeginFunc(ctx, e.s.pool, func(tx pgx.Tx) error {
		if err := e.hold(ctx, tx, st); err != nil {
			return err
		}
		return e.end(ctx, tx, st, status, msg)
	})
	if err != nil {
		return err
	}
	e.m.runs.WithLabelValues(status).Inc()
	return nil
}

// end writes the run's end state and its end events in tx.
func (e *engine) end(ctx context.Context, tx pgx.Tx, st *runState, status, msg string) error {
	st.out.Current = nil
	out, err := json.Marshal(st.out)
	if err != nil {
		return err
	}
	var errText *string
	if msg != "" {
		errText = &msg
	}
	rows, _ := tx.Query(ctx, `update workflow_runs set status = $2, output = $3, error = $4, completed_at = now(),
duration_ms = greatest(0, (extract(epoch from now() - started_at) * 1000)::int), lease_owner = null, lease_until = null,
updated_at = now() where id = $1 returning `+runColumns, st.run.ID, status, out, errText)
	r, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Run])
	if err != nil {
		return fmt.Errorf("end run: %w", err)
	}
	st.run = r
	evs, err := runEvents(r)
	if err != nil {
		return err
	}
	return outbox.AppendEvents(ctx, tx, e.s.eventsTopic, evs...)
}

// requeue moves a RUNNING run back to QUEUED with a new command, so any runner resumes it after
// its last committed step. held selects the run this runner holds (a clean stop) rather than one
// whose lease ran out (the sweeper). It reports whether the run was re-queued.
func (e *engine) requeue(ctx context.Context, runID string, held *runState, reason string) (bool, error) {
	done := false
	err := pgx.BeginFunc(ctx, e.s.pool, func(tx pgx.Tx) error {
		var cond string
		args := []any{runID}
		// A clean stop hands the claim back uncounted: only interruptions the runner did not
		// choose count towards MaxAttempts.
		if held != nil {
			cond = `lease_owner = $2 and attempts = $3`
			args = append(args, e.owner, held.attempts)
		} else {
			cond = `lease_until < now()`
		}
		uncount := "attempts"
		if held != nil {
			uncount = "attempts - 1"
		}
		rows, _ := tx.Query(ctx, `update workflow_runs set status = 'QUEUED', attempts = `+uncount+`, lease_owner = null,
	lease_until = null, updated_at = now()
where id = $1 and status = 'RUNNING' and `+cond+` returning `+runColumns+`, attempts`, args...)
		var r Run
		var attempts int
		_, err := pgx.ForEachRow(rows, []any{&r.ID, &r.OrgID, &r.ProjectID, &r.WorkflowID, &r.Status, &r.Trigger, &r.Input,
			&r.Output, &r.Error, &r.DurationMs, &r.StartedAt, &r.CompletedAt, &attempts}, func() error { done = true; return nil })
		if err != nil || !done {
			return err
		}
		if err := e.s.enqueue(ctx, tx, &r, attempts+1, true); err != nil {
			return err
		}
		evs, err := runEvents(&r)
		if err != nil {
			return err
		}
		return outbox.AppendEvents(ctx, tx, e.s.eventsTopic, evs...)
	})
	if err == nil && done {
		e.log.Info("workflow run re-queued", "run_id", runID, "reason", reason)
		e.m.requeued.Inc()
	}
	return done, err
}

// runStep executes one step inside tx and returns its output.
func (e *engine) runStep(ctx context.Context, tx pgx.Tx, st *runState, spec stepSpec) (any, error) {
	switch spec.kind {
	case "load_patient":
		return st.loadPatient(ctx, tx)
	case "latest_vitals":
		return e.latestVitals(ctx, tx, st)
	case "score_news2":
		return e.score(ctx, tx, st, clinical.SkillNEWS2)
	case "score_qsofa":
		return e.score(ctx, tx, st, clinical.SkillQSOFA)
	case "vitals_trend":
		return e.score(ctx, tx, st, clinical.SkillVitalsTrend)
	case "assess_risk":
		return e.assessRisk(st), nil
	case "update_risk_level":
		return e.updateRiskLevel(ctx, tx, st)
	case "create_alert":
		return e.createAlert(ctx, tx, st)
	case "notify":
		return e.notify(ctx, tx, st)
	case RunAgentPrefix:
		return e.runAgent(ctx, tx, st, spec.agentID)
	case WaitPrefix:
		return map[string]int64{"waitedMs": spec.wait.Milliseconds()}, nil
	}
	return nil, failf("unknown step kind %q", spec.kind)
}

// loadPatient resolves the run's patient once per claim: a patient of the workflow's
// organization, synthetic for a test-mode run. Unknown and invisible are the same failure.
func (st *runState) loadPatient(ctx context.Context, tx pgx.Tx) (*patientInfo, error) {
	if st.patient != nil {
		return st.patient, nil
	}
	id := patientFromInput(st.run.Input)
	if id == "" {
		return nil, failf("the run has no patient: start it with input patient_id")
	}
	p := patientInfo{ID: id}
	err := tx.QueryRow(ctx, `select risk_level, synthetic from patients where id = $1 and org_id = $2 and ($3 or synthetic)`,
		id, st.run.OrgID, st.mode == access.Live).Scan(&p.RiskLevel, &p.Synthetic)
	if errors.Is(err, pgx.ErrNoRows) {
		if st.mode != access.Live {
			// The same words for a real patient as for an unknown one: a test run learns nothing.
			return nil, failf("patient %q not found among the synthetic patients a test-mode run may reach", id)
		}
		return nil, failf("patient %q not found", id)
	}
	if err != nil {
		return nil, fmt.Errorf("patient %s: %w", id, err)
	}
	st.patient = &p
	st.out.PatientID = id
	return st.patient, nil
}

// options are the skill options the run input carries (spo2Scale, onOxygen, consciousness,
// window); other input fields are ignored.
func (st *runState) options() (clinical.Options, error) {
	var opts clinical.Options
	if len(st.run.Input) == 0 {
		return opts, nil
	}
	if err := json.Unmarshal(st.run.Input, &opts); err != nil {
		return opts, failf("input: %v", err)
	}
	return opts, nil
}

type vital struct {
	Code          string    `json:"code"`
	Name          string    `json:"name"`
	Value         float64   `json:"value"`
	Unit          string    `json:"unit"`
	ObservationID string    `json:"observationId"`
	EffectiveAt   time.Time `json:"effectiveAt"`
}

func (e *engine) latestVitals(ctx context.Context, tx pgx.Tx, st *runState) (any, error) {
	p, err := st.loadPatient(ctx, tx)
	if err != nil {
		return nil, err
	}
	signs := clinical.VitalSigns()
	codes := make([]string, len(signs))
	for i, v := range signs {
		codes[i] = v.Code
	}
	latest := map[string]vital{}
	err = agents.Latest(ctx, tx, []string{p.ID}, codes, func(_ string, o clinical.Observation) {
		latest[o.Code] = vital{ObservationID: o.ID, Code: o.Code, Value: o.Value, Unit: o.Unit, EffectiveAt: o.EffectiveAt}
	})
	if err != nil {
		return nil, err
	}
	out := struct {
		Vitals  []vital  `json:"vitals"`
		Missing []string `json:"missing"`
	}{Vitals: []vital{}, Missing: []string{}}
	for _, s := range signs {
		if x, ok := latest[s.Code]; ok {
			x.Name = s.Name
			out.Vitals = append(out.Vitals, x)
		} else {
			out.Missing = append(out.Missing, s.Name)
		}
	}
	return out, nil
}

func (e *engine) score(ctx context.Context, tx pgx.Tx, st *runState, skillName string) (any, error) {
	p, err := st.loadPatient(ctx, tx)
	if err != nil {
		return nil, err
	}
	opts, err := st.options()
	if err != nil {
		return nil, err
	}
	skill, _ := clinical.Lookup(skillName)
	as, err := agents.Assess(ctx, tx, skill, p.ID, opts)
	if err != nil {
		return nil, err
	}
	if as.Output == nil {
		return nil, failf("%s", as.Failure)
	}
	st.out.Severity = string(clinical.MaxSeverity(clinical.Severity(st.out.Severity), as.Output.Severity))
	return as.Output, nil
}

// scored is a score an earlier step produced.
type scored struct {
	step     string
	out      clinical.Output
	reportID string // the run_agent session's own report
}

// agentStepOutput is what a run_agent step records.
type agentStepOutput struct {
	SessionID string           `json:"sessionId"`
	AgentID   string           `json:"agentId"`
	Status    string           `json:"status"`
	Output    *clinical.Output `json:"output"`
	ReportID  string           `json:"reportId,omitempty"`
}

// scores returns the scores of the run's completed steps, in order (rebuilt from the recorded
// results, so a resumed run sees those of its earlier claims).
func (st *runState) scores() []scored {
	var out []scored
	for _, r := range st.out.Steps {
		if r.Status != RunCompleted {
			continue
		}
		spec, ok := parseStep(r.Step)
		if !ok || !spec.scoring() {
			continue
		}
		if spec.kind == RunAgentPrefix {
			var a agentStepOutput
			if json.Unmarshal(r.Output, &a) == nil && a.Output != nil && a.Output.Score != nil {
				out = append(out, scored{step: r.Step, out: *a.Output, reportID: a.ReportID})
			}
			continue
		}
		var o clinical.Output
		if json.Unmarshal(r.Output, &o) == nil && o.Score != nil {
			out = append(out, scored{step: r.Step, out: o})
		}
	}
	return out
}

func (e *engine) assessRisk(st *runState) any {
	type basis struct {
		Step     string            `json:"step"`
		Skill    string            `json:"skill"`
		Score    *int              `json:"score"`
		Band     string            `json:"band,omitempty"`
		Severity clinical.Severity `json:"severity"`
	}
	severity := clinical.SeverityNone
	based := []basis{}
	for _, s := range st.scores() {
		severity = clinical.MaxSeverity(severity, s.out.Severity)
		based = append(based, basis{s.step, s.out.Skill, s.out.Score, s.out.Band, s.out.Severity})
	}
	st.out.Severity = string(severity)
	return map[string]any{"severity": severity, "basedOn": based}
}

// riskLevels maps a severity onto FHIRPatient.riskLevel.
var riskLevels = map[string]string{"CRITICAL": "critical", "HIGH": "high", "MEDIUM": "moderate", "LOW": "low", "NONE": "low"}

func (e *engine) updateRiskLevel(ctx context.Context, tx pgx.Tx, st *runState) (any, error) {
	p, err := st.loadPatient(ctx, tx)
	if err != nil {
		return nil, err
	}
	level := riskLevels[st.out.Severity]
	var previous *string
	if err := tx.QueryRow(ctx, `update patients p set risk_level = $2, updated_at = now() from (select risk_level from patients where id = $1 for update) old
where p.id = $1 returning old.risk_level`, p.ID, level).Scan(&previous); err != nil {
		return nil, fmt.Errorf("update risk level: %w", err)
	}
	p.RiskLevel = &level
	return map[string]any{"riskLevel": level, "previous": previous}, nil
}

func (e *engine) createAlert(ctx context.Context, tx pgx.Tx, st *runState) (any, error) {
	var reportIDs []string
	for _, s := range st.scores() {
		if !agents.Qualifies(s.out) {
			continue
		}
		if s.reportID != "" {
			reportIDs = append(reportIDs, s.reportID) // the agent session reported it already
			continue
		}
		rep, err := agents.NewReport(agents.ReportSpec{OrgID: st.run.OrgID, ProjectID: st.run.ProjectID, PatientID: st.out.PatientID,
			RunID: st.run.ID, Performer: "carehub workflow " + st.run.WorkflowID, Output: s.out, At: time.Now()})
		if err != nil {
			return nil, err
		}
		if err := agents.InsertReport(ctx, tx, e.s.eventsTopic, &rep, events.SourceWorkflow); err != nil {
			return nil, err
		}
		reportIDs = append(reportIDs, rep.ID)
		if !slices.Contains(st.out.ReportIDs, rep.ID) {
			st.out.ReportIDs = append(st.out.ReportIDs, rep.ID)
		}
	}
	alert := len(reportIDs) > 0
	st.out.AlertGenerated = st.out.AlertGenerated || alert
	if reportIDs == nil {
		reportIDs = []string{}
	}
	return map[string]any{"alert": alert, "severity": st.out.Severity, "reportIds": reportIDs}, nil
}

func (e *engine) notify(ctx context.Context, tx pgx.Tx, st *runState) (any, error) {
	rows, _ := tx.Query(ctx, `select events from webhooks where project_id = $1 and deleted_at is null and status in ('active', 'failing')`,
		st.run.ProjectID)
	patterns, err := pgx.CollectRows(rows, pgx.RowTo[[]string])
	if err != nil {
		return nil, fmt.Errorf("webhooks: %w", err)
	}
	n := 0
	for _, p := range patterns {
		if events.MatchAny(p, events.TypeWorkflowRunCompleted) {
			n++
		}
	}
	return map[string]any{"event": events.TypeWorkflowRunCompleted, "subscriptions": n}, nil
}

func (e *engine) runAgent(ctx context.Context, tx pgx.Tx, st *runState, agentID string) (any, error) {
	p, err := st.loadPatient(ctx, tx)
	if err != nil {
		return nil, err
	}
	ses, rep, err := e.agents.Execute(ctx, tx, agents.ExecRequest{AgentID: agentID, ProjectID: st.run.ProjectID, PatientID: p.ID,
		RunID: st.run.ID, Input: st.run.Input})
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		if k := faultMessage(err); k != "" {
			return nil, failf("%s", k)
		}
		return nil, err
	}
	if ses.Status != agents.StatusCompleted {
		msg := ses.Status
		if ses.Error != nil {
			msg = *ses.Error
		}
		return nil, failf("agent session %s %s: %s", ses.ID, ses.Status, msg)
	}
	out := agentStepOutput{SessionID: ses.ID, AgentID: agentID, Status: ses.Status}
	var so clinical.Output
	if json.Unmarshal(ses.Output, &so) == nil {
		out.Output = &so
		st.out.Severity = string(clinical.MaxSeverity(clinical.Severity(st.out.Severity), so.Severity))
	}
	if rep != nil {
		out.ReportID = rep.ID
		st.out.ReportIDs = append(st.out.ReportIDs, rep.ID)
	}
	return out, nil
}

// clone copies the output deeply enough that a rolled-back step can restore it.
func (o RunOutput) clone() RunOutput {
	c := o
	c.ReportIDs = slices.Clone(o.ReportIDs)
	c.Steps = slices.Clone(o.Steps)
	if o.Current != nil {
		cur := *o.Current
		c.Current = &cur
	}
	return c
}

// faultMessage returns the client-facing message of a classified error (an unknown agent or
// patient, a bad input), "" for an unclassified one.
func faultMessage(err error) string {
	if f := fault.As(err); f != nil && f.Kind != fault.KindInternal {
		return f.Message
	}
	return ""
}
