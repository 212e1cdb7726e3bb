// Package storage holds the small contracts and types that carehub's stores share: the event log
// and the audit log, each with a Postgres implementation (storage/postgres, the embedded default)
// and a ClickHouse one (storage/clickhouse, production). Both implementations must pass the
// conformance suites in storage/storagetest. Storage imports no domain package.
package storage

import (
	"context"
	"errors"
	"strings"
	"time"

	"carehub/kernel/events"
)

// ErrBadCursor is returned by queries given a cursor they did not produce.
var ErrBadCursor = errors.New("invalid cursor")

// ErrUnstorable marks a store's refusal of the data itself (a number out of range, text it
// cannot hold, a broken constraint), as opposed to the store being away or slow: the same data
// is refused again however often it is retried. AppendEvents and AppendAudit wrap such errors
// with it, so that the event log's and the audit log's writers set the records aside (a
// dead-letter topic) instead of retrying them forever.
var ErrUnstorable = errors.New("the store refuses the data")

// RefusedError is a store's refusal of data (it unwraps to ErrUnstorable and to Err). Its Error
// is Code alone, which may be logged; Err's own text may quote the value refused.
type RefusedError struct {
	Code string // the store's code for the fault: "SQLSTATE 22003", "ClickHouse code 53"
	Err  error
}

func (e *RefusedError) Error() string   { return "the store refuses the data (" + e.Code + ")" }
func (e *RefusedError) Unwrap() []error { return []error{ErrUnstorable, e.Err} }

// IsUnstorable reports whether err is a store's refusal of the data (ErrUnstorable): the
// consumers' consume.DeadLetter Permanent.
func IsUnstorable(err error) bool { return errors.Is(err, ErrUnstorable) }

// Refusal words a refusal for a log and a dead-letter header: the store's code (RefusedError),
// never its message, which may quote the value (patient data). The consumers'
// consume.DeadLetter Reason.
func Refusal(err error) string {
	if re, ok := errors.AsType[*RefusedError](err); ok {
		return re.Error()
	}
	return ErrUnstorable.Error()
}

// EventQuery selects events of one project, newest first unless Ascending.
type EventQuery struct {
	OrgID     string    // required unless the caller is the platform operator ("" = any organization)
	ProjectID string    // required
	Type      string    // exact type, optional
	Types     []string  // any of these: an exact type or a prefix pattern "agent.*"; empty = every type
	Since     time.Time // events created at or after Since; zero = no bound
	To        time.Time // events created before To; zero = no bound
	// Resource filters: ids named by the payload (patientId, agentId, workflowId or workflow_id,
	// deploymentId); "" = no filter.
	PatientID, AgentID, WorkflowID, DeploymentID string
	Ascending                                    bool      // oldest first (created_at asc, id asc)
	Total                                        TotalMode // how Total is computed: exact (the default), estimated or omitted
	Limit                                        int       // 1..1000; 0 = the implementation's default (100), more is clamped to 1000
	Cursor                                       string    // from an earlier page's NextCursor; a foreign one gives ErrBadCursor
}

// TotalMode says how a page's Total is computed.
type TotalMode string

// Total modes. An exact count reads every match; an estimate costs what the store's statistics
// cost (Postgres: the planner's row estimate; ClickHouse: the count before duplicates collapse);
// none skips counting, for deep paging and export.
const (
	TotalExact    TotalMode = ""
	TotalEstimate TotalMode = "estimate"
	TotalNone     TotalMode = "none"
)

// MatchesType reports whether typ matches pattern: an exact type, "prefix.*" (any type under
// prefix) or "*".
func MatchesType(pattern, typ string) bool {
	if pattern == "*" {
		return true
	}
	if prefix, ok := strings.CutSuffix(pattern, ".*"); ok {
		return strings.HasPrefix(typ, prefix+".")
	}
	return pattern == typ
}

// SplitTypePatterns splits type patterns into exact types and prefixes: "agent.*" gives the
// prefix "agent.", "*" the prefix "" (every type). exact is never nil; prefixes is nil when
// every pattern is exact.
func SplitTypePatterns(patterns []string) (exact, prefixes []string) {
	exact = []string{}
	for _, p := range patterns {
		switch prefix, ok := strings.CutSuffix(p, "*"); {
		case ok && (prefix == "" || strings.HasSuffix(prefix, ".")):
			prefixes = append(prefixes, prefix)
		default:
			exact = append(exact, p)
		}
	}
	return exact, prefixes
}

// EventPage is one page of events. Total counts every match of the query, not only this page,
// as the query's TotalMode asks (0 when none).
type EventPage struct {
	Events     []events.Event
	Total      int64
	NextCursor string // "" on the last page
}

// EventLog stores events. Implementations are safe for concurrent use.
type EventLog interface {
	// AppendEvents stores events durably before returning. It is idempotent by event id: appending
	// an event whose id is already stored leaves exactly one copy.
	AppendEvents(ctx context.Context, events []events.Event) error
	// QueryEvents returns events matching q, newest first (created_at desc, id desc), or
	// oldest first (asc) when q.Ascending.
	QueryEvents(ctx context.Context, q EventQuery) (EventPage, error)
	// AggregateEvents counts (or measures) the events matching q, grouped as q asks.
	AggregateEvents(ctx context.Context, q AggregateQuery) ([]AggregateRow, error)
	// PurgeEvents deletes the events of orgID created before before and returns how many it
	// deleted (ClickHouse: how many matched when the deletion was issued).
	PurgeEvents(ctx context.Context, orgID string, before time.Time) (int64, error)
	// ExportEvents streams every event matching q after q.Cursor, in q's order (q.Limit and
	// q.Total are ignored), to emit in chunks of at most ExportChunk events. It reads the result
	// of one query as it arrives, so memory stays bounded whatever the range. emit must not keep
	// the slice; its error stops the export and is returned. A foreign cursor is ErrBadCursor.
	ExportEvents(ctx context.Context, q EventQuery, emit func([]events.Event) error) error
}

