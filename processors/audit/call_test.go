package audit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"carehub/kernel/access"
	"carehub/processors/audit"
)

func TestCallRecord(t *testing.T) {
	start := time.Date(2026, 12, 2, 10, 0, 0, 0, time.FixedZone("x", 3600))
	now := start.Add(42 * time.Millisecond)
	ctx, rec := access.WithRecorder(context.Background())
	access.Touch(ctx, access.KindPatient, "pat_1")
	p := &access.Principal{OrgID: "org_1", KeyID: "key_1", Mode: access.Live, ClientIP: "10.0.0.1"}

	r := audit.Call{Start: start, UserAgent: strings.Repeat("u", 600), Operation: "GET /v1/patients/{id}"}.Record(audit.Caller(p, rec), now)
	switch {
	case !strings.HasPrefix(r.ID, "req_"), !r.Time.Equal(start) || r.Time.Location() != time.UTC, r.LatencyMs != 42:
		t.Errorf("id, time, latency: %+v", r)
	case len(r.UserAgent) != 512, r.Status != 200, r.Outcome != "success":
		t.Errorf("user agent %d bytes, status %d, outcome %s", len(r.UserAgent), r.Status, r.Outcome)
	case r.OrgID != "org_1" || r.KeyID != "key_1" || r.ClientIP != "10.0.0.1" || strings.Join(r.PatientIDs, ",") != "pat_1":
		t.Errorf("who and what: %+v", r)
	}

	refused := audit.Call{RequestID: "req_x", Start: start}.Record(audit.Who{ClientIP: "10.0.0.2", AuthFailure: "unknown_key", Credential: "ch_live_…abcd"}, now)
	if refused.Status != 401 || refused.Outcome != "denied" || refused.AuthFailure != "unknown_key" || refused.ID != "req_x" || refused.PatientIDs != nil {
		t.Errorf("refused: %+v", refused)
	}
	for status, want := range map[int]string{201: "success", 403: "denied", 429: "denied", 404: "error", 503: "error"} {
		if got := audit.Outcome(status); got != want {
			t.Errorf("Outcome(%d) = %s, want %s", status, got, want)
		}
	}
}
