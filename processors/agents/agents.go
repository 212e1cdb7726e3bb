// Package agents serves clinical agents and their sessions. An agent runs one built-in clinical
// skill (kernel/clinical: NEWS2, qSOFA, vitals trend) over a patient's stored observations;
// each run is a session with its input, output, latency and token usage.
//
// # Run modes (DECISIONS §6)
//
// "sync" (the default) runs the skill inside the runAgent call and returns the finished session:
// COMPLETED with its output, or FAILED with the reason (the vital signs the patient has no
// observation of, an unusable value). The session is written once, finished, with its events.
//
// "async" records the session QUEUED and returns it. Postgres is the queue: a Worker (run by the
// processors role of any node) claims QUEUED sessions with FOR UPDATE SKIP LOCKED, moves each to
// RUNNING under a lease, runs the skill and writes the end state. A worker that dies leaves its
// session RUNNING with a lease that runs out; the next claim pass of any worker (at start and
// every poll) takes it again, and after MaxAttempts claims fails it cleanly instead. So no
// session stays QUEUED or RUNNING for longer than a lease plus a poll while a processors node is
// up. runAgent wakes the workers with NOTIFY carehub_agent_sessions; they also poll.
//
// # What a run reads and writes
//
// A run reads the patient's latest stored observation for each LOINC code its skill needs (the
// vitals trend reads every observation of its codes in its window), runs the skill, and stores the
// input, the output (score, band, components, recommendations, the ids of the observations used),
// latencyMs (from the start of the observation read to the end of the skill) and tokensUsed.
// A patient without the needed vitals gives a FAILED session naming them; a score is never
// computed from assumed values.
//
// tokensUsed is clinical.Tokens (a documented, deterministic BPE-like count: letters 4 per token,
// digits 3, punctuation 2, CJK 1) over the JSON context the agent processed (patient id, skill,
// options and the observations read) plus the JSON output it produced.
//
// A score that qualifies (Qualifies: NEWS2 ≥ 5 or a single red parameter, qSOFA positive) also
// produces a report: a FHIR R4 RiskAssessment kept in the reports table (report.go), whose id the
// session output carries as reportId, announced by diagnostic.result_ready.
//
// # Events
//
// Every state change is written with its events in one transaction (the outbox):
// agent.session.updated for each (QUEUED, RUNNING, COMPLETED, FAILED; a sync session has one,
// its end state), agent.run_completed or agent.run.failed when the session ends, and
// diagnostic.result_ready with a report.
package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
	"carehub/kernel/clinical"
	"carehub/kernel/config"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/kernel/phi"
	"carehub/processors/internal/scoped"
	"carehub/storage/idempotency"
	"carehub/storage/kafka"
	"carehub/storage/postgres"
)

// Run modes.
const (
	ModeSync  = "sync"
	ModeAsync = "async"
)

// Session statuses (RunStatus).
const (
	StatusQueued    = "QUEUED"
	StatusRunning   = "RUNNING"
	StatusCompleted = "COMPLETED"
	StatusFailed    = "FAILED"
	StatusCancelled = "CANCELLED"
)

// Agent is a clinical agent of a project.
type Agent struct {
	ID             string    `db:"id"`
	OrgID          string    `db:"org_id"`
	ProjectID      string    `db:"project_id"`
	Name           string    `db:"name"`
	Description    string    `db:"description"`
	RunMode        string    `db:"run_mode"`
	Status         string    `db:"status"`
	Skill          string    `db:"skill"`
	InstallationID *string   `db:"installation_id"`
	CreatedAt      time.Time `db:"created_at"`
	// DeploymentID is an LLM agent's deployment (Skill SkillLLM): an OpenAI-compatible chat
	// backend. Instructions are what the agent is told to do, before the patient's context.
	DeploymentID *string `db:"deployment_id"`
	Instructions string  `db:"instructions"`
}

