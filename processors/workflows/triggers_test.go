package workflows

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/events"
	"carehub/storage/demo"
	"carehub/storage/kafka/kafkatest"
)

func (h *harness) startTriggers() string {
	h.t.Helper()
	group := kafkatest.Group(h.t, "triggers")
	tr, err := NewTriggers(TriggersConfig{Brokers: h.brokers, Service: h.svc, Group: group, Logger: h.log})
	if err != nil {
		h.t.Fatal(err)
	}
	h.background("triggers", tr.Run)
	return group
}

// TestTriggersStartOneRunPerEvent: a device observation starts one run (trigger "event", the
// spec's input) of every ACTIVE workflow of its organization whose patterns match, however often
// the event is delivered; other patterns, paused workflows and other tenants start nothing.
func TestTriggersStartOneRunPerEvent(t *testing.T) {
	h := newHarness(t)
	group := h.startTriggers()
	steps := []string{"load_patient", "score_news2"}
	exact := h.workflow("On observation", steps, "device.observation_received")
	rpm := h.scalar(`select id from projects where name = $1`, demo.RPMProjectName)
	prefix, err := h.svc.Create(h.ctx, NewWorkflow{Name: "Any device event", ProjectID: rpm, Steps: steps, Triggers: []string{"device.*"}})
	if err != nil {
		t.Fatal(err)
	}
	other := h.workflow("Labs", steps, "lab.*")
	paused := h.workflow("Paused", steps, "device.observation_received")
	if _, err := h.svc.SetStatus(h.ctx, paused.ID, StatusPaused); err != nil {
		t.Fatal(err)
	}

	payload := map[string]any{"observationId": "obs_01jx00000000000000000000t1", "patientId": demo.DeterioratingPatientID,
		"code": "8867-4", "deviceType": "bedside_monitor", "value": 118, "unit": "/min", "effectiveAt": time.Now().UTC().Format(time.RFC3339)}
	ev, err := events.New(TriggerObservation, demo.DemoOrgID, h.project, events.SourceIntegration, events.SeverityInfo, payload)
	if err != nil {
		t.Fatal(err)
	}
	foreign, _ := events.New(TriggerObservation, h.scalar(`select id from organizations where slug = 'northwind-health'`), "prj_01aaaaaaaaaaaaaaaaaaaaaaaa",
		events.SourceIntegration, events.SeverityInfo, payload)
	cl := kafkatest.Client(t)
	for _, e := range []any{ev, ev, foreign, ev} { // the same event three times
		b, _ := json.Marshal(e)
		if err := cl.ProduceSync(h.ctx, &kgo.Record{Topic: h.events, Key: []byte(h.project), Value: b}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	h.drained(group, h.events, 20*time.Second)
	for _, tc := range []struct {
		w    *Workflow
		runs int
	}{{exact, 1}, {prefix, 1}, {other, 0}, {paused, 0}} {
		if n := h.count(`select count(*) from workflow_runs where workflow_id = $1`, tc.w.ID); n != tc.runs {
			t.Errorf("%s: %d runs, want %d", tc.w.Name, n, tc.runs)
		}
	}
	var trigger, eventID string
	var input map[string]string
	if err := h.pool.QueryRow(h.ctx, `select trigger, trigger_event_id, input from workflow_runs where workflow_id = $1`, exact.ID).
		Scan(&trigger, &eventID, &input); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"observation_id": "obs_01jx00000000000000000000t1", "patient_id": demo.DeterioratingPatientID, "device_type": "bedside_monitor"}
	if trigger != TriggerEvent || eventID != ev.ID || len(input) != 3 || input["observation_id"] != want["observation_id"] ||
		input["patient_id"] != want["patient_id"] || input["device_type"] != want["device_type"] {
		t.Fatalf("run trigger %s event %s input %v", trigger, eventID, input)
	}
}

// TestTriggersMatchEventsOfAnyShape: an envelope in another member order and case (whose head
// events.PeekHead does not read) starts its runs as one written by Encode does, and a record
// that looks like a matching event but is not an envelope is skipped.
func TestTriggersMatchEventsOfAnyShape(t *testing.T) {
	h := newHarness(t)
	group := h.startTriggers()
	w := h.workflow("Any lab", []string{"load_patient"}, "lab.*")
	ev, err := events.New("lab.result_received", demo.DemoOrgID, h.project, events.SourceIntegration, events.SeverityInfo, map[string]any{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	reordered := fmt.Sprintf(`{"payload":{"n":1},"TYPE":%q,"orgId":%q,"projectId":%q,"id":%q,"source":"integration","severity":"info","createdAt":%q}`,
		ev.Type, ev.OrgID, ev.ProjectID, ev.ID, ev.CreatedAt.Format(time.RFC3339Nano))
	poison := fmt.Sprintf(`{"id":"evt_x","type":"lab.poison","orgId":%q,"projectId":%q,"payload":[`, ev.OrgID, ev.ProjectID)
	cl := kafkatest.Client(t)
	for _, v := range []string{poison, reordered} {
		if err := cl.ProduceSync(h.ctx, &kgo.Record{Topic: h.events, Key: []byte(h.project), Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	h.drained(group, h.events, 20*time.Second)
	if n := h.count(`select count(*) from workflow_runs where workflow_id = $1 and trigger_event_id = $2`, w.ID, ev.ID); n != 1 {
		t.Errorf("%d runs of the reordered event, want 1", n)
	}
}

// TestTriggerChainsEnd: two workflows triggered by each other's workflow.run.completed stop after
// MaxTriggerDepth links, and neither is triggered by its own runs.
func TestTriggerChainsEnd(t *testing.T) {
	h := newHarness(t)
	h.relay()
	h.startRunner(RunnerConfig{})
	group := h.startTriggers()
	a := h.workflow("Ping", []string{"notify"}, "workflow.run.completed")
	b := h.workflow("Pong", []string{"notify"}, "workflow.run.completed")
	h.start(a, "")
	deadline := time.Now().Add(30 * time.Second)
	for h.count(`select count(*) from workflow_runs where status = 'COMPLETED' and trigger_depth = $1`, MaxTriggerDepth) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the chain did not reach its last link")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A link too many would exist once the last link's events are on the topic and the triggers
	// group, which commits only after the runs it starts, has consumed them.
	for h.count(`select count(*) from outbox where sent_at is null`) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the relay did not send the last link's events")
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.drained(group, h.events, 20*time.Second)
	rows, _ := h.pool.Query(h.ctx, `select workflow_id, trigger_depth from workflow_runs order by trigger_depth`)
	var chain []string
	for rows.Next() {
		var wf string
		var d int
		if err := rows.Scan(&wf, &d); err != nil {
			t.Fatal(err)
		}
		chain = append(chain, map[string]string{a.ID: "Ping", b.ID: "Pong"}[wf])
		if len(chain)-1 != d {
			t.Fatalf("depths out of order: %v then depth %d", chain, d)
		}
	}
	if len(chain) != MaxTriggerDepth+1 || chain[0] != "Ping" || chain[1] != "Pong" || chain[2] != "Ping" || chain[3] != "Pong" {
		t.Fatalf("chain %v", chain)
	}
}
