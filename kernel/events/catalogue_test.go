package events_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"testing"

	"carehub/kernel/events"
)

var update = flag.Bool("update", false, "rewrite schemas/kafka/event-types.json from events.Catalogue")

const catalogueFile = "../../schemas/kafka/event-types.json"

// catalogueJSON is the committed form of the catalogue: what GET /v1/event-types serves.
func catalogueJSON(t *testing.T) []byte {
	t.Helper()
	data, err := json.MarshalIndent(struct {
		Comment string             `json:"$comment"`
		Types   []events.EventType `json:"eventTypes"`
	}{
		Comment: "Generated from kernel/events.Catalogue by `go generate ./kernel/events`; do not edit.",
		Types:   events.Catalogue,
	}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(data, '\n')
}

// TestCatalogueFile fails when schemas/kafka/event-types.json drifts from the catalogue.
func TestCatalogueFile(t *testing.T) {
	want := catalogueJSON(t)
	if *update {
		if err := os.WriteFile(catalogueFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(catalogueFile)
	if err != nil {
		t.Fatalf("%v (run go generate ./kernel/events)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is out of date with events.Catalogue: run go generate ./kernel/events", catalogueFile)
	}
}

// TestCatalogueCoversSpec checks that every type the spec and DECISIONS §4 name is catalogued
// and that the entries are well formed.
func TestCatalogueCoversSpec(t *testing.T) {
	named := []string{
		// spec, Events section
		"workflow.completed", "workflow.run.completed", "agent.run.failed", "agent.run_completed",
		"device.observation_received", "diagnostic.result_ready",
		// DECISIONS §4
		"asset.submitted", "asset.approved", "asset.rejected", "asset.installed", "asset.deprecated",
		"deployment.status_changed",
		// subscriptions agentSessionUpdated and workflowRunUpdated
		"agent.session.updated", "workflow.run.updated",
	}
	for _, typ := range named {
		if _, ok := events.Lookup(typ); !ok {
			t.Errorf("catalogue lacks %s", typ)
		}
	}
	if _, ok := events.Lookup("agent.run"); ok {
		t.Error("Lookup found a type that is not catalogued")
	}

	seen := map[string]bool{}
	for _, et := range events.Catalogue {
		if seen[et.Type] {
			t.Errorf("%s listed twice", et.Type)
		}
		seen[et.Type] = true
		if !events.ValidType(et.Type) {
			t.Errorf("%s is not a valid type", et.Type)
		}
		if !events.ValidSource(et.Source) {
			t.Errorf("%s: source %q", et.Type, et.Source)
		}
		if et.Description == "" || len(et.Payload) == 0 {
			t.Errorf("%s: no description or payload", et.Type)
		}
		fields := map[string]bool{}
		for _, f := range et.Payload {
			if fields[f.Name] {
				t.Errorf("%s: field %s listed twice", et.Type, f.Name)
			}
			fields[f.Name] = true
			switch f.Type {
			case events.FieldString, events.FieldInteger, events.FieldNumber, events.FieldBoolean,
				events.FieldObject, events.FieldArray, events.FieldDateTime:
			default:
				t.Errorf("%s.%s: unknown field type %q", et.Type, f.Name, f.Type)
			}
		}
	}

	// The spec fixes these payload shapes exactly.
	wantFields := map[string][]string{
		"workflow.run.completed": {"run_id", "workflow_id", "status", "duration_ms", "alert_generated", "severity"},
		"workflow.completed":     {"workflowId", "runId", "status", "durationMs"},
		"agent.run_completed":    {"sessionId", "agentId", "patientId", "status", "latencyMs", "tokensUsed"},
	}
	for typ, names := range wantFields {
		et, _ := events.Lookup(typ)
		for _, n := range names {
			found := false
			for _, f := range et.Payload {
				found = found || f.Name == n && f.Required
			}
			if !found {
				t.Errorf("%s: no required payload field %s", typ, n)
			}
		}
	}
}