// Session is one run of an agent against a patient.
type Session struct {
	ID          string          `db:"id"`
	OrgID       string          `db:"org_id"`
	ProjectID   string          `db:"project_id"`
	AgentID     string          `db:"agent_id"`
	PatientID   string          `db:"patient_id"`
	Status      string          `db:"status"`
	Input       json.RawMessage `db:"input"`
	Output      json.RawMessage `db:"output"`
	Error       *string         `db:"error"`
	LatencyMs   *int32          `db:"latency_ms"`
	TokensUsed  *int32          `db:"tokens_used"`
	StartedAt   time.Time       `db:"started_at"`
	CompletedAt *time.Time      `db:"completed_at"`
	// Redacted is true when the session was served without its patient data (phi.AgentSession:
	// patientId, input, output and error removed) to a caller that may not see it.
	Redacted bool `db:"-"`
}

// NotifyChannel is the Postgres channel runAgent notifies when it queues an async session; the
// workers listen on it.
const NotifyChannel = "carehub_agent_sessions"

// DefaultMaxQueued bounds the QUEUED async sessions of one organization; runAgent refuses more
// with RATE_LIMITED until the workers catch up.
const DefaultMaxQueued = 1000

// Service manages agents and runs their sessions. It is safe for concurrent use and starts no
// goroutines: async sessions are run by Workers (worker.go).
type Service struct {
	pool        *pgxpool.Pool
	guard       *phi.Guard
	eventsTopic string
	logger      *slog.Logger
	maxQueued   int
	wakeCh      chan struct{} // runAgent → this node's idle Workers
	chat        Chatter
	closeOnce   sync.Once
}

// Config configures a Service. Zero fields take their defaults.
type Config struct {
	// EventsTopic is the topic events are written to. Default kafka.DefaultTopics().Events.
	EventsTopic string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// MaxQueued bounds the QUEUED async sessions per organization. Default DefaultMaxQueued.
	MaxQueued int
	// Chat serves LLM agents (deployments.Invoker); without it their runs fail.
	Chat Chatter
}

