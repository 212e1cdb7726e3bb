// Package workflows serves workflow definitions and runs them. A workflow is an ordered list of
// steps from a fixed catalogue (steps.go, STEPS.md); a run is queued by the service and executed
// by the Runner, a Kafka consumer group ("carehub-workflow-runner") reading
// carehub.workflow-runs.v1. Triggers (a consumer group on carehub.events.v1,
// "carehub-workflow-triggers") start runs from events that match a workflow's trigger patterns.
//
// # States
//
// Workflows: ACTIVE (runs may start) ⇄ PAUSED; ACTIVE or PAUSED → ARCHIVED (final). A run of a
// workflow that is not ACTIVE is refused with CONFLICT. Runs: QUEUED → RUNNING → COMPLETED |
// FAILED; QUEUED or RUNNING → CANCELLED (cancelWorkflowRun); RUNNING → QUEUED when a runner stops
// or dies mid-run (re-queued, then resumed by any runner).
//
// # Exactly the effects of one execution
//
// Starting a run writes the run QUEUED, the runner's command (an outbox row on the workflow-runs
// topic, key run id) and workflow.run.updated in one transaction, so a run exists exactly when its
// command does. The runner claims a run (QUEUED → RUNNING with a lease, attempts + 1, in one
// transaction with workflow.run.updated); a redelivered command for a run that is finished, or
// RUNNING under another runner's live lease, is skipped. Each step then commits its effects
// (reports, events, the patient's riskLevel, an agent session) together with its result in the
// run output, in one transaction that first checks that the run is still RUNNING under this
// runner's lease: a run cancelled between steps stops there, and a resumed run continues after
// the last step that committed, so no step's effects are applied twice. The end state commits
// with workflow.run.updated, workflow.run.completed and workflow.completed. The command's offset
// is committed only after that (or after a skip).
//
// # Crashes
//
// A runner renews the leases of its runs while they execute. A runner that stops cleanly
// re-queues its unfinished runs at once (RUNNING → QUEUED, with a new command); one that dies
// leaves leases that run out, and the sweeper of any runner (at start and every SweepInterval)
// re-queues those runs, or FAILs them once they were claimed MaxAttempts times. The sweeper also
// re-sends the command of a run QUEUED for longer than RequeueAfter (a lost message): duplicate
// commands are harmless, since claims are idempotent.
package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
	"carehub/kernel/config"
	"carehub/kernel/events"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/kernel/phi"
	"carehub/processors/internal/scoped"
	"carehub/storage/idempotency"
	"carehub/storage/kafka"
	"carehub/storage/postgres"
)

// Workflow statuses.
const (
	StatusActive   = "ACTIVE"
	StatusPaused   = "PAUSED"
	StatusArchived = "ARCHIVED"
)

// Run statuses (RunStatus).
const (
	RunQueued    = "QUEUED"
	RunRunning   = "RUNNING"
	RunCompleted = "COMPLETED"
	RunFailed    = "FAILED"
	RunCancelled = "CANCELLED"
)

// Triggers a run may record.
const (
	TriggerManual = "manual" // runWorkflow
	TriggerEvent  = "event"  // POST /api/v1/workflows/runs, or an event matching a trigger pattern
)

// Workflow is a workflow definition.
type Workflow struct {
	ID          string    `db:"id"`
	OrgID       string    `db:"org_id"`
	ProjectID   string    `db:"project_id"`
	Name        string    `db:"name"`
	Description string    `db:"description"`
	Status      string    `db:"status"`
	Steps       []string  `db:"steps"`
	Triggers    []string  `db:"triggers"`
	CreatedAt   time.Time `db:"created_at"`
	UpdatedAt   time.Time `db:"updated_at"`
}

// Run is one run of a workflow.
type Run struct {
	ID          string          `db:"id"`
	OrgID       string          `db:"org_id"`
	ProjectID   string          `db:"project_id"`
	WorkflowID  string          `db:"workflow_id"`
	Status      string          `db:"status"`
	Trigger     string          `db:"trigger"`
	Input       json.RawMessage `db:"input"`
	Output      json.RawMessage `db:"output"`
	Error       *string         `db:"error"`
	DurationMs  *int32          `db:"duration_ms"`
	StartedAt   time.Time       `db:"started_at"`
	CompletedAt *time.Time      `db:"completed_at"`
	// Redacted is true when the run was served without its input and output (phi.WorkflowRun)
	// to a caller that may not see the patient data they carry.
	Redacted bool `db:"-"`
}

