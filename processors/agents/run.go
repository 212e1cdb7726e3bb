package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/processors/access"
	"carehub/processors/clinical"
	"carehub/processors/events"
	"carehub/processors/fault"
	"carehub/storage"
	"carehub/storage/ids"
)

// Run runs agent agentID against patient patientID with input (a JSON object of skill options
// such as {"spo2Scale": 2}, or nil). In sync mode the returned session is finished: COMPLETED with
// its output, or FAILED with the reason (for example the vital signs the patient has no
// observation of). In async mode it is QUEUED and the worker pool runs it.
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
	var found bool
	if err := s.pool.QueryRow(ctx, `select exists(select 1 from patients where id = $1 and org_id = $2 and ($3 or synthetic))`,
		patientID, a.OrgID, p.SeesRealPatients()).Scan(&found); err != nil {
		return nil, fmt.Errorf("run agent: patient %s: %w", patientID, err)
	}
	if !found {
		return nil, fault.NotFound("patient", patientID)
	}
	input, opts, err := parseInput(input)
	if err != nil {
		return nil, err
	}
	skill, ok := clinical.Lookup(a.Skill)
	if !ok {
		return nil, fault.Conflict("agent %s runs unknown skill %q", a.ID, a.Skill)
	}
	started := events.Now()
	ses := &Session{ID: ids.New(ids.Session), OrgID: a.OrgID, ProjectID: a.ProjectID, AgentID: a.ID, PatientID: patientID,
		Input: input, StartedAt: started}

	if a.RunMode != ModeAsync {
		if err := s.compute(ctx, skill, ses, opts); err != nil {
			return nil, fmt.Errorf("run agent %s: %w", a.ID, err)
		}
		if err := s.save(ctx, ses, true); err != nil {
			return nil, err
		}
		return ses, nil
	}

	// Reserve room first, so that a session recorded QUEUED is certain to reach a worker.
	select {
	case s.slots <- struct{}{}:
	default:
		return nil, fault.New(fault.KindRateLimited, "too many agent runs are queued; retry shortly")
	}
	ses.Status = StatusQueued
	if err := s.save(ctx, ses, true); err != nil {
		<-s.slots
		return nil, err
	}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		<-s.slots
		return ses, nil // stays QUEUED; a later node (the Kafka runner) picks it up
	}
	s.jobs <- job{session: *ses, skill: skill, opts: opts}
	s.mu.RUnlock()
	return ses, nil
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

