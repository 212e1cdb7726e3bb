// Package agents serves clinical agents and their sessions. An agent runs one built-in clinical
// skill (processors/clinical: NEWS2, qSOFA, vitals trend) over a patient's stored observations;
// each run is a session with its input, output, latency and token usage.
//
// Run modes (DECISIONS §6): "sync" runs the skill inside the runAgent call and returns the
// finished session (COMPLETED, or FAILED with a reason); "async" records the session QUEUED and
// runs it on the service's bounded worker pool (run.go), QUEUED → RUNNING → COMPLETED | FAILED,
// each change announced by an agent.session.updated event. Every session change is written with
// its events in one transaction.
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

	"carehub/processors/access"
	"carehub/processors/clinical"
	"carehub/processors/fault"
	"carehub/storage/ids"
	"carehub/storage/kafka"
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
}

// Service manages agents and runs their sessions. Close stops its worker pool.
type Service struct {
	pool        *pgxpool.Pool
	eventsTopic string
	logger      *slog.Logger
	workers     int
	queueSize   int

	// The async worker pool: slots bounds queued plus running jobs, so an accepted async run
	// always finds room in jobs.
	jobs   chan job
	slots  chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
	mu     sync.RWMutex
	closed bool
}

// Option configures a Service.
type Option func(*Service)

// WithEventsTopic names the topic events are written to (default carehub.events.v1).
func WithEventsTopic(topic string) Option { return func(s *Service) { s.eventsTopic = topic } }

// WithLogger sets the logger of the worker pool.
func WithLogger(l *slog.Logger) Option { return func(s *Service) { s.logger = l } }

// WithWorkers sets the number of async workers (default 2) and the queue bound (default 256).
func WithWorkers(workers, queue int) Option {
	return func(s *Service) { s.workers, s.queueSize = max(1, workers), max(1, queue) }
}

// New returns the service on pool and starts its async workers.
func New(pool *pgxpool.Pool, opts ...Option) *Service {
	s := &Service{pool: pool, eventsTopic: kafka.DefaultTopics().Events, logger: slog.Default(), workers: 2, queueSize: 256}
	for _, o := range opts {
		o(s)
	}
	s.jobs = make(chan job, s.queueSize)
	s.slots = make(chan struct{}, s.queueSize)
	s.stop = make(chan struct{})
	for range s.workers {
		s.wg.Add(1)
		go s.work()
	}
	return s
}

// Close stops accepting async runs, lets the running ones finish and waits for the workers.
// Sessions still QUEUED stay QUEUED. It is idempotent.
func (s *Service) Close() error {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.stop)
		s.wg.Wait()
	})
	return nil
}

const agentColumns = `id, org_id, project_id, name, description, run_mode, status, skill, installation_id, created_at`

// NewAgent describes an agent to create.
type NewAgent struct {
	Name, ProjectID, RunMode, Description string
	AssetID                               string // optional: an installed AGENT asset whose runtime is the skill
	Skill                                 string // optional: a built-in skill name; default news2
}

// Create creates an agent in one of the caller's projects. Requires exec:agents.
func (s *Service) Create(ctx context.Context, in NewAgent) (*Agent, error) {
	p, err := access.Require(ctx, access.ExecAgents)
	if err != nil {
		return nil, err
	}
	in.Name = strings.TrimSpace(in.Name)
	bad := map[string]string{}
	if in.Name == "" || len(in.Name) > 200 {
		bad["name"] = "must be 1 to 200 characters"
	}
	if in.RunMode == "" {
		in.RunMode = ModeSync
	}
	if in.RunMode != ModeSync && in.RunMode != ModeAsync {
		bad["runMode"] = "must be sync or async"
	}
	if len(in.Description) > 2000 {
		bad["description"] = "must be at most 2000 characters"
	}
	if in.Skill != "" {
		if _, ok := clinical.Lookup(in.Skill); !ok {
			bad["skill"] = fmt.Sprintf("unknown skill %q; valid: %s", in.Skill, strings.Join(clinical.Names(), ", "))
		}
	}
	if len(bad) > 0 {
		return nil, fault.Validation("invalid agent", bad)
	}
	var out *Agent
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var orgID string
		err := tx.QueryRow(ctx, `select org_id from projects where id = $1 and ($2 = '' or org_id = $2)`, in.ProjectID, p.OrgFilter()).Scan(&orgID)
		if errors.Is(err, pgx.ErrNoRows) {
			return fault.NotFound("project", in.ProjectID)
		}
		if err != nil {
			return fmt.Errorf("project %s: %w", in.ProjectID, err)
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
		if skill == "" {
			skill = clinical.SkillNEWS2
		}
		rows, _ := tx.Query(ctx, `insert into agents (id, org_id, project_id, name, description, run_mode, status, skill, installation_id)
values ($1, $2, $3, $4, $5, $6, 'active', $7, $8) returning `+agentColumns,
			ids.New(ids.Agent), orgID, in.ProjectID, in.Name, in.Description, in.RunMode, skill, installationID)
		out, err = pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Agent])
		return err
	})
	if err != nil {
		return nil, classify(err, "create agent")
	}
	return out, nil
}