// Command is the message on carehub.workflow-runs.v1 that asks the runner to execute a run
// (schemas/kafka/workflow-runs.v1.json).
type Command struct {
	RunID      string `json:"runId"`
	WorkflowID string `json:"workflowId"`
	OrgID      string `json:"orgId"`
	ProjectID  string `json:"projectId"`
	Attempt    int    `json:"attempt"`
}

// Service manages workflows and queues their runs. It is safe for concurrent use.
type Service struct {
	pool        *pgxpool.Pool
	guard       *phi.Guard
	eventsTopic string
	runsTopic   string
}

// Topics are the events topic and the workflow-runs topic the service writes to.
func (s *Service) Topics() (events, runs string) { return s.eventsTopic, s.runsTopic }

// Config configures a Service. Zero fields take their defaults.
type Config struct {
	// EventsTopic is the events topic. Default kafka.DefaultTopics().Events.
	EventsTopic string
	// RunsTopic is the workflow-runs topic. Default kafka.DefaultTopics().WorkflowRuns.
	RunsTopic string
}

func (c *Config) defaults() {
	t := kafka.DefaultTopics()
	config.Default(&c.EventsTopic, t.Events)
	config.Default(&c.RunsTopic, t.WorkflowRuns)
}

// New returns the service on pool.
func New(pool *pgxpool.Pool, cfg Config) *Service {
	cfg.defaults()
	return &Service{pool: pool, guard: phi.NewGuard(postgres.SyntheticPatients{Pool: pool}), eventsTopic: cfg.EventsTopic, runsTopic: cfg.RunsTopic}
}

const workflowColumns = `id, org_id, project_id, name, description, status, steps, triggers, created_at, updated_at`

// NewWorkflow describes a workflow to create.
type NewWorkflow struct {
	Name, ProjectID, Description string
	Steps                        []string // names from the step catalogue (Steps), in run order
	Triggers                     []string // event type patterns
}

// MaxSteps bounds the length of a workflow.
const MaxSteps = 50

// Create creates an ACTIVE workflow in one of the caller's projects. Every step must be in the
// catalogue (a run_agent:<id> step must name an agent of the same project) and every trigger a
// valid event pattern. The workflow keeps the caller's mode: its runs never reach further than
// the credential that wrote its steps (runMode). Requires exec:workflows.
func (s *Service) Create(ctx context.Context, in NewWorkflow) (*Workflow, error) {
	p, err := access.Require(ctx, access.ExecWorkflows)
	if err != nil {
		return nil, err
	}
	bad := scoped.NamedFields(&in.Name, in.Description)
	var agentIDs []string
	switch {
	case len(in.Steps) == 0:
		bad["steps"] = "at least one step is required; valid steps: " + StepNames()
	case len(in.Steps) > MaxSteps:
		bad["steps"] = fmt.Sprintf("at most %d steps", MaxSteps)
	default:
		var problem string
		if agentIDs, problem = checkSteps(in.Steps); problem != "" {
			bad["steps"] = problem
		}
	}
	for _, t := range in.Triggers {
		if !events.ValidPattern(t) {
			bad["triggers"] = fmt.Sprintf("%q is not an event pattern (an exact type such as device.observation_received, prefix.* or *)", t)
			break
		}
	}
	if len(bad) > 0 {
		return nil, fault.Validation("invalid workflow", bad)
	}
	triggers := in.Triggers
	if triggers == nil {
		triggers = []string{}
	}
	var out *Workflow
	err = idempotency.Tx(ctx, s.pool, &out, func(tx pgx.Tx) error {
		orgID, err := scoped.ProjectOrg(ctx, tx, p, in.ProjectID)
		if err != nil {
			return err
		}
		if len(agentIDs) > 0 {
			var found []string
			rows, _ := tx.Query(ctx, `select id from agents where id = any($1) and project_id = $2`, agentIDs, in.ProjectID)
			if found, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
				return fmt.Errorf("step agents: %w", err)
			}
			for _, id := range agentIDs {
				if !contains(found, id) {
					return fault.Validation("invalid workflow", map[string]string{
						"steps": fmt.Sprintf("run_agent:%s: no such agent in project %s", id, in.ProjectID)})
				}
			}
		}
		rows, _ := tx.Query(ctx, `insert into workflows (id, org_id, project_id, name, description, status, steps, triggers, mode)
values ($1, $2, $3, $4, $5, 'ACTIVE', $6, $7, $8) returning `+workflowColumns,
			ids.New(ids.Workflow), orgID, in.ProjectID, in.Name, in.Description, in.Steps, triggers, modeOf(p))
		out, err = pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Workflow])
		return err
	})
	if err != nil {
		return nil, fault.Context(err, "create workflow")
	}
	return out, nil
}

