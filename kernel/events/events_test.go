package events_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"carehub/kernel/events"
)

func TestValidType(t *testing.T) {
	tests := []struct {
		typ  string
		want bool
	}{
		{"agent.run_completed", true},
		{"agent.run.failed", true},
		{"a.b", true},
		{"device.observation_received", true},
		{"x1.y_2.z3", true},
		{"agent", false},
		{"", false},
		{".agent", false},
		{"agent.", false},
		{"agent..run", false},
		{"Agent.run", false},
		{"agent.run-failed", false},
		{"agent.*", false},
		{"*", false},
		{"agent. run", false},
		{strings.Repeat("a.", 128) + "a", false}, // 257 characters
	}
	for _, tt := range tests {
		if got := events.ValidType(tt.typ); got != tt.want {
			t.Errorf("ValidType(%q) = %v, want %v", tt.typ, got, tt.want)
		}
	}
}

func TestValidPattern(t *testing.T) {
	tests := []struct {
		pattern string
		want    bool
	}{
		{"*", true},
		{"agent.*", true},
		{"agent.run.*", true},
		{"agent.run_completed", true},
		{"agent", false},
		{".*", false},
		{"*.run", false},
		{"agent.*.failed", false},
		{"agent**", false},
		{"", false},
		{"Agent.*", false},
	}
	for _, tt := range tests {
		if got := events.ValidPattern(tt.pattern); got != tt.want {
			t.Errorf("ValidPattern(%q) = %v, want %v", tt.pattern, got, tt.want)
		}
	}
}

func TestMatchPattern(t *testing.T) {
	tests := []struct {
		pattern, typ string
		want         bool
	}{
		{"*", "agent.run.failed", true},
		{"*", "not a type", false},
		{"agent.*", "agent.run.failed", true},
		{"agent.*", "agent.run_completed", true},
		{"agent.*", "agent", false},
		{"agent.*", "agents.run", false},
		{"agent.*", "workflow.completed", false},
		{"agent.run.*", "agent.run.failed", true},
		{"agent.run.*", "agent.run_completed", false},
		{"workflow.completed", "workflow.completed", true},
		{"workflow.completed", "workflow.run.completed", false},
		{"workflow.*", "workflow.run.completed", true},
		{"agent.*.failed", "agent.run.failed", false}, // only trailing wildcards
		{"", "agent.run.failed", false},
	}
	for _, tt := range tests {
		if got := events.MatchPattern(tt.pattern, tt.typ); got != tt.want {
			t.Errorf("MatchPattern(%q, %q) = %v, want %v", tt.pattern, tt.typ, got, tt.want)
		}
	}
	if !events.MatchAny([]string{"deployment.*", "agent.run.failed"}, "agent.run.failed") {
		t.Error("MatchAny missed an exact pattern")
	}
	if events.MatchAny([]string{"deployment.*"}, "agent.run.failed") || events.MatchAny(nil, "a.b") {
		t.Error("MatchAny matched a type no pattern matches")
	}
}

func TestNew(t *testing.T) {
	before := time.Now().UTC().Add(-time.Second)
	ev, err := events.New("deployment.status_changed", "org_1", "prj_1", events.SourceDeployment, events.SeverityWarning,
		map[string]any{"deploymentId": "dep_1", "from": "RUNNING", "to": "DEGRADED"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ev.ID, "evt_") || len(ev.ID) != 4+26 {
		t.Errorf("id %q is not evt_ + ULID", ev.ID)
	}
	if ev.CreatedAt.Location() != time.UTC || ev.CreatedAt.Nanosecond()%1000 != 0 {
		t.Errorf("createdAt %v is not UTC at microsecond precision", ev.CreatedAt)
	}
	if ev.CreatedAt.Before(before) || ev.CreatedAt.After(time.Now().Add(time.Second)) {
		t.Errorf("createdAt %v is not now", ev.CreatedAt)
	}
	data, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	back, err := events.Decode(data)
	if err != nil {
		t.Fatalf("decode own envelope: %v", err)
	}
	if !back.CreatedAt.Equal(ev.CreatedAt) || back.ID != ev.ID || string(back.Payload) != string(ev.Payload) {
		t.Errorf("round trip changed the event: %+v != %+v", back, ev)
	}

	ev2, err := events.New("workflow.completed", "org_1", "prj_1", events.SourceWorkflow, events.SeverityInfo, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(ev2.Payload) != "{}" {
		t.Errorf("nil payload = %s, want {}", ev2.Payload)
	}
	if ev2.ID <= ev.ID {
		t.Errorf("ids do not increase: %s then %s", ev.ID, ev2.ID)
	}
}

func TestNewRejects(t *testing.T) {
	tests := []struct {
		name                  string
		typ, source, severity string
		payload               any
		want                  error
	}{
		{"bad type", "Agent", events.SourceAgent, events.SeverityInfo, nil, events.ErrInvalidType},
		{"bad source", "agent.run.failed", "robot", events.SeverityInfo, nil, events.ErrInvalidSource},
		{"bad severity", "agent.run.failed", events.SourceAgent, "fatal", nil, events.ErrInvalidSeverity},
		{"payload not an object", "agent.run.failed", events.SourceAgent, events.SeverityInfo, []int{1}, events.ErrInvalidEnvelope},
		{"payload not JSON", "agent.run.failed", events.SourceAgent, events.SeverityInfo, json.RawMessage(`{`), events.ErrInvalidEnvelope},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := events.New(tt.typ, "org_1", "prj_1", tt.source, tt.severity, tt.payload)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	good := `{"id":"evt_01jd7x8m3k2q9r5t6v7w8x9y0z","type":"a.b","orgId":"org_1","projectId":"prj_1","source":"system","severity":"info","payload":{},"createdAt":"2025-01-02T03:04:05.123456Z"}`
	if _, err := events.Decode([]byte(good)); err != nil {
		t.Fatalf("good envelope rejected: %v", err)
	}
	for name, data := range map[string]string{
		"not json":   `{"id":`,
		"array":      `[]`,
		"bad id":     strings.Replace(good, "evt_01jd7x8m3k2q9r5t6v7w8x9y0z", "obs_01jd7x8m3k2q9r5t6v7w8x9y0z", 1),
		"no time":    strings.Replace(good, `"createdAt":"2025-01-02T03:04:05.123456Z"`, `"x":1`, 1),
		"bad type":   strings.Replace(good, `"a.b"`, `"ab"`, 1),
		"no payload": strings.Replace(good, `"payload":{}`, `"payload":null`, 1),
	} {
		if _, err := events.Decode([]byte(data)); err == nil {
			t.Errorf("%s: decoded %s", name, data)
		}
	}
}
