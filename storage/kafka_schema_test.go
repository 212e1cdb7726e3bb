package storage_test

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"carehub/kernel/events"
	"carehub/storage"
)

// The Kafka message schemas (schemas/kafka/*.v1.json) are checked here with a small validator
// for the subset of JSON Schema they use: type, properties, required, items, enum, const,
// pattern, format date-time, minimum, maximum, minLength, maxLength, minItems. A keyword outside
// that subset fails the test, so a schema cannot silently rely on something unchecked.

type schema map[string]any

var knownKeywords = map[string]bool{
	"$schema": true, "$id": true, "title": true, "description": true, "$comment": true,
	"type": true, "properties": true, "required": true, "items": true, "enum": true, "const": true,
	"pattern": true, "format": true, "minimum": true, "maximum": true, "minLength": true,
	"maxLength": true, "minItems": true,
}

func loadSchema(t *testing.T, name string) schema {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("../schemas/kafka", name))
	if err != nil {
		t.Fatal(err)
	}
	var s schema
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := checkKeywords(s, name); err != nil {
		t.Fatal(err)
	}
	return s
}

func checkKeywords(s schema, path string) error {
	for k, v := range s {
		if !knownKeywords[k] {
			return fmt.Errorf("%s: keyword %q is outside the validated subset", path, k)
		}
		switch k {
		case "properties":
			for name, sub := range v.(map[string]any) {
				if err := checkKeywords(schema(sub.(map[string]any)), path+"."+name); err != nil {
					return err
				}
			}
		case "items":
			if err := checkKeywords(schema(v.(map[string]any)), path+"[]"); err != nil {
				return err
			}
		case "format":
			if v != "date-time" {
				return fmt.Errorf("%s: format %v is outside the validated subset", path, v)
			}
		}
	}
	return nil
}

// validate returns every violation of v (decoded with UseNumber) against s.
func validate(s schema, v any, path string) []string {
	var errs []string
	fail := func(format string, args ...any) {
		errs = append(errs, path+": "+fmt.Sprintf(format, args...))
	}
	if c, ok := s["const"]; ok && fmt.Sprint(c) != fmt.Sprint(v) {
		fail("want %v", c)
	}
	if enum, ok := s["enum"].([]any); ok {
		found := false
		for _, e := range enum {
			found = found || fmt.Sprint(e) == fmt.Sprint(v)
		}
		if !found {
			fail("%v not in %v", v, enum)
		}
	}
	if typ, ok := s["type"]; ok {
		var types []string
		switch typ := typ.(type) {
		case string:
			types = []string{typ}
		case []any:
			for _, x := range typ {
				types = append(types, x.(string))
			}
		}
		matched := false
		for _, want := range types {
			matched = matched || hasType(v, want)
		}
		if !matched {
			fail("%T is not %v", v, types)
			return errs
		}
	}
	switch v := v.(type) {
	case map[string]any:
		if req, ok := s["required"].([]any); ok {
			for _, r := range req {
				if _, ok := v[r.(string)]; !ok {
					fail("missing %s", r)
				}
			}
		}
		props, _ := s["properties"].(map[string]any)
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if sub, ok := props[k]; ok {
				errs = append(errs, validate(schema(sub.(map[string]any)), v[k], path+"."+k)...)
			}
		}
	case []any:
		if n, ok := s["minItems"].(float64); ok && float64(len(v)) < n {
			fail("%d items, want at least %v", len(v), n)
		}
		if items, ok := s["items"].(map[string]any); ok {
			for i, x := range v {
				errs = append(errs, validate(schema(items), x, fmt.Sprintf("%s[%d]", path, i))...)
			}
		}
	case string:
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(v) {
			fail("%q does not match %s", v, p)
		}
		if n, ok := s["minLength"].(float64); ok && float64(len([]rune(v))) < n {
			fail("shorter than %v", n)
		}
		if n, ok := s["maxLength"].(float64); ok && float64(len([]rune(v))) > n {
			fail("longer than %v", n)
		}
		if s["format"] == "date-time" {
			if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
				fail("%q is not a date-time", v)
			}
		}
	case json.Number:
		f, _ := v.Float64()
		if n, ok := s["minimum"].(float64); ok && f < n {
			fail("%v < %v", v, n)
		}
		if n, ok := s["maximum"].(float64); ok && f > n {
			fail("%v > %v", v, n)
		}
	}
	return errs
}