func (c *Config) defaults() {
	config.Default(&c.EventsTopic, kafka.DefaultTopics().Events)
	config.Default(&c.MaxQueued, DefaultMaxQueued)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// New returns the service on pool.
func New(pool *pgxpool.Pool, cfg Config) *Service {
	cfg.defaults()
	return &Service{pool: pool, guard: phi.NewGuard(postgres.SyntheticPatients{Pool: pool}), eventsTopic: cfg.EventsTopic, logger: cfg.Logger,
		maxQueued: cfg.MaxQueued, wakeCh: make(chan struct{}, 1), chat: cfg.Chat}
}

// Close is kept for the composition root; the service owns no goroutines (Workers are run and
// stopped by their own Run). It is idempotent.
func (s *Service) Close() error {
	s.closeOnce.Do(func() {})
	return nil
}

const agentColumns = `id, org_id, project_id, name, description, run_mode, status, skill, installation_id, created_at,
deployment_id, instructions`

// NewAgent describes an agent to create.
type NewAgent struct {
	Name, ProjectID, RunMode, Description string
	AssetID                               string // optional: an installed AGENT asset whose runtime is the skill
	Skill                                 string // optional: a built-in skill name, or SkillLLM; default news2
	// DeploymentID makes an LLM agent: a deployment of the project whose backend speaks
	// OpenAI-compatible chat. Instructions are its task (optional, at most MaxInstructions).
	DeploymentID, Instructions string
}

// Create creates an agent in one of the caller's projects. Requires exec:agents.
func (s *Service) Create(ctx context.Context, in NewAgent) (*Agent, error) {
	p, err := access.Require(ctx, access.ExecAgents)
	if err != nil {
		return nil, err
	}
	bad := scoped.NamedFields(&in.Name, in.Description)
	if in.RunMode == "" {
		in.RunMode = ModeSync
	}
	if in.RunMode != ModeSync && in.RunMode != ModeAsync {
		bad["runMode"] = "must be sync or async"
	}
	if in.Skill != "" && in.Skill != SkillLLM {
		if _, ok := clinical.Lookup(in.Skill); !ok {
			bad["skill"] = fmt.Sprintf("unknown skill %q; valid: %s, %s", in.Skill, strings.Join(clinical.Names(), ", "), SkillLLM)
		}
	}
	switch {
	case in.Skill == SkillLLM && in.DeploymentID == "":
		bad["deploymentId"] = "an llm agent needs the deployment of an OpenAI-compatible chat backend"
	case in.DeploymentID != "" && in.Skill != "" && in.Skill != SkillLLM:
		bad["skill"] = "an agent with a deploymentId is an llm agent: omit skill or pass llm"
	case in.DeploymentID != "" && in.AssetID != "":
		bad["assetId"] = "give assetId (a built-in skill) or deploymentId (an llm agent), not both"
	case in.Instructions != "" && in.DeploymentID == "":
		bad["instructions"] = "only an llm agent (with a deploymentId) takes instructions"
	}
	if len(in.Instructions) > MaxInstructions {
		bad["instructions"] = fmt.Sprintf("at most %d bytes", MaxInstructions)
	}
	if len(bad) > 0 {
		return nil, fault.Validation("invalid agent", bad)
	}
	var out *Agent
	err = idempotency.Tx(ctx, s.pool, &out, func(tx pgx.Tx) error {
		orgID, err := scoped.ProjectOrg(ctx, tx, p, in.ProjectID)
		if err != nil {
			return err
		}
		skill := in.Skill
		var installationID *string
		if in.AssetID != "" {
			var insID, typ string
			var runtime *string
			err := tx.QueryRow(ctx, `select i.id, a.type, a.runtime from installations i join assets a on a.id = i.asset_id
where i.project_id = $1 and i.asset_id = $2 order by i.installed_at desc, i.id desc limit 1`, in.ProjectID, in.AssetID).Scan(&insID, &typ, &runtime)
			if errors.Is(err, pgx.ErrNoRows) {
				return fault.Validation("invalid agent", map[string]string{
					"assetId": fmt.Sprintf("asset %s is not installed in project %s", in.AssetID, in.ProjectID)})
			}
			if err != nil {
				return fmt.Errorf("installation of %s: %w", in.AssetID, err)
			}
			if typ != "AGENT" {
				return fault.Validation("invalid agent", map[string]string{"assetId": fmt.Sprintf("asset %s is a %s, not an AGENT", in.AssetID, typ)})
			}
			if runtime == nil {
				return fault.Validation("invalid agent", map[string]string{"assetId": fmt.Sprintf("asset %s has no built-in runtime", in.AssetID)})
			}
			if skill != "" && skill != *runtime {
				return fault.Validation("invalid agent", map[string]string{
					"skill": fmt.Sprintf("asset %s runs %s; omit skill or pass %s", in.AssetID, *runtime, *runtime)})
			}
			skill, installationID = *runtime, &insID
		}
		var deploymentID *string
		if in.DeploymentID != "" {
			if err := chatDeployment(ctx, tx, in.ProjectID, in.DeploymentID); err != nil {
				return err
			}
			skill, deploymentID = SkillLLM, &in.DeploymentID
		}
		if skill == "" {
			skill = clinical.SkillNEWS2
		}
		rows, _ := tx.Query(ctx, `insert into agents (id, org_id, project_id, name, description, run_mode, status, skill, installation_id,
deployment_id, instructions) values ($1, $2, $3, $4, $5, $6, 'active', $7, $8, $9, $10) returning `+agentColumns,
			ids.New(ids.Agent), orgID, in.ProjectID, in.Name, in.Description, in.RunMode, skill, installationID, deploymentID, in.Instructions)
		out, err = pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Agent])
		return err
	})
	if err != nil {
		return nil, fault.Context(err, "create agent")
	}
	return out, nil
}

