package workflows

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func TestParseStep(t *testing.T) {
	for name, want := range map[string]struct {
		agent string
		ok    bool
	}{
		"load_patient": {"", true},
		"notify":       {"", true},
		"run_agent:agt_01k65840e0be59pf06zhktwqg0": {"agt_01k65840e0be59pf06zhktwqg0", true},
		"run_agent:":          {"", false},
		"run_agent:<agentId>": {"<agentId>", false},
		"run_agent:wf_01k65840e0be59pf06zhktwqg0": {"wf_01k65840e0be59pf06zhktwqg0", false},
		"Load_Patient":  {"", false},
		"summon_doctor": {"", false},
	} {
		agent, ok := ParseStep(name)
		if ok != want.ok || (ok && agent != want.agent) {
			t.Errorf("ParseStep(%q) = %q, %v; want %q, %v", name, agent, ok, want.agent, want.ok)
		}
	}
}

func TestCheckSteps(t *testing.T) {
	const agent = "run_agent:agt_01k65840e0be59pf06zhktwqg0"
	for _, tc := range []struct {
		steps   []string
		problem string // a substring of the problem, "" when valid
	}{
		{[]string{"load_patient", "score_news2", "assess_risk", "create_alert"}, ""},
		{[]string{"load_patient", agent, "update_risk_level", "notify"}, ""},
		{[]string{"notify", "wait:90s", "wait:15m", "wait:1s"}, ""},
		{[]string{"load_patient", "assess_risk"}, "step 2: assess_risk needs a score"},
		{[]string{"create_alert", "score_news2"}, "step 1: create_alert needs a score"},
		{[]string{"vitals_trend", "update_risk_level"}, "needs a score"},
		{[]string{"wait:0s"}, "a wait takes a duration"},
		{[]string{"wait:16m"}, "a wait takes a duration"},
		{[]string{"wait:soon"}, "a wait takes a duration"},
		{[]string{"score_news2", "summon_doctor"}, `step 2: unknown step "summon_doctor"; valid steps: load_patient`},
	} {
		agents, problem := checkSteps(tc.steps)
		if tc.problem == "" && problem != "" || tc.problem != "" && !strings.Contains(problem, tc.problem) {
			t.Errorf("%v: problem %q, want %q", tc.steps, problem, tc.problem)
		}
		if tc.problem == "" && slices.Contains(tc.steps, agent) && (len(agents) != 1 || agents[0] != "agt_01k65840e0be59pf06zhktwqg0") {
			t.Errorf("%v: agents %v", tc.steps, agents)
		}
	}
}

// TestCatalogueIsDocumented: every catalogue step has a section in STEPS.md.
func TestCatalogueIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("STEPS.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range Steps {
		if !strings.Contains(string(doc), "### `"+s.Name+"`") {
			t.Errorf("STEPS.md has no section for %s", s.Name)
		}
	}
}
