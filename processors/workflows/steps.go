package workflows

import (
	"strings"

	"carehub/storage/ids"
)

// Step is one entry of the step catalogue.
type Step struct {
	Name        string
	Description string
}

// RunAgentPrefix starts a run_agent:<agentId> step, which runs an agent of the workflow's project
// against the run's patient.
const RunAgentPrefix = "run_agent:"

// Steps is the catalogue of workflow steps, in a stable order. A workflow is a list of these names
// (and run_agent:<agentId>), executed in order by the workflow runner.
var Steps = []Step{
	{"load_patient", "load the run's patient (input patient_id) and check it is visible to the workflow's organization"},
	{"latest_vitals", "read the patient's latest stored observation per vital-sign LOINC code"},
	{"score_news2", "compute the NEWS2 early-warning score from the latest vitals"},
	{"score_qsofa", "compute the qSOFA sepsis screen from the latest vitals"},
	{"vitals_trend", "summarize the vital-sign trends over the last 24 hours"},
	{"assess_risk", "combine the scores into the run's severity (NONE, LOW, MEDIUM, HIGH, CRITICAL)"},
	{"update_risk_level", "store the assessed risk as the patient's riskLevel"},
	{"create_alert", "raise a clinical alert (diagnostic.result_ready) when the severity is HIGH or CRITICAL"},
	{"notify", "send the run's outcome to the project's webhooks (workflow.run.completed)"},
	{RunAgentPrefix + "<agentId>", "run the named agent of the same project against the patient"},
}

// ParseStep reports whether name is a catalogue step; for run_agent:<id> it also returns the
// agent id.
func ParseStep(name string) (agentID string, ok bool) {
	if id, found := strings.CutPrefix(name, RunAgentPrefix); found {
		return id, ids.Valid(ids.Agent, id)
	}
	for _, s := range Steps[:len(Steps)-1] {
		if s.Name == name {
			return "", true
		}
	}
	return "", false
}

// StepNames lists the catalogue's names, comma-separated, for error messages.
func StepNames() string {
	names := make([]string, len(Steps))
	for i, s := range Steps {
		names[i] = s.Name
	}
	return strings.Join(names, ", ")
}
