package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/events"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/kernel/phi"
	"carehub/processors/internal/scoped"
	"carehub/storage/idempotency"
	"carehub/storage/outbox"
)

const runColumns = `id, org_id, project_id, workflow_id, status, trigger, input, output, error, duration_ms, started_at, completed_at`

// RunOptions qualify Start.
type RunOptions struct {
	Trigger string // TriggerManual (default) or TriggerEvent
	// PatientID, when set, is the run's patient (else the input's patient_id or patientId).
	PatientID string
}

// RunOutput is the output of a run as the runner records it, step by step.
type RunOutput struct {
	PatientID      string       `json:"patientId,omitempty"`
	Severity       string       `json:"severity"`       // the highest severity of the scores so far
	AlertGenerated bool         `json:"alertGenerated"` // create_alert raised an alert
	ReportIDs      []string     `json:"reportIds"`      // reports of the run (create_alert, run_agent)
	Claims         int          `json:"claims"`         // times a runner took the run up: more than 1 when it was resumed
	Steps          []StepResult `json:"steps"`          // one per finished step, in order
	// Current is the step in progress, recorded only for steps that wait.
	Current *CurrentStep `json:"current,omitempty"`
}

// StepResult is the recorded result of one step.
type StepResult struct {
	Step       string          `json:"step"`
	Status     string          `json:"status"` // COMPLETED or FAILED
	StartedAt  time.Time       `json:"startedAt"`
	DurationMs int64           `json:"durationMs"`
	Output     json.RawMessage `json:"output,omitempty"`
	Error      string          `json:"error,omitempty"`
}

// CurrentStep is a step in progress.
type CurrentStep struct {
	Index     int        `json:"index"`
	Step      string     `json:"step"`
	StartedAt time.Time  `json:"startedAt"`
	WaitUntil *time.Time `json:"waitUntil,omitempty"`
}

// patientFromInput returns the patient a run's input names (patient_id, or patientId).
func patientFromInput(input json.RawMessage) string {
	var in struct {
		Snake string `json:"patient_id"`
		Camel string `json:"patientId"`
	}
	if len(input) == 0 || json.Unmarshal(input, &in) != nil {
		return ""
	}
	if in.Snake != "" {
		return in.Snake
	}
	return in.Camel
}

// Start queues a run of an ACTIVE workflow with input (a JSON object, or nil): it writes the run
// QUEUED, the runner's command and a workflow.run.updated event in one transaction. A paused or
// archived workflow is a Conflict. The run's patient (o.PatientID, else the input's patient_id or
// patientId) must be a patient of the workflow's organization visible to the run, else NotFound.
// The run is in test mode when the caller or the workflow is (runMode), and a test-mode run
// reaches only synthetic patients. Requires exec:workflows.
func (s *Service) Start(ctx context.Context, workflowID string, input json.RawMessage, o RunOptions) (*Run, error) {
	p, err := access.Require(ctx, access.ExecWorkflows)
	if err != nil {
		return nil, err
	}
	if o.Trigger == "" {
		o.Trigger = TriggerManual
	}
	if o.Trigger != TriggerManual && o.Trigger != TriggerEvent {
		return nil, fault.Validation("invalid workflow run", map[string]string{"trigger": "must be manual or event"})
	}
	if t := strings.TrimSpace(string(input)); t == "" || t == "null" {
		input = nil
	} else if !strings.HasPrefix(t, "{") || !json.Valid(input) {
		return nil, fault.Validation("invalid workflow run", map[string]string{"input": "must be a JSON object"})
	}
	patientID := o.PatientID
	if patientID == "" {
		patientID = patientFromInput(input)
	}
	var out *Run
	err = idempotency.Tx(ctx, s.pool, &out, func(tx pgx.Tx) error {
		var orgID, projectID, status, workflowMode string
		err := tx.QueryRow(ctx, `select org_id, project_id, status, mode from workflows where id = $1 and ($2 = '' or org_id = $2) for share`,
			workflowID, p.OrgFilter()).Scan(&orgID, &projectID, &status, &workflowMode)
		if errors.Is(err, pgx.ErrNoRows) {
			return fault.NotFound("workflow", workflowID)
		}
		if err != nil {
			return fmt.Errorf("workflow %s: %w", workflowID, err)
		}
		if status != StatusActive {
			return fault.Conflict("workflow %s is %s: runs start only on an ACTIVE workflow", workflowID, status)
		}
		mode := runMode(workflowMode, modeOf(p))
		if patientID != "" {
			var found bool
			if err := tx.QueryRow(ctx, `select exists(select 1 from patients where id = $1 and org_id = $2 and ($3 or synthetic))`,
				patientID, orgID, mode == access.Live).Scan(&found); err != nil {
				return fmt.Errorf("patient %s: %w", patientID, err)
			}
			if !found {
				return fault.NotFound("patient", patientID)
			}
			access.Touch(ctx, access.KindPatient, patientID)
		}
		out, _, err = s.insertRun(ctx, tx, newRun{orgID: orgID, projectID: projectID, workflowID: workflowID,
			trigger: o.Trigger, mode: mode, input: input})
		return err
	})
	if err != nil {
		return nil, fault.Context(err, "start workflow run")
	}
	access.Touch(ctx, access.KindRun, out.ID)
	return s.served(ctx, out)
}