// chatDeployment checks that deploymentID is a deployment of projectID with an OpenAI-compatible
// chat backend.
func chatDeployment(ctx context.Context, tx pgx.Tx, projectID, deploymentID string) error {
	var protocol *string
	err := tx.QueryRow(ctx, `select backend->>'protocol' from deployments where id = $1 and project_id = $2`, deploymentID, projectID).Scan(&protocol)
	if errors.Is(err, pgx.ErrNoRows) {
		return fault.Validation("invalid agent", map[string]string{"deploymentId": fmt.Sprintf("deployment %s is not in project %s", deploymentID, projectID)})
	}
	if err != nil {
		return fmt.Errorf("deployment %s: %w", deploymentID, err)
	}
	if protocol == nil || *protocol != ProtocolChat {
		return fault.Validation("invalid agent", map[string]string{
			"deploymentId": fmt.Sprintf("deployment %s has no %s backend (an OpenAI-compatible chat server)", deploymentID, ProtocolChat)})
	}
	return nil
}

// ProtocolChat is the backend protocol of an LLM agent's deployment: OpenAI-compatible chat
// completions (deployments.ProtocolChat, the same name).
const ProtocolChat = "openai-chat"

// Agent returns one agent of the caller's organization.
func (s *Service) Agent(ctx context.Context, id string) (*Agent, error) {
	return scoped.One[Agent](ctx, s.pool, "agent", agentColumns, "agents", id)
}

// Agents returns up to limit agents of a project, oldest first. A project the caller cannot see is
// NotFound.
func (s *Service) Agents(ctx context.Context, projectID string, limit int) ([]Agent, error) {
	return scoped.InProject[Agent](ctx, s.pool, agentColumns, "agents", projectID, `order by created_at, id limit $3`, limit)
}

// AgentsByID returns the caller's agents among ids (a batched loader).
func (s *Service) AgentsByID(ctx context.Context, ids []string) (map[string]*Agent, error) {
	return scoped.ByID(ctx, s.pool, agentColumns, "agents", ids, func(v *Agent) string { return v.ID })
}

const sessionColumns = `id, org_id, project_id, agent_id, patient_id, status, input, output, error, latency_ms, tokens_used,
started_at, completed_at`

// Session returns one session of the caller's organization.
func (s *Service) Session(ctx context.Context, id string) (*Session, error) {
	ses, err := scoped.One[Session](ctx, s.pool, "agent session", sessionColumns, "agent_sessions", id)
	if err != nil {
		return nil, err
	}
	access.Touch(ctx, access.KindSession, ses.ID)
	return s.served(ctx, ses)
}

// SessionsByAgent returns the sessions of each agent among agentIDs, newest first, at most limit
// per agent (a batched loader).
func (s *Service) SessionsByAgent(ctx context.Context, agentIDs []string, limit int) (map[string][]Session, error) {
	list, err := scoped.LatestPer[Session](ctx, s.pool, sessionColumns, "agent_sessions", "agent_id", "agents", "sessions by agent",
		agentIDs, "c.started_at desc, c.id desc", limit)
	if err != nil {
		return nil, err
	}
	served := make([]*Session, len(list))
	for i := range list {
		served[i] = &list[i]
		access.Touch(ctx, access.KindSession, list[i].ID)
	}
	if err := s.serve(ctx, served...); err != nil {
		return nil, err
	}
	return scoped.Group(list, func(ses *Session) string { return ses.AgentID }), nil
}

// served is serve for one session.
func (s *Service) served(ctx context.Context, ses *Session) (*Session, error) {
	if err := s.serve(ctx, ses); err != nil {
		return nil, err
	}
	return ses, nil
}

// serve readies sessions for the caller in ctx: a session whose patient data the caller may not
// see (phi.AgentSession) loses it and is marked Redacted; the patients of the others are touched
// for the audit record.
func (s *Service) serve(ctx context.Context, ss ...*Session) error {
	subjects := make([]phi.Subject, len(ss))
	for i, ses := range ss {
		subjects[i] = phi.Subject{OrgID: ses.OrgID, Patients: []string{ses.PatientID}, Need: phi.AgentSession.Need}
	}
	ok, err := s.guard.Serve(ctx, subjects)
	if err != nil {
		return fmt.Errorf("agent sessions: %w", err)
	}
	for i, ses := range ss {
		if !ok[i] {
			ses.PatientID, ses.Input, ses.Output, ses.Error, ses.Redacted = "", nil, nil, nil, true
		}
	}
	return nil
}
