package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/access"
	"carehub/kernel/clinical"
	"carehub/kernel/events"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/storage/idempotency"
	"carehub/storage/outbox"
)

// Run runs agent agentID against patient patientID with input (a JSON object of skill options
// such as {"spo2Scale": 2}, or nil). In sync mode the returned session is finished: COMPLETED with
// its output, or FAILED with the reason (for example the vital signs the patient has no
// observation of). In async mode it is QUEUED and a Worker runs it; more than the configured
// number of QUEUED sessions in the organization is RATE_LIMITED.
//
// The patient must belong to the agent's organization and be visible to the caller: an unknown
// patient, another tenant's, or a real (not synthetic) patient asked about with a test key is
// NOT_FOUND. Requires exec:agents.
func (s *Service) Run(ctx context.Context, agentID, patientID string, input json.RawMessage) (*Session, error) {
	p, err := access.Require(ctx, access.ExecAgents)
	if err != nil {
		return nil, err
	}
	a, err := s.Agent(ctx, agentID)
	if err != nil {
		return nil, err
	}
	if err := s.checkPatient(ctx, s.pool, a.OrgID, patientID, p.SeesRealPatients()); err != nil {
		return nil, err
	}
	access.Touch(ctx, access.KindPatient, patientID)
	input, pl, err := planRun(a, input)
	if err != nil {
		return nil, err
	}
	ses := &Session{ID: ids.New(ids.Session), OrgID: a.OrgID, ProjectID: a.ProjectID, AgentID: a.ID, PatientID: patientID,
		Input: input, StartedAt: events.Now()}
	access.Touch(ctx, access.KindSession, ses.ID)

	if a.RunMode != ModeAsync {
		as, err := s.assess(ctx, s.pool, a, patientID, pl)
		if err != nil {
			return nil, fault.Context(err, "run agent "+a.ID)
		}
		rep, err := finish(ses, as)
		if err != nil {
			return nil, fmt.Errorf("run agent %s: %w", a.ID, err)
		}
		err = idempotency.Tx(ctx, s.pool, &ses, func(tx pgx.Tx) error {
			if err := insertSession(ctx, tx, ses, ""); err != nil {
				return err
			}
			return s.writeEnd(ctx, tx, ses, rep)
		})
		if err != nil {
			return nil, fmt.Errorf("run agent %s: save session: %w", a.ID, err)
		}
		return s.served(ctx, ses)
	}

	ses.Status = StatusQueued
	err = idempotency.Tx(ctx, s.pool, &ses, func(tx pgx.Tx) error {
		// The bound is checked inside the transaction that queues, under a per-organization
		// advisory lock, so concurrent runAgent calls cannot overshoot it together.
		if _, err := tx.Exec(ctx, `select pg_advisory_xact_lock(hashtextextended('agent_queue:' || $1, 0))`, a.OrgID); err != nil {
			return fmt.Errorf("lock queue: %w", err)
		}
		var queued int
		if err := tx.QueryRow(ctx, `select count(*) from agent_sessions where status = 'QUEUED' and org_id = $1`, a.OrgID).Scan(&queued); err != nil {
			return fmt.Errorf("count queued sessions: %w", err)
		}
		if queued >= s.maxQueued {
			return fault.New(fault.KindRateLimited, "%d agent sessions are already queued for this organization; retry shortly", queued)
		}
		if err := insertSession(ctx, tx, ses, ""); err != nil {
			return err
		}
		evs, err := sessionEvents(ses, nil)
		if err != nil {
			return err
		}
		if err := outbox.AppendEvents(ctx, tx, s.eventsTopic, evs...); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `select pg_notify($1, '')`, NotifyChannel)
		return err
	})
	if err != nil {
		return nil, fault.Context(err, "run agent "+a.ID)
	}
	s.wakeWorkers()
	return s.served(ctx, ses)
}

// ExecRequest asks Execute for one agent run on behalf of an already authorized caller.
type ExecRequest struct {
	AgentID   string
	ProjectID string // the agent must belong to this project
	PatientID string // must belong to the agent's organization; the caller checked its visibility
	RunID     string // the workflow run the session belongs to, recorded on it
	Input     json.RawMessage
}