// newRun is a run to insert.
type newRun struct {
	orgID, projectID, workflowID string
	trigger, mode                string
	eventID                      string // the triggering event; one run per workflow and event
	depth                        int
	input                        json.RawMessage
}

// insertRun writes a QUEUED run, its command and workflow.run.updated in tx. It returns false
// (and no run) when the run's triggering event already started a run of the workflow.
func (s *Service) insertRun(ctx context.Context, tx pgx.Tx, nr newRun) (*Run, bool, error) {
	var eventID *string
	if nr.eventID != "" {
		eventID = &nr.eventID
	}
	rows, _ := tx.Query(ctx, `insert into workflow_runs (id, org_id, project_id, workflow_id, status, trigger, input, mode,
trigger_event_id, trigger_depth) values ($1, $2, $3, $4, 'QUEUED', $5, $6, $7, $8, $9)
on conflict (workflow_id, trigger_event_id) where trigger_event_id is not null do nothing
returning `+runColumns, ids.New(ids.Run), nr.orgID, nr.projectID, nr.workflowID, nr.trigger, nr.input, nr.mode, eventID, nr.depth)
	r, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Run])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("insert run: %w", err)
	}
	if err := s.enqueue(ctx, tx, r, 1, false); err != nil {
		return nil, false, err
	}
	evs, err := runEvents(r)
	if err != nil {
		return nil, false, err
	}
	if err := outbox.AppendEvents(ctx, tx, s.eventsTopic, evs...); err != nil {
		return nil, false, err
	}
	return r, true, nil
}

// enqueue writes the runner's command for r into the outbox in tx: keyed by run id, with a
// unique outbox id ("<run id>:1" for the first; "<run id>:<attempt>:<ulid>" for a re-send). The
// relay is woken on commit.
func (s *Service) enqueue(ctx context.Context, tx pgx.Tx, r *Run, attempt int, resend bool) error {
	cmd, err := json.Marshal(Command{RunID: r.ID, WorkflowID: r.WorkflowID, OrgID: r.OrgID, ProjectID: r.ProjectID, Attempt: attempt})
	if err != nil {
		return err
	}
	outboxID := r.ID + ":1"
	if resend {
		outboxID = r.ID + ":" + strconv.Itoa(attempt) + ":" + ids.New("")
	}
	if err := outbox.Append(ctx, tx, outbox.Message{ID: outboxID, Topic: s.runsTopic, Key: r.ID, Value: cmd}); err != nil {
		return fmt.Errorf("queue run command: %w", err)
	}
	return nil
}

// Cancel moves a QUEUED or RUNNING run to CANCELLED and emits the run's end events; a finished
// run is a Conflict. A RUNNING run stops before its next step (its runner checks between steps).
// Requires exec:workflows.
func (s *Service) Cancel(ctx context.Context, runID string) (*Run, error) {
	p, err := access.Require(ctx, access.ExecWorkflows)
	if err != nil {
		return nil, err
	}
	var out *Run
	err = idempotency.Tx(ctx, s.pool, &out, func(tx pgx.Tx) error {
		var status string
		err := tx.QueryRow(ctx, `select status from workflow_runs where id = $1 and ($2 = '' or org_id = $2) for update`,
			runID, p.OrgFilter()).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return fault.NotFound("workflow run", runID)
		}
		if err != nil {
			return fmt.Errorf("workflow run %s: %w", runID, err)
		}
		if status != RunQueued && status != RunRunning {
			return fault.Conflict("workflow run %s is %s: only a QUEUED or RUNNING run can be cancelled", runID, status)
		}
		rows, _ := tx.Query(ctx, `update workflow_runs set status = 'CANCELLED', error = 'cancelled by request', completed_at = now(),
duration_ms = greatest(0, (extract(epoch from now() - started_at) * 1000)::int), lease_owner = null, lease_until = null,
updated_at = now() where id = $1 returning `+runColumns, runID)
		if out, err = pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Run]); err != nil {
			return fmt.Errorf("cancel run: %w", err)
		}
		evs, err := runEvents(out)
		if err != nil {
			return err
		}
		return outbox.AppendEvents(ctx, tx, s.eventsTopic, evs...)
	})
	if err != nil {
		return nil, fault.Context(err, "cancel workflow run")
	}
	access.Touch(ctx, access.KindRun, out.ID)
	return s.served(ctx, out)
}

