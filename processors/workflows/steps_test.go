package workflows

import "testing"

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