func hasType(v any, typ string) bool {
	switch typ {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "null":
		return v == nil
	case "number":
		_, ok := v.(json.Number)
		return ok
	case "integer":
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		f, err := n.Float64()
		return err == nil && f == math.Trunc(f) && !strings.ContainsAny(n.String(), ".eE")
	}
	return false
}

func decodeJSON(t *testing.T, data []byte) any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// edit returns msg (a JSON object) with fields set (or removed, for a nil value).
func edit(t *testing.T, msg []byte, fields map[string]any) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(msg, &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range fields {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	return mustJSON(t, m)
}

func TestKafkaSchemas(t *testing.T) {
	ev, err := events.New("workflow.run.completed", "org_1", "prj_1", events.SourceWorkflow, events.SeverityInfo,
		map[string]any{"run_id": "run_1", "workflow_id": "wf_1", "status": "COMPLETED", "duration_ms": 1200, "alert_generated": false, "severity": "NONE"})
	if err != nil {
		t.Fatal(err)
	}
	event := mustJSON(t, ev)
	audit := mustJSON(t, storage.AuditRecord{
		ID: "req_01jd7x8m3k2q9r5t6v7w8x9y0z", Time: time.Now().UTC(), OrgID: "org_1", KeyID: "key_1",
		Mode: "live", ClientIP: "10.0.0.1", UserAgent: "curl/8", Operation: "GET /v1/patients/{id}",
		ResourceIDs: []string{"pat_1"}, PatientIDs: []string{"pat_1"}, Outcome: "success", Status: 200, LatencyMs: 12,
	})
	auditNil := mustJSON(t, storage.AuditRecord{
		ID: "req_01jd7x8m3k2q9r5t6v7w8x9y0z", Time: time.Now().UTC(), Operation: "POST /v1/auth/token",
		Outcome: "denied", Status: 401,
	})
	observation := []byte(`{
		"id": "obs_01jd7x8m3k2q9r5t6v7w8x9y0z", "orgId": "org_1", "patientId": "pat_1",
		"receivedAt": "2025-03-01T10:00:00.000001Z",
		"observation": {
			"resourceType": "Observation", "status": "final",
			"code": {"coding": [{"system": "http://loinc.org", "code": "8867-4", "display": "Heart rate"}]},
			"subject": {"reference": "Patient/pat_1"},
			"valueQuantity": {"value": 72.5, "unit": "beats/minute"},
			"effectiveDateTime": "2025-03-01T09:59:58Z",
			"device": {"display": "wearable"}
		}}`)
	run := []byte(`{"runId": "run_01jd7x8m3k2q9r5t6v7w8x9y0z", "workflowId": "wf_01jd7x8m3k2q9r5t6v7w8x9y0z", "orgId": "org_1", "projectId": "prj_1", "attempt": 1}`)

	tests := []struct {
		name   string
		schema string
		msg    []byte
		valid  bool
	}{
		{"event from New", "events.v1.json", event, true},
		{"event without payload", "events.v1.json", edit(t, event, map[string]any{"payload": nil}), false},
		{"event with bad type", "events.v1.json", edit(t, event, map[string]any{"type": "workflow"}), false},
		{"event with bad source", "events.v1.json", edit(t, event, map[string]any{"source": "robot"}), false},
		{"event with bad time", "events.v1.json", edit(t, event, map[string]any{"createdAt": "yesterday"}), false},
		{"event with array payload", "events.v1.json", edit(t, event, map[string]any{"payload": []int{1}}), false},
		{"audit record", "audit.v1.json", audit, true},
		{"audit record with nil slices", "audit.v1.json", auditNil, true},
		{"audit with bad outcome", "audit.v1.json", edit(t, audit, map[string]any{"outcome": "ok"}), false},
		{"audit with fractional status", "audit.v1.json", edit(t, audit, map[string]any{"status": 200.5}), false},
		{"audit without operation", "audit.v1.json", edit(t, audit, map[string]any{"operation": nil}), false},
		{"truncated audit record", "audit.v1.json", edit(t, audit, map[string]any{"truncated": true, "patientIdsOmitted": 250, "resourceIdsOmitted": 40}), true},
		{"audit with negative omitted count", "audit.v1.json", edit(t, audit, map[string]any{"patientIdsOmitted": -1}), false},
		{"refused credential", "audit.v1.json", edit(t, auditNil, map[string]any{"authFailure": "revoked", "credential": "chk_live_…AbCd"}), true},
		{"refusal with unknown reason", "audit.v1.json", edit(t, auditNil, map[string]any{"authFailure": "bad luck"}), false},
		{"observation", "observations.v1.json", observation, true},
		{"observation without patient", "observations.v1.json", edit(t, observation, map[string]any{"patientId": nil}), false},
		{"observation of another resource", "observations.v1.json", edit(t, observation, map[string]any{"observation": map[string]any{
			"resourceType": "Patient", "status": "final", "code": map[string]any{"coding": []any{map[string]any{"system": "s", "code": "c"}}},
			"subject": map[string]any{"reference": "Patient/pat_1"}}}), false},
		{"observation without coding", "observations.v1.json", edit(t, observation, map[string]any{"observation": map[string]any{
			"resourceType": "Observation", "status": "final", "code": map[string]any{"coding": []any{}},
			"subject": map[string]any{"reference": "Patient/pat_1"}}}), false},
		{"workflow run", "workflow-runs.v1.json", run, true},
		{"workflow run attempt 0", "workflow-runs.v1.json", edit(t, run, map[string]any{"attempt": 0}), false},
		{"workflow run without run id", "workflow-runs.v1.json", edit(t, run, map[string]any{"runId": nil}), false},
	}
	schemas := map[string]schema{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, ok := schemas[tt.schema]
			if !ok {
				s = loadSchema(t, tt.schema)
				schemas[tt.schema] = s
			}
			errs := validate(s, decodeJSON(t, tt.msg), "$")
			if tt.valid && len(errs) > 0 {
				t.Fatalf("valid message rejected: %v", errs)
			}
			if !tt.valid && len(errs) == 0 {
				t.Fatalf("invalid message accepted: %s", tt.msg)
			}
		})
	}
}