// outcome reads the severity and alert a run's output records (NONE and false when it has none).
func outcome(output json.RawMessage) (severity string, alert bool) {
	var o RunOutput
	if len(output) > 0 && json.Unmarshal(output, &o) == nil && o.Severity != "" {
		return o.Severity, o.AlertGenerated
	}
	return "NONE", false
}

// runEvents returns workflow.run.updated for any state and, for a run that ended,
// workflow.run.completed (the spec's webhook shape) and workflow.completed (its compact form).
func runEvents(r *Run) ([]events.Event, error) {
	updated := map[string]any{"runId": r.ID, "workflowId": r.WorkflowID, "status": r.Status,
		"startedAt": r.StartedAt.UTC().Format(time.RFC3339Nano)}
	if r.DurationMs != nil {
		updated["durationMs"] = *r.DurationMs
	}
	if r.CompletedAt != nil {
		updated["completedAt"] = r.CompletedAt.UTC().Format(time.RFC3339Nano)
	}
	ev, err := events.New(events.TypeWorkflowRunUpdated, r.OrgID, r.ProjectID, events.SourceWorkflow, events.SeverityInfo, updated)
	if err != nil {
		return nil, err
	}
	evs := []events.Event{ev}
	if r.CompletedAt == nil {
		return evs, nil
	}
	var duration int32
	if r.DurationMs != nil {
		duration = *r.DurationMs
	}
	severity, alert := outcome(r.Output)
	envSeverity := events.SeverityInfo
	switch {
	case r.Status == RunFailed:
		envSeverity = events.SeverityError
	case alert && severity == "CRITICAL":
		envSeverity = events.SeverityCritical
	case alert:
		envSeverity = events.SeverityWarning
	}
	completed, err := events.New(events.TypeWorkflowRunCompleted, r.OrgID, r.ProjectID, events.SourceWorkflow, envSeverity,
		map[string]any{"run_id": r.ID, "workflow_id": r.WorkflowID, "status": r.Status, "duration_ms": duration,
			"alert_generated": alert, "severity": severity})
	if err != nil {
		return nil, err
	}
	compact, err := events.New(events.TypeWorkflowCompleted, r.OrgID, r.ProjectID, events.SourceWorkflow, events.SeverityInfo,
		map[string]any{"workflowId": r.WorkflowID, "runId": r.ID, "status": r.Status, "durationMs": duration})
	if err != nil {
		return nil, err
	}
	return append(evs, completed, compact), nil
}

// Run returns one run of the caller's organization.
func (s *Service) Run(ctx context.Context, id string) (*Run, error) {
	r, err := scoped.One[Run](ctx, s.pool, "workflow run", runColumns, "workflow_runs", id)
	if err != nil {
		return nil, err
	}
	access.Touch(ctx, access.KindRun, r.ID)
	return s.served(ctx, r)
}

// RunsByWorkflow returns the runs of each workflow among workflowIDs, newest first, at most limit
// per workflow (a batched loader).
func (s *Service) RunsByWorkflow(ctx context.Context, workflowIDs []string, limit int) (map[string][]Run, error) {
	list, err := scoped.LatestPer[Run](ctx, s.pool, runColumns, "workflow_runs", "workflow_id", "workflows", "runs by workflow",
		workflowIDs, "c.started_at desc, c.id desc", limit)
	if err != nil {
		return nil, err
	}
	served := make([]*Run, len(list))
	for i := range list {
		served[i] = &list[i]
		access.Touch(ctx, access.KindRun, list[i].ID)
	}
	if err := s.serve(ctx, served...); err != nil {
		return nil, err
	}
	return scoped.Group(list, func(r *Run) string { return r.WorkflowID }), nil
}

// served is serve for one run.
func (s *Service) served(ctx context.Context, r *Run) (*Run, error) {
	if err := s.serve(ctx, r); err != nil {
		return nil, err
	}
	return r, nil
}

// serve readies runs for the caller in ctx: a run whose input or output names a patient is
// patient data (phi.WorkflowRun). One the caller may not see loses its input and output and is
// marked Redacted; the patients of the others are touched for the audit record.
func (s *Service) serve(ctx context.Context, rs ...*Run) error {
	var subjects []phi.Subject
	var at []*Run
	for _, r := range rs {
		if n := phi.Patients(r.Input, r.Output); n.Named {
			subjects = append(subjects, phi.Subject{OrgID: r.OrgID, Patients: n.IDs, Unidentified: n.Unidentified, Need: phi.WorkflowRun.Need})
			at = append(at, r)
		}
	}
	if len(subjects) == 0 {
		return nil
	}
	ok, err := s.guard.Serve(ctx, subjects)
	if err != nil {
		return fmt.Errorf("workflow runs: %w", err)
	}
	for i, r := range at {
		if !ok[i] {
			r.Input, r.Output, r.Error, r.Redacted = nil, nil, nil, true
		}
	}
	return nil
}