// Execute runs an agent inside tx, whatever its run mode, for a caller that has authorized the
// run itself (a workflow's run_agent step): it reads the observations through tx and writes the
// finished session, its report and its events in tx, so they commit or roll back with the
// caller's own change. The returned session is COMPLETED or FAILED; the report is nil unless the
// score qualified. An agent outside ProjectID, or an unknown patient, is NotFound.
func (s *Service) Execute(ctx context.Context, tx pgx.Tx, req ExecRequest) (*Session, *Report, error) {
	rows, _ := tx.Query(ctx, `select `+agentColumns+` from agents where id = $1 and project_id = $2`, req.AgentID, req.ProjectID)
	a, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Agent])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, fault.NotFound("agent", req.AgentID)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("agent %s: %w", req.AgentID, err)
	}
	if err := s.checkPatient(ctx, tx, a.OrgID, req.PatientID, true); err != nil {
		return nil, nil, err
	}
	input, pl, err := planRun(a, req.Input)
	if err != nil {
		return nil, nil, err
	}
	ses := &Session{ID: ids.New(ids.Session), OrgID: a.OrgID, ProjectID: a.ProjectID, AgentID: a.ID, PatientID: req.PatientID,
		Input: input, StartedAt: events.Now()}
	as, err := s.assess(ctx, tx, a, req.PatientID, pl)
	if err != nil {
		return nil, nil, err
	}
	rep, err := finish(ses, as)
	if err != nil {
		return nil, nil, err
	}
	if err := insertSession(ctx, tx, ses, req.RunID); err != nil {
		return nil, nil, err
	}
	if rep != nil {
		rep.RunID = nilIfEmpty(req.RunID)
	}
	if err := s.writeEnd(ctx, tx, ses, rep); err != nil {
		return nil, nil, err
	}
	return ses, rep, nil
}

// checkPatient reports NotFound unless patientID is a patient of orgID that the caller may see.
func (s *Service) checkPatient(ctx context.Context, q Querier, orgID, patientID string, seesReal bool) error {
	var found bool
	rows, _ := q.Query(ctx, `select exists(select 1 from patients where id = $1 and org_id = $2 and ($3 or synthetic))`,
		patientID, orgID, seesReal)
	found, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	if err != nil {
		return fmt.Errorf("patient %s: %w", patientID, err)
	}
	if !found {
		return fault.NotFound("patient", patientID)
	}
	return nil
}

// parseInput checks that input is a JSON object (or absent) and decodes the skill options it may
// carry; unknown fields are kept in the session input and ignored by the skill.
func parseInput(input json.RawMessage) (json.RawMessage, clinical.Options, error) {
	var opts clinical.Options
	trimmed := strings.TrimSpace(string(input))
	if trimmed == "" || trimmed == "null" {
		return nil, opts, nil
	}
	if !strings.HasPrefix(trimmed, "{") || !json.Valid(input) {
		return nil, opts, fault.Validation("invalid agent input", map[string]string{"input": "must be a JSON object"})
	}
	if err := json.Unmarshal(input, &opts); err != nil {
		return nil, opts, fault.Validation("invalid agent input", map[string]string{"input": err.Error()})
	}
	return input, opts, nil
}

// plan is what one run of an agent does: its skill with options, or an LLM call.
type plan struct {
	skill clinical.Skill
	opts  clinical.Options
	llm   *llmInput
}

// planRun checks input for agent a and returns it with the run's plan.
func planRun(a *Agent, input json.RawMessage) (json.RawMessage, plan, error) {
	if a.Skill == SkillLLM {
		input, in, err := parseLLMInput(input)
		return input, plan{llm: &in}, err
	}
	skill, ok := clinical.Lookup(a.Skill)
	if !ok {
		return nil, plan{}, fault.Conflict("agent %s runs unknown skill %q", a.ID, a.Skill)
	}
	input, opts, err := parseInput(input)
	return input, plan{skill: skill, opts: opts}, err
}

// assess runs plan pl of agent a for patientID, reading through q.
func (s *Service) assess(ctx context.Context, q Querier, a *Agent, patientID string, pl plan) (Assessment, error) {
	if pl.llm != nil {
		return s.assessLLM(ctx, q, a, patientID, *pl.llm)
	}
	return Assess(ctx, q, pl.skill, patientID, pl.opts)
}

// Querier is what reads need of a pool or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Assessment is the result of running a skill over a patient's stored observations.
type Assessment struct {
	Output  *clinical.Output // nil when the skill could not run
	Failure string           // why it could not, in terms a caller can act on; "" with an Output
	// Tokens is clinical.Tokens of the context JSON (patient id, skill, options, the
	// observations read) plus, with an Output, of the output JSON.
	Tokens  int
	Latency time.Duration // observation read plus skill
	llm     *llmOutput    // an LLM agent's answer (assessLLM), instead of Output
}

