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

	"carehub/processors/access"
	"carehub/processors/events"
	"carehub/processors/fault"
	"carehub/storage"
	"carehub/storage/ids"
)

const runColumns = `id, org_id, project_id, workflow_id, status, trigger, input, output, error, duration_ms, started_at, completed_at`

// RunOptions qualify Start.
type RunOptions struct {
	Trigger   string // TriggerManual (default) or TriggerEvent
	PatientID string // when set, the patient must be visible to the caller in the workflow's organization
}

// Start queues a run of an ACTIVE workflow with input (a JSON object, or nil): it writes the run
// QUEUED, the runner's command and a workflow.run.updated event in one transaction. A paused or
// archived workflow is a Conflict. Requires exec:workflows.
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
	var out *Run
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var orgID, projectID, status string
		err := tx.QueryRow(ctx, `select org_id, project_id, status from workflows where id = $1 and ($2 = '' or org_id = $2) for share`,
			workflowID, p.OrgFilter()).Scan(&orgID, &projectID, &status)
		if errors.Is(err, pgx.ErrNoRows) {
			return fault.NotFound("workflow", workflowID)
		}
		if err != nil {
			return fmt.Errorf("workflow %s: %w", workflowID, err)
		}
		if status != StatusActive {
			return fault.Conflict("workflow %s is %s: runs start only on an ACTIVE workflow", workflowID, status)
		}
		if o.PatientID != "" {
			var found bool
			if err := tx.QueryRow(ctx, `select exists(select 1 from patients where id = $1 and org_id = $2 and ($3 or synthetic))`,
				o.PatientID, orgID, p.SeesRealPatients()).Scan(&found); err != nil {
				return fmt.Errorf("patient %s: %w", o.PatientID, err)
			}
			if !found {
				return fault.NotFound("patient", o.PatientID)
			}
		}
		rows, _ := tx.Query(ctx, `insert into workflow_runs (id, org_id, project_id, workflow_id, status, trigger, input)
values ($1, $2, $3, $4, 'QUEUED', $5, $6) returning `+runColumns, ids.New(ids.Run), orgID, projectID, workflowID, o.Trigger, input)
		if out, err = pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Run]); err != nil {
			return fmt.Errorf("insert run: %w", err)
		}
		cmd, err := json.Marshal(Command{RunID: out.ID, WorkflowID: workflowID, OrgID: orgID, ProjectID: projectID, Attempt: 1})
		if err != nil {
			return err
		}
		// The command is not an event, so it goes into the outbox directly: keyed by run id, with
		// "<run id>:<attempt>" as its unique outbox id. NOTIFY wakes the relay on commit.
		if _, err := tx.Exec(ctx, `with cmd as (insert into outbox (event_id, topic, key, value) values ($1, $2, $3, $4::jsonb) returning 1)
select pg_notify($5, '') from cmd`, out.ID+":"+strconv.Itoa(1), s.runsTopic, out.ID, string(cmd), events.NotifyChannel); err != nil {
			return fmt.Errorf("queue run command: %w", err)
		}
		evs, err := runEvents(out)
		if err != nil {
			return err
		}
		return events.Append(ctx, tx, s.eventsTopic, evs...)
	})
	if err != nil {
		return nil, classify(err, "start workflow run")
	}
	return out, nil
}

// Cancel moves a QUEUED or RUNNING run to CANCELLED and emits the run's end events; a finished
// run is a Conflict. Requires exec:workflows.
func (s *Service) Cancel(ctx context.Context, runID string) (*Run, error) {
	p, err := access.Require(ctx, access.ExecWorkflows)
	if err != nil {
		return nil, err
	}
	var out *Run
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
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
duration_ms = greatest(0, (extract(epoch from now() - started_at) * 1000)::int), updated_at = now()
where id = $1 returning `+runColumns, runID)
		if out, err = pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Run]); err != nil {
			return fmt.Errorf("cancel run: %w", err)
		}
		evs, err := runEvents(out)
		if err != nil {
			return err
		}
		return events.Append(ctx, tx, s.eventsTopic, evs...)
	})
	if err != nil {
		return nil, classify(err, "cancel workflow run")
	}
	return out, nil
}

// runEvents returns workflow.run.updated for any state and, for a run that ended,
// workflow.run.completed (the spec's webhook shape) and workflow.completed (its compact form).
func runEvents(r *Run) ([]storage.Event, error) {
	updated := map[string]any{"runId": r.ID, "workflowId": r.WorkflowID, "status": r.Status,
		"startedAt": r.StartedAt.UTC().Format(time.RFC3339Nano)}
	if r.DurationMs != nil {
		updated["durationMs"] = *r.DurationMs
	}
	if r.CompletedAt != nil {
		updated["completedAt"] = r.CompletedAt.UTC().Format(time.RFC3339Nano)
	}
	ev, err := events.New("workflow.run.updated", r.OrgID, r.ProjectID, events.SourceWorkflow, events.SeverityInfo, updated)
	if err != nil {
		return nil, err
	}
	evs := []storage.Event{ev}
	if r.CompletedAt == nil {
		return evs, nil
	}
	var duration int32
	if r.DurationMs != nil {
		duration = *r.DurationMs
	}
	completed, err := events.New("workflow.run.completed", r.OrgID, r.ProjectID, events.SourceWorkflow, events.SeverityInfo,
		map[string]any{"run_id": r.ID, "workflow_id": r.WorkflowID, "status": r.Status, "duration_ms": duration,
			"alert_generated": false, "severity": "NONE"})
	if err != nil {
		return nil, err
	}
	compact, err := events.New("workflow.completed", r.OrgID, r.ProjectID, events.SourceWorkflow, events.SeverityInfo,
		map[string]any{"workflowId": r.WorkflowID, "runId": r.ID, "status": r.Status, "durationMs": duration})
	if err != nil {
		return nil, err
	}
	return append(evs, completed, compact), nil
}

// Run returns one run of the caller's organization.
func (s *Service) Run(ctx context.Context, id string) (*Run, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+runColumns+` from workflow_runs where id = $1 and ($2 = '' or org_id = $2)`, id, p.OrgFilter())
	r, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Run])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("workflow run", id)
	}
	if err != nil {
		return nil, fmt.Errorf("workflow run %s: %w", id, err)
	}
	return r, nil
}

// RunsByWorkflow returns the runs of each workflow among workflowIDs, newest first, at most limit
// per workflow (a batched loader).
func (s *Service) RunsByWorkflow(ctx context.Context, workflowIDs []string, limit int) (map[string][]Run, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select r.* from workflows w cross join lateral (
	select `+runColumns+` from workflow_runs r where r.workflow_id = w.id order by r.started_at desc, r.id desc limit $3
) r where w.id = any($1) and ($2 = '' or w.org_id = $2)`, workflowIDs, p.OrgFilter(), limit)
	list, err := pgx.CollectRows(rows, pgx.RowToStructByName[Run])
	if err != nil {
		return nil, fmt.Errorf("runs by workflow: %w", err)
	}
	out := make(map[string][]Run, len(workflowIDs))
	for _, r := range list {
		out[r.WorkflowID] = append(out[r.WorkflowID], r)
	}
	return out, nil
}
