package events

import (
	"encoding/json"
	"testing"
)

func TestStateOf(t *testing.T) {
	enc := func(v any) []byte { b, _ := json.Marshal(v); return b }
	sessions := map[string][]byte{
		TypeAgentSessionUpdated: enc(AgentSessionUpdated{SessionID: "ses_1", AgentID: "agt_1", Status: "RUNNING"}),
		TypeAgentRunCompleted:   enc(AgentRunCompleted{SessionID: "ses_1", AgentID: "agt_1", Status: "RUNNING"}),
		TypeAgentRunFailed:      enc(AgentRunFailed{SessionID: "ses_1", AgentID: "agt_1", Status: "RUNNING"}),
	}
	for typ, payload := range sessions {
		if s, ok := SessionStateOf(typ, payload); !ok || s != (SessionState{"ses_1", "agt_1", "RUNNING"}) {
			t.Errorf("SessionStateOf(%s) = %+v, %v", typ, s, ok)
		}
	}
	runs := map[string][]byte{
		TypeWorkflowRunUpdated:   enc(WorkflowRunUpdated{RunID: "run_1", WorkflowID: "wf_1", Status: "FAILED"}),
		TypeWorkflowCompleted:    enc(WorkflowCompleted{RunID: "run_1", WorkflowID: "wf_1", Status: "FAILED"}),
		TypeWorkflowRunCompleted: enc(WorkflowRunCompleted{RunID: "run_1", WorkflowID: "wf_1", Status: "FAILED"}),
	}
	for typ, payload := range runs {
		if r, ok := RunStateOf(typ, payload); !ok || r != (RunState{"run_1", "wf_1", "FAILED"}) {
			t.Errorf("RunStateOf(%s) = %+v, %v", typ, r, ok)
		}
	}
	if _, ok := RunStateOf(TypeAgentRunFailed, sessions[TypeAgentRunFailed]); ok {
		t.Error("RunStateOf accepted an agent event")
	}
	if _, ok := SessionStateOf(TypeAgentSessionUpdated, []byte("[1]")); ok {
		t.Error("SessionStateOf accepted a payload that is not an object")
	}
}