// Agent returns one agent of the caller's organization.
func (s *Service) Agent(ctx context.Context, id string) (*Agent, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+agentColumns+` from agents where id = $1 and ($2 = '' or org_id = $2)`, id, p.OrgFilter())
	a, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Agent])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("agent", id)
	}
	if err != nil {
		return nil, fmt.Errorf("agent %s: %w", id, err)
	}
	return a, nil
}

// Agents returns up to limit agents of a project, oldest first. A project the caller cannot see is
// NotFound.
func (s *Service) Agents(ctx context.Context, projectID string, limit int) ([]Agent, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	var exists bool
	var out []Agent
	batch := &pgx.Batch{}
	batch.Queue(`select exists(select 1 from projects where id = $1 and ($2 = '' or org_id = $2))`, projectID, p.OrgFilter()).
		QueryRow(func(row pgx.Row) error { return row.Scan(&exists) })
	batch.Queue(`select `+agentColumns+` from agents where project_id = $1 and ($2 = '' or org_id = $2)
order by created_at, id limit $3`, projectID, p.OrgFilter(), limit).Query(func(rows pgx.Rows) error {
		var err error
		out, err = pgx.CollectRows(rows, pgx.RowToStructByName[Agent])
		return err
	})
	if err := s.pool.SendBatch(ctx, batch).Close(); err != nil {
		return nil, fmt.Errorf("agents of %s: %w", projectID, err)
	}
	if !exists {
		return nil, fault.NotFound("project", projectID)
	}
	return out, nil
}

// AgentsByID returns the caller's agents among ids (a batched loader).
func (s *Service) AgentsByID(ctx context.Context, ids []string) (map[string]*Agent, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+agentColumns+` from agents where id = any($1) and ($2 = '' or org_id = $2)`, ids, p.OrgFilter())
	list, err := pgx.CollectRows(rows, pgx.RowToAddrOfStructByName[Agent])
	if err != nil {
		return nil, fmt.Errorf("agents by id: %w", err)
	}
	out := make(map[string]*Agent, len(list))
	for _, a := range list {
		out[a.ID] = a
	}
	return out, nil
}

const sessionColumns = `id, org_id, project_id, agent_id, patient_id, status, input, output, error, latency_ms, tokens_used,
started_at, completed_at`

// Session returns one session of the caller's organization.
func (s *Service) Session(ctx context.Context, id string) (*Session, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+sessionColumns+` from agent_sessions where id = $1 and ($2 = '' or org_id = $2)`, id, p.OrgFilter())
	ses, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Session])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("agent session", id)
	}
	if err != nil {
		return nil, fmt.Errorf("agent session %s: %w", id, err)
	}
	return ses, nil
}

// SessionsByAgent returns the sessions of each agent among agentIDs, newest first, at most limit
// per agent (a batched loader).
func (s *Service) SessionsByAgent(ctx context.Context, agentIDs []string, limit int) (map[string][]Session, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select s.* from agents a cross join lateral (
	select `+sessionColumns+` from agent_sessions s where s.agent_id = a.id order by s.started_at desc, s.id desc limit $3
) s where a.id = any($1) and ($2 = '' or a.org_id = $2)`, agentIDs, p.OrgFilter(), limit)
	list, err := pgx.CollectRows(rows, pgx.RowToStructByName[Session])
	if err != nil {
		return nil, fmt.Errorf("sessions by agent: %w", err)
	}
	out := make(map[string][]Session, len(agentIDs))
	for _, ses := range list {
		out[ses.AgentID] = append(out[ses.AgentID], ses)
	}
	return out, nil
}

func classify(err error, what string) error {
	if fault.As(err) != nil {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}
