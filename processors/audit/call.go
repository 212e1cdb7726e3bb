package audit

import (
	"net/http"
	"time"

	"carehub/kernel/access"
	"carehub/kernel/ids"
	"carehub/storage"
)

// maxUserAgent bounds a record's user agent.
const maxUserAgent = 512

// Call is one operation as its audit record describes it. The transports observe it (an HTTP
// request, a WebSocket's connection_init or operation); this package decides what its record
// holds.
type Call struct {
	RequestID string    // "" for a new req_ id
	Start     time.Time // when the operation began
	UserAgent string    // of the request, or of a socket's upgrade request
	Operation string    // "<METHOD> <route template>", or gqldoc.OperationName's "graphql <type> <fields>"
	Status    int       // 0 means 200 for a caller, 401 for a refused credential
	Outcome   string    // "" to derive it from Status (Outcome)
}

// Who made a call: a live caller (Caller), or what is known of a credential that was refused.
type Who struct {
	OrgID, KeyID, Mode, ClientIP string
	// AuthFailure and Credential are a refused credential's reason and masked name; "" for a
	// caller that authenticated.
	AuthFailure, Credential string
	// Touched collected the ids the services touched (access.Touch); nil for none.
	Touched *access.Recorder
}

// Caller is p as the maker of a call whose touched ids r collected.
func Caller(p *access.Principal, r *access.Recorder) Who {
	return Who{OrgID: p.OrgID, KeyID: p.KeyID, Mode: p.Mode, ClientIP: p.ClientIP, Touched: r}
}

// Record returns c's audit record, made by who, its latency measured up to now.
func (c Call) Record(who Who, now time.Time) storage.AuditRecord {
	rec := storage.AuditRecord{ID: c.RequestID, Time: c.Start.UTC(), OrgID: who.OrgID, KeyID: who.KeyID, Mode: who.Mode,
		ClientIP: who.ClientIP, UserAgent: c.UserAgent, Operation: c.Operation, Outcome: c.Outcome, Status: c.Status,
		LatencyMs: int(now.Sub(c.Start).Milliseconds()), AuthFailure: who.AuthFailure, Credential: who.Credential}
	if rec.ID == "" {
		rec.ID = ids.New(ids.Request)
	}
	if len(rec.UserAgent) > maxUserAgent {
		rec.UserAgent = rec.UserAgent[:maxUserAgent]
	}
	if rec.Status == 0 {
		rec.Status = http.StatusOK
		if who.AuthFailure != "" {
			rec.Status = http.StatusUnauthorized
		}
	}
	if rec.Outcome == "" {
		rec.Outcome = Outcome(rec.Status)
	}
	if r := who.Touched; r != nil {
		rec.ResourceIDs, rec.PatientIDs = r.ResourceIDs(), r.PatientIDs()
		rec.PatientIDsOmitted, rec.ResourceIDsOmitted = r.Omitted()
		rec.Truncated = rec.PatientIDsOmitted > 0 || rec.ResourceIDsOmitted > 0
	}
	return rec
}

// Outcome is the outcome of a call answered with status: success, denied (401, 403, 429) or
// error.
func Outcome(status int) string {
	switch {
	case status < 400:
		return "success"
	case status == http.StatusUnauthorized || status == http.StatusForbidden || status == http.StatusTooManyRequests:
		return "denied"
	}
	return "error"
}
