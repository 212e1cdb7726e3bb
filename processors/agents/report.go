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
	"carehub/storage/outbox"
)

// ReportPrefix starts a report id (rpt_ + ULID), the reportId of diagnostic.result_ready.
const ReportPrefix = "rpt_"

// Report is a clinical report: a qualifying score kept as a FHIR R4 RiskAssessment.
type Report struct {
	ID         string          `db:"id"`
	OrgID      string          `db:"org_id"`
	ProjectID  string          `db:"project_id"`
	PatientID  string          `db:"patient_id"`
	SessionID  *string         `db:"session_id"` // the agent session that made it, if any
	RunID      *string         `db:"run_id"`     // the workflow run that made it, if any
	Code       string          `db:"code"`       // the assessment: news2, qsofa
	Severity   string          `db:"severity"`   // NONE … CRITICAL
	Conclusion string          `db:"conclusion"`
	Resource   json.RawMessage `db:"resource"` // the RiskAssessment
	CreatedAt  time.Time       `db:"created_at"`
}

// Qualifies reports whether a skill's output warrants a report (and a workflow's alert): a NEWS2
// of 5 or more or with a single parameter scoring 3 (the RCP's urgent-review triggers), or a
// positive qSOFA. In carehub's severities that is MEDIUM or above.
func Qualifies(out clinical.Output) bool {
	switch out.Skill {
	case clinical.SkillNEWS2:
		return out.Score != nil && (*out.Score >= 5 || (out.RedScore != nil && *out.RedScore))
	case clinical.SkillQSOFA:
		return out.Positive != nil && *out.Positive
	}
	return false
}

// ReportSpec is what NewReport needs.
type ReportSpec struct {
	OrgID, ProjectID, PatientID string
	SessionID, RunID            string // at most one is usually set; either may be empty
	Performer                   string // who assessed, for RiskAssessment.performer.display
	Output                      clinical.Output
	At                          time.Time
}

// skillDisplay names the assessments in reports.
var skillDisplay = map[string]string{
	clinical.SkillNEWS2: "National Early Warning Score 2 (NEWS2)",
	clinical.SkillQSOFA: "quick Sequential Organ Failure Assessment (qSOFA)",
}

// outcomes are what each assessment predicts.
var outcomes = map[string]string{
	clinical.SkillNEWS2: "Acute clinical deterioration",
	clinical.SkillQSOFA: "Poor outcome from suspected sepsis",
}

// qualitativeRisk maps a severity onto the FHIR risk-probability code system.
func qualitativeRisk(s clinical.Severity) (code, display string) {
	switch s {
	case clinical.SeverityCritical, clinical.SeverityHigh:
		return "high", "High likelihood"
	case clinical.SeverityMedium:
		return "moderate", "Moderate likelihood"
	case clinical.SeverityLow:
		return "low", "Low likelihood"
	}
	return "negligible", "Negligible likelihood"
}

// Conclusion is a report's one-line conclusion, e.g. "NEWS2 11 (high): Emergency response".
func Conclusion(out clinical.Output) string {
	c := strings.ToUpper(out.Skill)
	if out.Skill == clinical.SkillQSOFA {
		c = "qSOFA"
	}
	if out.Score != nil {
		c += fmt.Sprintf(" %d", *out.Score)
	}
	if out.Band != "" {
		c += " (" + out.Band + ")"
	}
	if out.Response != "" {
		c += ": " + out.Response
	} else if len(out.Recommendations) > 0 {
		c += ": " + out.Recommendations[0]
	}
	return c
}