// ExportChunk is the most events EventLog.ExportEvents passes to emit at once.
const ExportChunk = 1000

// DeferredEventLog is an EventLog that can make appended events visible before they are
// durable, and say when they are: the event log writer (processors/eventlog) appends this way
// and commits a batch's Kafka offsets only once the store's durable mark has passed the batch,
// so a crash of the store that loses the batch finds it still uncommitted.
type DeferredEventLog interface {
	EventLog
	// AppendEventsDeferred stores events as AppendEvents does (idempotent by id, all or none)
	// and returns their mark: they are visible to queries at once, but a crash of the store may
	// lose them until the mark is Within what Durable returns.
	AppendEventsDeferred(ctx context.Context, events []events.Event) (DurableMark, error)
	// Durable returns how far appended events survive a crash of the store now. The store gets
	// there by itself, soon (Postgres: its WAL writer, within a second).
	Durable(ctx context.Context) (DurableMark, error)
}

// BatchedEventLog is an EventLog that says how many events the event log writer should take in
// one poll and append at once: its default Config.BatchSize. ClickHouse writes a part (and
// its projections' and hourly sums' parts) per insert and looks the batch's ids up once, so it
// wants fewer, larger appends than Postgres.
type BatchedEventLog interface {
	EventLog
	AppendBatch() int
}

// DurableMark places a deferred append in the order in which a DeferredEventLog makes appends
// durable. The zero mark is durable from the start.
type DurableMark struct {
	// Epoch is the store's incarnation when the append began (Postgres: the server's start
	// time). A restart since then may have lost what was not durable yet, and positions of
	// different incarnations do not compare.
	Epoch int64
	// Pos is how far the store must be durable for the append to be (Postgres: the WAL position
	// after its commit).
	Pos uint64
}

// Within reports whether an append that returned m is durable when the store is durable as far
// as now, and whether it may have been lost: the store restarted since the append began, so
// it must be appended again (the store is idempotent) before it can count as durable.
func (m DurableMark) Within(now DurableMark) (durable, mayBeLost bool) {
	switch {
	case m == DurableMark{}:
		return true, false
	case now == DurableMark{}: // nothing known of the store
		return false, false
	case m.Epoch != now.Epoch:
		return false, true
	default:
		return m.Pos <= now.Pos, false
	}
}

// Buckets of AggregateQuery.
const (
	BucketNone   = ""
	BucketMinute = "minute"
	BucketHour   = "hour"
	BucketDay    = "day"
)

// Groupings of AggregateQuery.
const (
	GroupNone     = ""
	GroupType     = "type"
	GroupSeverity = "severity"
	GroupProject  = "project"
	GroupStatus   = "status" // the payload's status (agent sessions, workflow runs)
)

// AggregateQuery selects events of an organization (or one of its projects) in [From, To) and
// groups them by time bucket and by a key.
type AggregateQuery struct {
	OrgID      string   // "" = any organization (platform operator)
	ProjectID  string   // "" = every project of OrgID
	Types      []string // patterns as in EventQuery.Types; empty = every type
	Severities []string // envelope severities; empty = every severity
	From, To   time.Time
	Bucket     string         // BucketNone, BucketMinute, BucketHour or BucketDay
	Location   *time.Location // the time zone buckets start in; nil = UTC
	GroupBy    string         // GroupNone, GroupType, GroupSeverity, GroupProject or GroupStatus
	// Latency adds percentiles of the payload's run time (latencyMs, durationMs or duration_ms)
	// over the events that carry one.
	Latency bool
	// Private, when set, keeps the payload values of events that may carry patient data out of
	// the answer, for a reader who may not see them: grouped by status such an event counts
	// under RedactedKey, and its run time is not measured.
	Private *Private
}

// Private says which events' payload values a statistics reader may not be given
// (AggregateQuery.Private): those of Types, and any other whose payload may name a patient (it
// mentions "patient" or "subject" in any letter case; in a store that keeps the payload as
// written, also one holding a \u escape, which could spell either), but for those of Open,
// whose status and run time are no patient data (a redacted event keeps them).
type Private struct {
	Types []string // types whose events always carry patient data
	Open  []string // types whose status and run time every reader may be given
}

// RedactedKey is the status group of the events whose status a reader may not be given
// (AggregateQuery.Private).
const RedactedKey = "(redacted)"

// AggregateRow is one group of AggregateEvents: its bucket's start (zero without buckets), its
// key (empty without grouping), how many events fell in it and, with Latency, how many carried
// a run time and its 50th, 90th and 99th percentiles (linear interpolation, as percentile_cont).
type AggregateRow struct {
	Bucket        time.Time
	Key           string
	Count         int64
	Measured      int64
	P50, P90, P99 float64
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
	Total     TotalMode // as in EventQuery
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
	// PurgeAudit deletes the records of orgID older than before, as PurgeEvents does. Callers
	// enforce the retention floor (AuditRetentionFloorYears); the store deletes what it is asked to.
	PurgeAudit(ctx context.Context, orgID string, before time.Time) (int64, error)
}

// AuditRetentionFloorYears is the shortest time audit records may be kept: HIPAA asks six years
// (45 CFR 164.316(b)(2)).
const AuditRetentionFloorYears = 6
