package rest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"carehub/api/ws/wstest"
	"carehub/e2e/servertest"
	"carehub/kernel/clinical"
	"carehub/storage/demo"
)

// TestObservationEndToEnd is issue 10's first acceptance, on a whole node: an observation posted
// for a demo patient is readable through GraphQL FHIRPatient.observations and
// GET /v1/patients/{id}/observations within 2 s, and its device.observation_received event
// reaches the event log and an eventStream subscriber.
func TestObservationEndToEnd(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	patient := demo.StablePatientID
	project := s.GraphQL(key, `{ organizations { projects { id createdAt } } }`, nil)
	var orgs struct {
		Organizations []struct {
			Projects []struct{ ID, CreatedAt string }
		}
	}
	if err := json.Unmarshal(project.Data, &orgs); err != nil || len(orgs.Organizations) != 1 {
		t.Fatalf("projects: %s %v", project.Data, err)
	}
	// Device events land in the organization's oldest project.
	oldest := orgs.Organizations[0].Projects[0]
	for _, p := range orgs.Organizations[0].Projects {
		if p.CreatedAt < oldest.CreatedAt {
			oldest = p
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ws, err := wstest.Dial(ctx, "ws"+strings.TrimPrefix(s.URL, "http")+"/graphql", "Bearer "+key)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	stream, err := ws.Subscribe(ctx, "obs", `subscription($p: ID!) { eventStream(projectId: $p, types: ["device.observation_received"]) { id type payload } }`,
		map[string]any{"p": oldest.ID})
	if err != nil {
		t.Fatal(err)
	}
	s.WaitSubscribers(1) // the subscription is registered before the event exists

	obs := map[string]any{
		"resourceType":      "Observation",
		"status":            "final",
		"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": clinical.LOINCHeartRate}}},
		"subject":           map[string]any{"reference": "Patient/" + patient},
		"effectiveDateTime": time.Now().UTC().Format(time.RFC3339),
		"valueQuantity":     map[string]any{"value": 131, "unit": "/min"},
		"device":            map[string]any{"display": "bedside-monitor"},
	}
	posted := time.Now()
	r := s.Do(http.MethodPost, "/v1/observations", key, obs)
	if r.Status != http.StatusAccepted {
		t.Fatalf("POST /v1/observations: %d %s", r.Status, r.Body)
	}
	var ans struct{ IDs []string }
	r.JSON(t, &ans)
	if len(ans.IDs) != 1 {
		t.Fatalf("answer: %s", r.Body)
	}
	id := ans.IDs[0]

	servertest.Eventually(t, 2*time.Second, "the observation in GraphQL and REST reads", func() bool {
		g := s.GraphQL(key, `query($id: ID!) { patient(id: $id) { observations(limit: 5) { id } } }`, map[string]any{"id": patient})
		rr := s.Do(http.MethodGet, "/v1/patients/"+patient+"/observations?limit=5", key, nil)
		return strings.Contains(string(g.Data), id) && rr.Status == http.StatusOK && strings.Contains(string(rr.Body), id)
	})
	t.Logf("observation readable %s after the POST", time.Since(posted).Round(time.Millisecond))

	select {
	case m := <-stream:
		if !strings.Contains(string(m), id) || !strings.Contains(string(m), "device.observation_received") {
			t.Fatalf("eventStream message: %s", m)
		}
	case <-ctx.Done():
		t.Fatal("no device.observation_received on eventStream")
	}
	servertest.Eventually(t, 10*time.Second, "device.observation_received in the event log", func() bool {
		rr := s.Do(http.MethodGet, "/v1/events?projectId="+oldest.ID+"&type=device.observation_received", key, nil)
		return rr.Status == http.StatusOK && strings.Contains(string(rr.Body), id)
	})
}
