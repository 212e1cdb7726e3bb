// Package storage holds the small contracts and types that carehub's stores share: the event log
// and the audit log, each with a Postgres implementation (storage/postgres, the embedded default)
// and a ClickHouse one (storage/clickhouse, production). Both implementations must pass the
// conformance suites in storage/storagetest. Storage imports no domain package.
package storage

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// ErrBadCursor is returned by queries given a cursor they did not produce.
var ErrBadCursor = errors.New("invalid cursor")

// Event is one platform event: the envelope of DECISIONS §4, as it travels on carehub.events.v1
// and as the event log keeps it.
type Event struct {
	ID        string          `json:"id"` // evt_…
	Type      string          `json:"type"`
	OrgID     string          `json:"orgId"`
	ProjectID string          `json:"projectId"`
	Source    string          `json:"source"`   // workflow, agent, integration, deployment, system
	Severity  string          `json:"severity"` // info, warning, error, critical
	Payload   json.RawMessage `json:"payload"`
	CreatedAt time.Time       `json:"createdAt"`
}

// EventQuery selects events of one project, newest first.
type EventQuery struct {
	OrgID     string    // required unless the caller is the platform operator ("" = any organization)
	ProjectID string    // required
	Type      string    // exact type, optional
	Since     time.Time // events created at or after Since; zero = no bound
	Limit     int       // 1..1000; 0 = the implementation's default (100), more is clamped to 1000
	Cursor    string    // from an earlier page's NextCursor; a foreign one gives ErrBadCursor
}

// EventPage is one page of events. Total counts every match of the query, not only this page.
type EventPage struct {
	Events     []Event
	Total      int64
	NextCursor string // "" on the last page
}

// EventLog stores events. Implementations are safe for concurrent use.
type EventLog interface {
	// AppendEvents stores events durably before returning. It is idempotent by event id: appending
	// an event whose id is already stored leaves exactly one copy.
	AppendEvents(ctx context.Context, events []Event) error
	// QueryEvents returns events matching q, newest first (created_at desc, id desc).
	QueryEvents(ctx context.Context, q EventQuery) (EventPage, error)
}

// AuditRecord is one HIPAA audit entry: who called what, touching which resources, with what
// outcome (DECISIONS §2).
type AuditRecord struct {
	ID          string    `json:"id"` // req_… (the request id)
	Time        time.Time `json:"time"`
	OrgID       string    `json:"orgId"`
	KeyID       string    `json:"keyId"`
	Mode        string    `json:"mode"`
	ClientIP    string    `json:"clientIp"`
	UserAgent   string    `json:"userAgent"`
	Operation   string    `json:"operation"` // e.g. "GET /v1/patients/{id}" or "graphql query patient"
	ResourceIDs []string  `json:"resourceIds"`
	PatientIDs  []string  `json:"patientIds"`
	Outcome     string    `json:"outcome"` // success, denied, error
	Status      int       `json:"status"`  // HTTP status
	LatencyMs   int       `json:"latencyMs"`
	// Truncated says the call touched more ids than one record keeps (10,000 patient ids, 1,000
	// other ids); PatientIDsOmitted and ResourceIDsOmitted count the distinct ids left out (a
	// lower bound past ten times the cap, where counting stops).
	Truncated          bool `json:"truncated"`
	PatientIDsOmitted  int  `json:"patientIdsOmitted"`
	ResourceIDsOmitted int  `json:"resourceIdsOmitted"`
	// AuthFailure is set on the record of a refused credential (status 401): missing, malformed,
	// unknown_key, revoked, expired or invalid_token. Credential then names what was presented
	// without the secret: "chk_live_…AbCd" (a key's prefix and last four), "jwt", or "".
	AuthFailure string `json:"authFailure,omitempty"`
	Credential  string `json:"credential,omitempty"`
}

// AuditQuery selects audit records of one organization, newest first.
type AuditQuery struct {
	OrgID     string    // "" = any organization (platform operator)
	From, To  time.Time // records at or after From and before To; zero = no bound
	KeyID     string
	PatientID string
	Operation string
	Limit     int
	Cursor    string
}

// AuditPage is one page of audit records.
type AuditPage struct {
	Records    []AuditRecord
	Total      int64
	NextCursor string
}

// AuditLog stores audit records, idempotent by record id.
type AuditLog interface {
	AppendAudit(ctx context.Context, records []AuditRecord) error
	QueryAudit(ctx context.Context, q AuditQuery) (AuditPage, error)
}