// Assess reads what skill needs of patientID's stored observations through q and runs it. A
// patient without the needed vital signs, or with unusable ones, is an Assessment with a Failure,
// not an error; errors are the database's.
func Assess(ctx context.Context, q Querier, skill clinical.Skill, patientID string, opts clinical.Options) (Assessment, error) {
	start := time.Now()
	obs, err := Observations(ctx, q, patientID, skill, opts)
	if err != nil {
		return Assessment{}, err
	}
	as := Assessment{}
	context, err := json.Marshal(struct {
		PatientID    string                 `json:"patientId"`
		Skill        string                 `json:"skill"`
		Options      clinical.Options       `json:"options"`
		Observations []clinical.Observation `json:"observations"`
	}{patientID, skill.Name(), opts, obs})
	if err != nil {
		return Assessment{}, err
	}
	as.Tokens = clinical.Tokens(string(context))
	out, runErr := skill.Run(clinical.NewInput(obs, opts))
	var ie *clinical.InputError
	switch {
	case errors.As(runErr, &ie):
		as.Failure = failureMessage(ie)
	case runErr != nil:
		return Assessment{}, runErr
	default:
		b, err := json.Marshal(out)
		if err != nil {
			return Assessment{}, err
		}
		as.Output = &out
		as.Tokens += clinical.Tokens(string(b))
	}
	as.Latency = time.Since(start)
	return as, nil
}

// failureMessage says what the skill lacked, in terms a caller can act on.
func failureMessage(ie *clinical.InputError) string {
	var parts []string
	if len(ie.Missing) > 0 {
		parts = append(parts, "the patient has no stored observation of "+strings.Join(ie.Missing, ", "))
	}
	for _, iv := range ie.Invalid {
		parts = append(parts, "unusable "+iv.Parameter+" ("+iv.Reason+")")
	}
	return fmt.Sprintf("%s could not be computed: %s", ie.Skill, strings.Join(parts, "; "))
}