// transitions lists, per target status, the statuses a workflow may move from. Moving to the
// status it already has is allowed and changes nothing.
var transitions = map[string][]string{
	StatusPaused:   {StatusActive},
	StatusActive:   {StatusPaused},
	StatusArchived: {StatusActive, StatusPaused},
}

// SetStatus pauses (PAUSED), resumes (ACTIVE) or archives (ARCHIVED) a workflow. Requires
// exec:workflows.
func (s *Service) SetStatus(ctx context.Context, id, to string) (*Workflow, error) {
	p, err := access.Require(ctx, access.ExecWorkflows)
	if err != nil {
		return nil, err
	}
	from, ok := transitions[to]
	if !ok {
		return nil, fault.Invalid("unknown workflow status %q", to)
	}
	var out *Workflow
	err = idempotency.Tx(ctx, s.pool, &out, func(tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, `select `+workflowColumns+` from workflows where id = $1 and ($2 = '' or org_id = $2) for update`, id, p.OrgFilter())
		w, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Workflow])
		if errors.Is(err, pgx.ErrNoRows) {
			return fault.NotFound("workflow", id)
		}
		if err != nil {
			return fmt.Errorf("workflow %s: %w", id, err)
		}
		if w.Status == to {
			out = w
			return nil
		}
		if !contains(from, w.Status) {
			return fault.Conflict("workflow %s is %s and cannot become %s", id, w.Status, to)
		}
		rows, _ = tx.Query(ctx, `update workflows set status = $2, updated_at = now() where id = $1 returning `+workflowColumns, id, to)
		out, err = pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Workflow])
		return err
	})
	if err != nil {
		return nil, fault.Context(err, "set workflow status")
	}
	return out, nil
}

// Workflow returns one workflow of the caller's organization.
func (s *Service) Workflow(ctx context.Context, id string) (*Workflow, error) {
	return scoped.One[Workflow](ctx, s.pool, "workflow", workflowColumns, "workflows", id)
}

// Workflows returns up to limit workflows of a project, oldest first, optionally in one status.
// A project the caller cannot see is NotFound.
func (s *Service) Workflows(ctx context.Context, projectID, status string, limit int) ([]Workflow, error) {
	return scoped.InProject[Workflow](ctx, s.pool, workflowColumns, "workflows", projectID,
		`and ($3 = '' or status = $3) order by created_at, id limit $4`, status, limit)
}

// ByProject returns the workflows of each project among projectIDs, oldest first (a batched
// loader).
func (s *Service) ByProject(ctx context.Context, projectIDs []string) (map[string][]Workflow, error) {
	return scoped.Grouped(ctx, s.pool, workflowColumns, "workflows", "project_id", "project", projectIDs, "created_at, id",
		func(w *Workflow) string { return w.ProjectID })
}

// ByID returns the caller's workflows among ids (a batched loader).
func (s *Service) ByID(ctx context.Context, ids []string) (map[string]*Workflow, error) {
	return scoped.ByID(ctx, s.pool, workflowColumns, "workflows", ids, func(v *Workflow) string { return v.ID })
}

// modeOf is the mode p acts in: live only for a credential that sees real patients.
func modeOf(p *access.Principal) string {
	if p.SeesRealPatients() {
		return access.Live
	}
	return access.Test
}

// runMode is the mode of a run of a workflow of workflowMode started in startMode (the caller's,
// or for a triggered run the mode of the event's publisher): live only when both are, so a test
// credential reaches real patients neither by starting a live workflow nor by writing one.
func runMode(workflowMode, startMode string) string {
	if workflowMode == access.Live && startMode == access.Live {
		return access.Live
	}
	return access.Test
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