// NewReport builds the report of a scored output: a FHIR R4 RiskAssessment with the patient as
// subject, the observations used as basis, one prediction whose qualitative risk follows the
// severity, the clinical response as mitigation and the recommendations as notes.
func NewReport(sp ReportSpec) (Report, error) {
	out := sp.Output
	id := ids.New(ReportPrefix)
	at := sp.At.UTC()
	code, display := qualitativeRisk(out.Severity)
	basis := make([]map[string]string, len(out.ObservationIDs))
	for i, o := range out.ObservationIDs {
		basis[i] = map[string]string{"reference": "Observation/" + o}
	}
	notes := make([]map[string]string, len(out.Recommendations))
	for i, r := range out.Recommendations {
		notes[i] = map[string]string{"text": r}
	}
	conclusion := Conclusion(out)
	name := skillDisplay[out.Skill]
	if name == "" {
		name = out.Skill
	}
	resource := map[string]any{
		"resourceType":       "RiskAssessment",
		"id":                 id,
		"status":             "final",
		"subject":            map[string]string{"reference": "Patient/" + sp.PatientID},
		"occurrenceDateTime": at.Format(time.RFC3339Nano),
		"method": map[string]any{
			"coding": []map[string]string{{"system": "https://carehub.dev/fhir/CodeSystem/clinical-skill", "code": out.Skill, "display": name}},
			"text":   name,
		},
		"basis": basis,
		"prediction": []map[string]any{{
			"outcome": map[string]string{"text": outcomes[out.Skill]},
			"qualitativeRisk": map[string]any{
				"coding": []map[string]string{{"system": "http://terminology.hl7.org/CodeSystem/risk-probability", "code": code, "display": display}},
				"text":   string(out.Severity),
			},
			"rationale": conclusion,
		}},
		"note": notes,
	}
	if out.Response != "" {
		resource["mitigation"] = out.Response
	}
	if sp.Performer != "" {
		resource["performer"] = map[string]string{"display": sp.Performer}
	}
	raw, err := json.Marshal(resource)
	if err != nil {
		return Report{}, fmt.Errorf("report: %w", err)
	}
	return Report{ID: id, OrgID: sp.OrgID, ProjectID: sp.ProjectID, PatientID: sp.PatientID,
		SessionID: nilIfEmpty(sp.SessionID), RunID: nilIfEmpty(sp.RunID), Code: out.Skill, Severity: string(out.Severity),
		Conclusion: conclusion, Resource: raw, CreatedAt: at}, nil
}

// Event returns the report's diagnostic.result_ready event, from source (agent or workflow).
func (r *Report) Event(source string) (events.Event, error) {
	return events.New(events.TypeDiagnosticResultReady, r.OrgID, r.ProjectID, source, eventSeverity(clinical.Severity(r.Severity)),
		map[string]any{"reportId": r.ID, "patientId": r.PatientID, "code": r.Code, "conclusion": r.Conclusion, "severity": r.Severity})
}

// InsertReport writes r and its diagnostic.result_ready event (from source) in tx. Services that
// make reports outside an agent session (a workflow's create_alert step) call it.
func InsertReport(ctx context.Context, tx pgx.Tx, eventsTopic string, r *Report, source string) error {
	ev, err := r.Event(source)
	if err != nil {
		return err
	}
	if err := insertReport(ctx, tx, r); err != nil {
		return err
	}
	return outbox.AppendEvents(ctx, tx, eventsTopic, ev)
}

func insertReport(ctx context.Context, tx pgx.Tx, r *Report) error {
	_, err := tx.Exec(ctx, `insert into reports (id, org_id, project_id, patient_id, session_id, run_id, code, severity, conclusion,
resource, created_at) values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		r.ID, r.OrgID, r.ProjectID, r.PatientID, r.SessionID, r.RunID, r.Code, r.Severity, r.Conclusion, r.Resource, r.CreatedAt)
	if err != nil {
		return fmt.Errorf("insert report: %w", err)
	}
	return nil
}

const reportColumns = `id, org_id, project_id, patient_id, session_id, run_id, code, severity, conclusion, resource, created_at`

// Report returns one report of the caller's organization; a test key sees only reports of
// synthetic patients. Requires read:patients.
func (s *Service) Report(ctx context.Context, id string) (*Report, error) {
	p, err := access.Require(ctx, access.ReadPatients)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, `select `+prefixed("r.", reportColumns)+` from reports r join patients p on p.id = r.patient_id
where r.id = $1 and ($2 = '' or r.org_id = $2) and ($3 or p.synthetic)`, id, p.OrgFilter(), p.SeesRealPatients())
	r, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Report])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fault.NotFound("report", id)
	}
	if err != nil {
		return nil, fmt.Errorf("report %s: %w", id, err)
	}
	access.Touch(ctx, access.KindPatient, r.PatientID)
	return r, nil
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

// prefixed qualifies every column of a comma-separated list with prefix.
func prefixed(prefix, columns string) string {
	parts := strings.Split(columns, ",")
	for i, c := range parts {
		parts[i] = prefix + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}