// Observations loads what skill reads of patientID's stored observations: the latest observation
// per LOINC code of skill.Codes(), or for the vitals trend every observation of its codes in the
// window (opts.Window, default 24 h) ending at the newest one.
func Observations(ctx context.Context, q Querier, patientID string, skill clinical.Skill, opts clinical.Options) ([]clinical.Observation, error) {
	var out []clinical.Observation
	if skill.Name() != clinical.SkillVitalsTrend {
		err := Latest(ctx, q, []string{patientID}, skill.Codes(), func(_ string, o clinical.Observation) { out = append(out, o) })
		return out, err
	}
	window := opts.Window
	if window <= 0 {
		window = clinical.DefaultTrendWindow
	}
	rows, _ := q.Query(ctx, `select id, loinc, value, coalesce(unit, ''), effective_at from observations
where patient_id = $1 and loinc = any($2) and value is not null and effective_at >= (
	select max(effective_at) from observations where patient_id = $1 and loinc = any($2) and value is not null
) - make_interval(secs => $3)`, patientID, skill.Codes(), window.Seconds())
	var o clinical.Observation
	_, err := pgx.ForEachRow(rows, []any{&o.ID, &o.Code, &o.Value, &o.Unit, &o.EffectiveAt}, func() error {
		o.EffectiveAt = o.EffectiveAt.UTC()
		out = append(out, o)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("observations of %s: %w", patientID, err)
	}
	return out, nil
}

// Latest calls each, for every patient of patients and every LOINC code of codes, with the
// patient's newest stored observation of the code that has a value and a time (ties by the
// greater id), in patients' order and by code within a patient; a pair with none is skipped. One index probe a
// pair (observations_patient_code_latest), however long the patients' histories.
func Latest(ctx context.Context, q Querier, patients, codes []string, each func(patientID string, o clinical.Observation)) error {
	rows, _ := q.Query(ctx, `select p.id, o.id, c.code, o.value, coalesce(o.unit, ''), o.effective_at
from unnest($1::text[]) with ordinality p(id, i) cross join unnest($2::text[]) c(code)
cross join lateral (select id, value, unit, effective_at from observations
  where patient_id = p.id and loinc = c.code and value is not null and effective_at is not null
  order by effective_at desc, id desc limit 1) o
order by p.i, c.code`, patients, codes)
	var pid string
	var o clinical.Observation
	_, err := pgx.ForEachRow(rows, []any{&pid, &o.ID, &o.Code, &o.Value, &o.Unit, &o.EffectiveAt}, func() error {
		o.EffectiveAt = o.EffectiveAt.UTC()
		each(pid, o)
		return nil
	})
	if err != nil {
		return fmt.Errorf("latest observations: %w", err)
	}
	return nil
}

// sessionOutput is a session's stored output: the skill's output and, when the score qualified,
// the id of its report.
type sessionOutput struct {
	clinical.Output
	ReportID string `json:"reportId,omitempty"`
}

// finish fills ses's end state from an assessment: COMPLETED with the output, or FAILED with the
// reason. It returns the report a qualifying score makes (nil otherwise).
func finish(ses *Session, as Assessment) (*Report, error) {
	done := events.Now()
	latency := int32((as.Latency + time.Millisecond - 1) / time.Millisecond)
	tokens := int32(as.Tokens)
	ses.LatencyMs, ses.TokensUsed, ses.CompletedAt = &latency, &tokens, &done
	if as.llm != nil {
		b, err := json.Marshal(as.llm)
		ses.Status, ses.Output, ses.Error = StatusCompleted, b, nil
		return nil, err
	}
	if as.Output == nil {
		msg := as.Failure
		ses.Status, ses.Error, ses.Output = StatusFailed, &msg, nil
		return nil, nil
	}
	out := sessionOutput{Output: *as.Output}
	var rep *Report
	if Qualifies(*as.Output) {
		r, err := NewReport(ReportSpec{OrgID: ses.OrgID, ProjectID: ses.ProjectID, PatientID: ses.PatientID,
			SessionID: ses.ID, Performer: "carehub agent " + ses.AgentID, Output: *as.Output, At: done})
		if err != nil {
			return nil, err
		}
		rep, out.ReportID = &r, r.ID
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	ses.Status, ses.Output, ses.Error = StatusCompleted, b, nil
	return rep, nil
}

// insertSession inserts ses as it is.
func insertSession(ctx context.Context, tx pgx.Tx, ses *Session, runID string) error {
	_, err := tx.Exec(ctx, `insert into agent_sessions (id, org_id, project_id, agent_id, patient_id, status, input, output,
error, latency_ms, tokens_used, started_at, completed_at, run_id) values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
		ses.ID, ses.OrgID, ses.ProjectID, ses.AgentID, ses.PatientID, ses.Status, ses.Input, ses.Output, ses.Error,
		ses.LatencyMs, ses.TokensUsed, ses.StartedAt, ses.CompletedAt, nilIfEmpty(runID))
	if err != nil {
		return fmt.Errorf("insert session: %w", err)
	}
	return nil
}

// writeEnd writes, in tx, the report of a finished session (if any) and the session's events.
func (s *Service) writeEnd(ctx context.Context, tx pgx.Tx, ses *Session, rep *Report) error {
	evs, err := sessionEvents(ses, rep)
	if err != nil {
		return err
	}
	if rep != nil {
		if err := insertReport(ctx, tx, rep); err != nil {
			return err
		}
	}
	return outbox.AppendEvents(ctx, tx, s.eventsTopic, evs...)
}

// sessionEvents returns agent.session.updated for every state, plus agent.run_completed (with
// diagnostic.result_ready for a report) or agent.run.failed when the session ended.
func sessionEvents(ses *Session, rep *Report) ([]events.Event, error) {
	updated := map[string]any{"sessionId": ses.ID, "agentId": ses.AgentID, "patientId": ses.PatientID, "status": ses.Status,
		"startedAt": ses.StartedAt.UTC().Format(time.RFC3339Nano)}
	if ses.LatencyMs != nil {
		updated["latencyMs"], updated["tokensUsed"] = *ses.LatencyMs, *ses.TokensUsed
	}
	if ses.CompletedAt != nil {
		updated["completedAt"] = ses.CompletedAt.UTC().Format(time.RFC3339Nano)
	}
	var evs []events.Event
	add := func(typ, severity string, payload map[string]any) error {
		ev, err := events.New(typ, ses.OrgID, ses.ProjectID, events.SourceAgent, severity, payload)
		evs = append(evs, ev)
		return err
	}
	if err := add(events.TypeAgentSessionUpdated, events.SeverityInfo, updated); err != nil {
		return nil, err
	}
	end := map[string]any{"sessionId": ses.ID, "agentId": ses.AgentID, "patientId": ses.PatientID, "status": ses.Status}
	if ses.LatencyMs != nil {
		end["latencyMs"], end["tokensUsed"] = *ses.LatencyMs, *ses.TokensUsed
	}
	switch ses.Status {
	case StatusCompleted:
		if err := add(events.TypeAgentRunCompleted, events.SeverityInfo, end); err != nil {
			return nil, err
		}
		if rep != nil {
			ev, err := rep.Event(events.SourceAgent)
			if err != nil {
				return nil, err
			}
			evs = append(evs, ev)
		}
	case StatusFailed, StatusCancelled:
		if ses.LatencyMs == nil {
			end["latencyMs"], end["tokensUsed"] = 0, 0
		}
		if ses.Error != nil {
			end["error"] = *ses.Error
		}
		if err := add(events.TypeAgentRunFailed, events.SeverityWarning, end); err != nil {
			return nil, err
		}
	}
	return evs, nil
}

func nilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
