package events

import "encoding/json"

// PayloadOf decodes an event payload into its typed struct (T is the type's entry in Payloads).
func PayloadOf[T any](payload []byte) (T, bool) {
	var v T
	err := json.Unmarshal(payload, &v)
	return v, err == nil
}

// SessionState is what an agent-session event (TypeAgentSessionUpdated, TypeAgentRunCompleted,
// TypeAgentRunFailed) announces: which session of which agent, and the status it reached.
type SessionState struct {
	SessionID, AgentID, Status string
}

// SessionStateOf returns the session state an event of type typ announces; ok is false for other
// types and for a payload that does not decode.
func SessionStateOf(typ string, payload []byte) (s SessionState, ok bool) {
	switch typ {
	case TypeAgentSessionUpdated:
		p, ok := PayloadOf[AgentSessionUpdated](payload)
		return SessionState{p.SessionID, p.AgentID, p.Status}, ok
	case TypeAgentRunCompleted:
		p, ok := PayloadOf[AgentRunCompleted](payload)
		return SessionState{p.SessionID, p.AgentID, p.Status}, ok
	case TypeAgentRunFailed:
		p, ok := PayloadOf[AgentRunFailed](payload)
		return SessionState{p.SessionID, p.AgentID, p.Status}, ok
	}
	return SessionState{}, false
}

// RunState is what a workflow-run event (TypeWorkflowRunUpdated, TypeWorkflowCompleted,
// TypeWorkflowRunCompleted) announces: which run of which workflow, and the status it reached.
type RunState struct {
	RunID, WorkflowID, Status string
}

// RunStateOf returns the run state an event of type typ announces; ok is false for other types
// and for a payload that does not decode.
func RunStateOf(typ string, payload []byte) (s RunState, ok bool) {
	switch typ {
	case TypeWorkflowRunUpdated:
		p, ok := PayloadOf[WorkflowRunUpdated](payload)
		return RunState{p.RunID, p.WorkflowID, p.Status}, ok
	case TypeWorkflowCompleted:
		p, ok := PayloadOf[WorkflowCompleted](payload)
		return RunState{p.RunID, p.WorkflowID, p.Status}, ok
	case TypeWorkflowRunCompleted:
		p, ok := PayloadOf[WorkflowRunCompleted](payload)
		return RunState{p.RunID, p.WorkflowID, p.Status}, ok
	}
	return RunState{}, false
}