// TestEventSchemaMatchesCode keeps events.v1.json's enumerations in step with the Go validators.
func TestEventSchemaMatchesCode(t *testing.T) {
	s := loadSchema(t, "events.v1.json")
	props := s["properties"].(map[string]any)
	for _, src := range props["source"].(map[string]any)["enum"].([]any) {
		if !events.ValidSource(src.(string)) {
			t.Errorf("schema source %v is not a valid source", src)
		}
	}
	for _, sev := range props["severity"].(map[string]any)["enum"].([]any) {
		if !events.ValidSeverity(sev.(string)) {
			t.Errorf("schema severity %v is not a valid severity", sev)
		}
	}
	for _, src := range []string{events.SourceWorkflow, events.SourceAgent, events.SourceIntegration, events.SourceDeployment, events.SourceSystem} {
		if errs := validate(schema(props["source"].(map[string]any)), src, "source"); len(errs) > 0 {
			t.Errorf("schema rejects source %s", src)
		}
	}
	typePattern := regexp.MustCompile(props["type"].(map[string]any)["pattern"].(string))
	for _, typ := range []string{"a.b", "agent.run.failed", "agent", "Agent.run", "a..b", "a.b-c"} {
		if typePattern.MatchString(typ) != events.ValidType(typ) {
			t.Errorf("schema pattern and ValidType disagree on %q", typ)
		}
	}
}