// compute runs skill over the patient's stored observations and fills the session's end state:
// COMPLETED with output, or FAILED with the reason when the inputs do not allow a score. Other
// errors (the database) are returned.
func (s *Service) compute(ctx context.Context, skill clinical.Skill, ses *Session, opts clinical.Options) error {
	start := time.Now()
	obs, err := s.observations(ctx, ses.PatientID, skill, opts)
	if err != nil {
		return err
	}
	in := clinical.NewInput(obs, opts)
	context, err := json.Marshal(struct {
		PatientID    string                 `json:"patientId"`
		Skill        string                 `json:"skill"`
		Options      clinical.Options       `json:"options"`
		Observations []clinical.Observation `json:"observations"`
	}{ses.PatientID, skill.Name(), opts, obs})
	if err != nil {
		return err
	}
	tokens := clinical.Tokens(string(context))
	out, runErr := skill.Run(in)
	var ie *clinical.InputError
	switch {
	case errors.As(runErr, &ie):
		msg := failureMessage(ie)
		ses.Status, ses.Error, ses.Output = StatusFailed, &msg, nil
	case runErr != nil:
		return runErr
	default:
		b, err := json.Marshal(out)
		if err != nil {
			return err
		}
		ses.Status, ses.Output, ses.Error = StatusCompleted, b, nil
		tokens += clinical.Tokens(string(b))
	}
	latency := int32((time.Since(start) + time.Millisecond - 1) / time.Millisecond)
	done := events.Now()
	t := int32(tokens)
	ses.LatencyMs, ses.TokensUsed, ses.CompletedAt = &latency, &t, &done
	return nil
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

// observations loads what skill reads: the latest observation per LOINC code, or for the vitals
// trend every observation of its codes in the window ending at the newest one.
func (s *Service) observations(ctx context.Context, patientID string, skill clinical.Skill, opts clinical.Options) ([]clinical.Observation, error) {
	var rows pgx.Rows
	if skill.Name() == clinical.SkillVitalsTrend {
		window := opts.Window
		if window <= 0 {
			window = clinical.DefaultTrendWindow
		}
		rows, _ = s.pool.Query(ctx, `select id, loinc, value, coalesce(unit, ''), effective_at from observations
where patient_id = $1 and loinc = any($2) and value is not null and effective_at >= (
	select max(effective_at) from observations where patient_id = $1 and loinc = any($2) and value is not null
) - make_interval(secs => $3)`, patientID, skill.Codes(), window.Seconds())
	} else {
		rows, _ = s.pool.Query(ctx, `select distinct on (loinc) id, loinc, value, coalesce(unit, ''), effective_at from observations
where patient_id = $1 and loinc = any($2) and value is not null and effective_at is not null
order by loinc, effective_at desc, id desc`, patientID, skill.Codes())
	}
	var out []clinical.Observation
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

// save writes the session (inserting it when insert is set) with the events its state calls for,
// in one transaction.
func (s *Service) save(ctx context.Context, ses *Session, insert bool) error {
	evs, err := sessionEvents(ses)
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if insert {
			_, err := tx.Exec(ctx, `insert into agent_sessions (id, org_id, project_id, agent_id, patient_id, status, input, output,
error, latency_ms, tokens_used, started_at, completed_at) values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
				ses.ID, ses.OrgID, ses.ProjectID, ses.AgentID, ses.PatientID, ses.Status, ses.Input, ses.Output, ses.Error,
				ses.LatencyMs, ses.TokensUsed, ses.StartedAt, ses.CompletedAt)
			if err != nil {
				return fmt.Errorf("insert session: %w", err)
			}
		} else {
			_, err := tx.Exec(ctx, `update agent_sessions set status = $2, output = $3, error = $4, latency_ms = $5, tokens_used = $6,
completed_at = $7, updated_at = now() where id = $1`, ses.ID, ses.Status, ses.Output, ses.Error, ses.LatencyMs, ses.TokensUsed, ses.CompletedAt)
			if err != nil {
				return fmt.Errorf("update session: %w", err)
			}
		}
		return events.Append(ctx, tx, s.eventsTopic, evs...)
	})
	if err != nil {
		return fmt.Errorf("save agent session %s: %w", ses.ID, err)
	}
	return nil
}

// sessionEvents returns agent.session.updated for every state, plus agent.run_completed (with
// diagnostic.result_ready for a scored skill) or agent.run.failed when the session ended.
func sessionEvents(ses *Session) ([]storage.Event, error) {
	updated := map[string]any{"sessionId": ses.ID, "agentId": ses.AgentID, "patientId": ses.PatientID, "status": ses.Status,
		"startedAt": ses.StartedAt.UTC().Format(time.RFC3339Nano)}
	if ses.LatencyMs != nil {
		updated["latencyMs"], updated["tokensUsed"] = *ses.LatencyMs, *ses.TokensUsed
	}
	if ses.CompletedAt != nil {
		updated["completedAt"] = ses.CompletedAt.UTC().Format(time.RFC3339Nano)
	}
	var evs []storage.Event
	add := func(typ, severity string, payload map[string]any) error {
		ev, err := events.New(typ, ses.OrgID, ses.ProjectID, events.SourceAgent, severity, payload)
		evs = append(evs, ev)
		return err
	}
	if err := add("agent.session.updated", events.SeverityInfo, updated); err != nil {
		return nil, err
	}
	end := map[string]any{"sessionId": ses.ID, "agentId": ses.AgentID, "patientId": ses.PatientID, "status": ses.Status}
	if ses.LatencyMs != nil {
		end["latencyMs"], end["tokensUsed"] = *ses.LatencyMs, *ses.TokensUsed
	}
	switch ses.Status {
	case StatusCompleted:
		if err := add("agent.run_completed", events.SeverityInfo, end); err != nil {
			return nil, err
		}
		var out clinical.Output
		if json.Unmarshal(ses.Output, &out) == nil && out.Score != nil {
			conclusion := fmt.Sprintf("%s %d", strings.ToUpper(out.Skill), *out.Score)
			if out.Band != "" {
				conclusion += " (" + out.Band + ")"
			}
			if out.Response != "" {
				conclusion += ": " + out.Response
			}
			if err := add("diagnostic.result_ready", eventSeverity(out.Severity), map[string]any{"reportId": ses.ID,
				"patientId": ses.PatientID, "code": out.Skill, "conclusion": conclusion, "severity": string(out.Severity)}); err != nil {
				return nil, err
			}
		}
	case StatusFailed, StatusCancelled:
		if ses.Error != nil {
			end["error"] = *ses.Error
		}
		if err := add("agent.run.failed", events.SeverityWarning, end); err != nil {
			return nil, err
		}
	}
	return evs, nil
}

// eventSeverity maps a clinical severity onto the event envelope's severity.
func eventSeverity(s clinical.Severity) string {
	switch s {
	case clinical.SeverityCritical:
		return events.SeverityCritical
	case clinical.SeverityHigh, clinical.SeverityMedium:
		return events.SeverityWarning
	}
	return events.SeverityInfo
}

// job is one queued async session.
type job struct {
	session Session
	skill   clinical.Skill
	opts    clinical.Options
}

// work runs queued sessions until Close. A job is run to the end even while closing, under a
// context bounded by a minute, so that no session is left RUNNING by a clean shutdown.
func (s *Service) work() {
	defer s.wg.Done()
	for {
		select {
		case <-s.stop:
			return
		case j := <-s.jobs:
			s.runJob(j)
			<-s.slots
		}
	}
}

func (s *Service) runJob(j job) {
	defer func() {
		if r := recover(); r != nil {
			s.logger.Error("agent worker panicked", "session_id", j.session.ID, "panic", fmt.Sprint(r))
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ses := j.session
	ses.Status = StatusRunning
	if err := s.save(ctx, &ses, false); err != nil {
		s.logger.Error("agent session: mark running", "session_id", ses.ID, "err", err)
		return
	}
	if err := s.compute(ctx, j.skill, &ses, j.opts); err != nil {
		msg := "internal error while running the agent"
		s.logger.Error("agent session failed", "session_id", ses.ID, "err", err)
		now := events.Now()
		zero := int32(0)
		ses.Status, ses.Error, ses.CompletedAt = StatusFailed, &msg, &now
		if ses.LatencyMs == nil {
			ses.LatencyMs, ses.TokensUsed = &zero, &zero
		}
	}
	if err := s.save(ctx, &ses, false); err != nil {
		s.logger.Error("agent session: save result", "session_id", ses.ID, "err", err)
	}
}
