package authztest

import (
	"context"
	"strings"
	"testing"
	"time"

	"carehub/api/ws/wstest"
	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// TestWebSocketOperationsAreAudited: a live-key patient read over the WebSocket is audited with
// the patient id like the same read over POST /graphql.
func TestWebSocketOperationsAreAudited(t *testing.T) {
	s := servertest.Start(t)
	admin := s.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg)
	live := s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients)
	liveID := keyID(t, s, admin, live)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := wstest.Dial(ctx, "ws"+strings.TrimPrefix(s.URL, "http")+"/graphql", "Bearer "+live)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msgs, err := c.Subscribe(ctx, "1", `query P($id: ID!) { patient(id: $id) { id } }`, map[string]any{"id": demo.DeterioratingPatientID})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-msgs:
		if !strings.Contains(string(m), demo.DeterioratingPatientID) {
			t.Fatalf("patient read over the socket: %s", m)
		}
	case <-ctx.Done():
		t.Fatal("no answer over the socket")
	}
	page := auditOf(t, s, admin, liveID, func(p auditPage) bool { return len(p.Data) >= 1 })
	rec := page.Data[0]
	if rec.Operation != "graphql query patient" || len(rec.PatientIDs) != 1 || rec.PatientIDs[0] != demo.DeterioratingPatientID {
		t.Fatalf("audit record of the WebSocket read: %+v", rec)
	}
}
