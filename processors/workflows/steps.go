package workflows

import (
	"fmt"
	"strings"
	"time"

	"carehub/kernel/ids"
)

// Step is one entry of the step catalogue (STEPS.md documents each in full).
type Step struct {
	Name        string
	Description string
	Inputs      string // what it reads
	Outputs     string // what it records in the run output and what else it changes
}

// Prefixes of the parameterized steps.
const (
	// RunAgentPrefix starts a run_agent:<agentId> step, which runs an agent of the workflow's
	// project against the run's patient.
	RunAgentPrefix = "run_agent:"
	// WaitPrefix starts a wait:<duration> step, which pauses the run (e.g. wait:15m before
	// reading the vitals again).
	WaitPrefix = "wait:"
)

// Bounds of a wait:<duration> step.
const (
	MinWait = time.Second
	MaxWait = 15 * time.Minute
)

// Steps is the catalogue of workflow steps, in a stable order. A workflow is a list of these
// names (with run_agent:<agentId> and wait:<duration> parameterized), executed in order by the
// workflow runner.
var Steps = []Step{
	{"load_patient", "load the run's patient and check that the run may read it",
		"input patient_id (or patientId): a patient of the workflow's organization; a run started with a test key, or of a workflow a test key created, reaches only synthetic patients",
		"patientId, riskLevel, synthetic"},
	{"latest_vitals", "read the patient's latest stored observation of each vital sign",
		"the run's patient; its stored observations",
		"vitals: [{code, name, value, unit, observationId, effectiveAt}], missing: the vital signs without an observation"},
	{"score_news2", "compute NEWS2 from the patient's latest vitals",
		"the run's patient; latest observation of RR, SpO2, O2 flow, SBP, HR, GCS, temperature; skill options from the run input (spo2Scale, onOxygen, consciousness)",
		"the NEWS2 output: score, band, severity, redScore, response, components, recommendations, observationIds; fails the run when a vital sign is missing or unusable"},
	{"score_qsofa", "compute qSOFA from the patient's latest vitals",
		"the run's patient; latest RR, SBP, GCS; option consciousness",
		"the qSOFA output: score, band (positive/negative), severity, components, recommendations, observationIds; fails the run when a vital sign is missing"},
	{"vitals_trend", "summarize the vital-sign trends over a window (default 24 h, option window)",
		"the run's patient; every observation of the vital signs in the window",
		"the trend output: a component per vital sign with direction and rate; scores no risk (severity NONE)"},
	{"assess_risk", "combine the scores so far into the run's severity",
		"the outputs of earlier score_news2, score_qsofa and run_agent steps (at least one must come before)",
		"severity (NONE, LOW, MEDIUM, HIGH, CRITICAL: the highest of the scores), basedOn: [{step, skill, score, band, severity}]"},
	{"update_risk_level", "store the assessed risk as the patient's riskLevel",
		"the run's severity (a score step must come before)",
		"riskLevel (low, moderate, high, critical) and previous; changes FHIRPatient.riskLevel"},
	{"create_alert", "raise a clinical alert when a score qualifies (NEWS2 ≥ 5 or a single red parameter, qSOFA positive)",
		"the outputs of earlier score steps (at least one must come before)",
		"alert (boolean), severity, reportIds; for each qualifying score of a score_* step a report (FHIR RiskAssessment) and diagnostic.result_ready; a run_agent step's own report counts without a second one; the run's workflow.run.completed then says alert_generated true"},
	{"notify", "address the run's outcome to the project's webhooks",
		"the project's active webhook subscriptions",
		"subscriptions: how many match workflow.run.completed, which the run emits when it ends (as every run does)"},
	{RunAgentPrefix + "<agentId>", "run the named agent of the same project against the patient, synchronously whatever its run mode",
		"the run's patient; the run input as the agent input",
		"sessionId, agentId, status, output (the agent's), reportId; the session is stored with its events; a FAILED session fails the run"},
	{WaitPrefix + "<duration>", "pause the run for a duration of 1s to 15m (Go syntax: 90s, 5m)",
		"nothing",
		"waitedMs; a run interrupted while waiting resumes with the time left"},
}

// stepSpec is a parsed step name.
type stepSpec struct {
	kind    string        // the catalogue name, or RunAgentPrefix / WaitPrefix
	agentID string        // run_agent
	wait    time.Duration // wait
}

// scoring steps produce a score that assess_risk, update_risk_level and create_alert use.
func (s stepSpec) scoring() bool {
	return s.kind == "score_news2" || s.kind == "score_qsofa" || s.kind == RunAgentPrefix
}

func parseStep(name string) (stepSpec, bool) {
	if id, found := strings.CutPrefix(name, RunAgentPrefix); found {
		return stepSpec{kind: RunAgentPrefix, agentID: id}, ids.Valid(ids.Agent, id)
	}
	if d, found := strings.CutPrefix(name, WaitPrefix); found {
		w, err := time.ParseDuration(d)
		return stepSpec{kind: WaitPrefix, wait: w}, err == nil && w >= MinWait && w <= MaxWait
	}
	for _, s := range Steps {
		if s.Name == name && !strings.Contains(name, "<") {
			return stepSpec{kind: name}, true
		}
	}
	return stepSpec{}, false
}

// ParseStep reports whether name is a catalogue step; for run_agent:<id> it also returns the
// agent id.
func ParseStep(name string) (agentID string, ok bool) {
	s, ok := parseStep(name)
	return s.agentID, ok
}

// checkSteps validates a workflow's steps: every name in the catalogue, and the steps that use a
// score (assess_risk, update_risk_level, create_alert) after one that makes it. It returns the
// agent ids of run_agent steps, or a message for the steps field.
func checkSteps(steps []string) (agentIDs []string, problem string) {
	scored := false
	for i, st := range steps {
		spec, ok := parseStep(st)
		if !ok {
			if strings.HasPrefix(st, WaitPrefix) {
				return nil, fmt.Sprintf("step %d: %q: a wait takes a duration from %s to %s, such as wait:5m", i+1, st, MinWait, MaxWait)
			}
			return nil, fmt.Sprintf("step %d: unknown step %q; valid steps: %s", i+1, st, StepNames())
		}
		switch spec.kind {
		case "assess_risk", "update_risk_level", "create_alert":
			if !scored {
				return nil, fmt.Sprintf("step %d: %s needs a score: put score_news2, score_qsofa or run_agent:<agentId> before it", i+1, st)
			}
		case RunAgentPrefix:
			agentIDs = append(agentIDs, spec.agentID)
		}
		scored = scored || spec.scoring()
	}
	return agentIDs, ""
}

// StepNames lists the catalogue's names, comma-separated, for error messages.
func StepNames() string {
	names := make([]string, len(Steps))
	for i, s := range Steps {
		names[i] = s.Name
	}
	return strings.Join(names, ", ")
}
