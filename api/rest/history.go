package rest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"carehub/api/envelope"
	"carehub/kernel/jsonwire"
	"carehub/kernel/phi"
	"carehub/processors/feed"
	"carehub/storage"
)

// EventsMeta is the meta of GET /v1/events: total as the query's total parameter asks (absent
// with total=none), totalEstimated with total=estimate, and the next page's cursor.
type EventsMeta struct {
	Total          *int64  `json:"total,omitempty"`
	TotalEstimated bool    `json:"totalEstimated,omitempty"`
	Cursor         *string `json:"cursor"`
}

// feedQuery reads the event-history parameters GET /v1/events and its export share; the error
// is a range whose from and since disagree.
func feedQuery(q *envelope.Query) (feed.Query, error) {
	from, err := q.From()
	fq := feed.Query{ProjectID: q.ProjectID(), Type: q.Str("type"), Types: q.List("types"),
		Since: from, To: q.Time("to"),
		PatientID: q.Str("patientId"), AgentID: q.Str("agentId"), WorkflowID: q.Str("workflowId"),
		DeploymentID: q.Str("deploymentId"), Cursor: q.Str("cursor")}
	fq.Ascending = q.Enum("order", "desc", "asc") == "asc"
	switch q.Enum("total", "exact", "estimate", "none") {
	case "estimate":
		fq.Total = storage.TotalEstimate
	case "none":
		fq.Total = storage.TotalNone
	}
	return fq, err
}

// queryErr is the 400 of q's parameters, else the range's.
func queryErr(q *envelope.Query, rangeErr error) error {
	if err := q.Err(); err != nil {
		return err
	}
	return rangeErr
}

// events is GET /v1/events: a project's events, newest first or oldest first, filtered by time
// range, types and type prefixes and the resources their payload names, keyset-paginated.
func (h *handlers) events(w http.ResponseWriter, r *http.Request) {
	q := envelope.NewQuery(r)
	fq, rangeErr := feedQuery(q)
	fq.Limit = q.Int("limit", 100, 1, 1000)
	if err := queryErr(q, rangeErr); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	page, err := h.eventPage(r, fq)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	data := make([]Event, len(page.Events))
	for i, e := range page.Events {
		data[i] = eventOf(e)
	}
	meta := EventsMeta{Cursor: optString(page.NextCursor), TotalEstimated: fq.Total == storage.TotalEstimate}
	if fq.Total != storage.TotalNone {
		meta.Total = &page.Total
	}
	envelope.WriteJSON(w, http.StatusOK, envelope.List[Event]{Data: data, Meta: meta})
}

// MaxPageBytes bounds the payloads of one GET /v1/events page: the page ends with the event
// that takes them to it, with the cursor of the next, however large limit is. Without it a
// page of 1000 events of 256 KiB was 250 MiB held in memory, and more as JSON.
const MaxPageBytes = 16 << 20

// pageChunk is how many events eventPage reads at a time.
const pageChunk = 100

// eventPage reads the page fq asks for pageChunk events at a time, and ends it early at the
// event whose payload takes the page to MaxPageBytes: memory holds at most that and one chunk
// (100 × 256 KiB) whatever the limit. The first chunk counts the total as fq asks; the others
// skip it.
func (h *handlers) eventPage(r *http.Request, fq feed.Query) (feed.Page, error) {
	limit, bytes := fq.Limit, 0
	page := feed.Page{Events: []phi.Event{}}
	for first := true; ; first = false {
		fq.Limit = min(pageChunk, limit-len(page.Events))
		chunk, err := h.s.Feed.Events(r.Context(), fq)
		if err != nil {
			return feed.Page{}, err
		}
		if first {
			page.Total = chunk.Total
		}
		for i, e := range chunk.Events {
			page.Events = append(page.Events, e)
			if bytes += len(e.Payload); bytes >= MaxPageBytes && (i < len(chunk.Events)-1 || chunk.NextCursor != "") {
				page.NextCursor = storage.EncodeCursor(e.CreatedAt, e.ID)
				return page, nil
			}
		}
		page.NextCursor = chunk.NextCursor
		if chunk.NextCursor == "" || len(page.Events) >= limit {
			return page, nil
		}
		fq.Cursor, fq.Total = chunk.NextCursor, storage.TotalNone
	}
}

// ExportedEvent is one line of an NDJSON event export: the event as GET /v1/events serves it and
// the cursor that resumes the export after it.
type ExportedEvent struct {
	Event
	Cursor string `json:"cursor"`
}

// AppendJSON appends the event's NDJSON line without reflection (envelope.LineAppender): the
// export writes one per event, and encoding/json's reflection and its two passes over each
// payload bounded it (FuzzExportedEventJSON holds it to json.Marshal).
func (e ExportedEvent) AppendJSON(b []byte) ([]byte, error) {
	if y := e.CreatedAt.Year(); y < 0 || y > 9999 || !validUTF8(e.ID, e.Type, e.ProjectID, e.Source, e.Severity, e.Cursor) {
		// Not what the log holds: let encoding/json say what it makes of it.
		out, err := json.Marshal(e)
		return append(b, out...), err
	}
	b = append(b, `{"id":`...)
	b = jsonwire.AppendString(b, e.ID)
	b = append(b, `,"type":`...)
	b = jsonwire.AppendString(b, e.Type)
	b = append(b, `,"projectId":`...)
	b = jsonwire.AppendString(b, e.ProjectID)
	b = append(b, `,"source":`...)
	b = jsonwire.AppendString(b, e.Source)
	b = append(b, `,"payload":`...)
	var err error
	if len(e.Payload) == 0 {
		b = append(b, "null"...)
	} else if b, err = jsonwire.AppendCompact(b, e.Payload); err != nil {
		return b, fmt.Errorf("event %s: payload: %w", e.ID, err)
	}
	b = append(b, `,"severity":`...)
	b = jsonwire.AppendString(b, e.Severity)
	b = append(b, `,"createdAt":"`...)
	b = e.CreatedAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	if e.Redacted {
		b = append(b, `,"redacted":true`...)
	}
	b = append(b, `,"cursor":`...)
	b = jsonwire.AppendString(b, e.Cursor)
	return append(b, '}'), nil
}

func validUTF8(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

var exportColumns = []string{"id", "type", "projectId", "source", "severity", "createdAt", "redacted", "payload", "cursor"}

// exportEvents is GET /v1/events/export: every event GET /v1/events would page through, streamed
// as NDJSON or CSV (gzip on request), each served through the PHI guard as the list serves it.
func (h *handlers) exportEvents(w http.ResponseWriter, r *http.Request) {
	q := envelope.NewQuery(r)
	fq, rangeErr := feedQuery(q)
	format, compress := envelope.ExportOptions(q, r)
	if err := queryErr(q, rangeErr); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	var out *envelope.Export
	err := h.s.Feed.Export(r.Context(), fq, func(ev phi.Event, cursor string) error {
		if out == nil {
			out = envelope.StartExport(w, "events-"+fq.ProjectID, format, compress, exportColumns)
		}
		e := eventOf(ev)
		return out.Write(ExportedEvent{Event: e, Cursor: cursor}, []string{e.ID, e.Type, e.ProjectID, e.Source, e.Severity,
			e.CreatedAt.Format(time.RFC3339Nano), strconv.FormatBool(e.Redacted), string(e.Payload), cursor})
	})
	if out == nil { // nothing streamed yet: an ordinary answer
		if err != nil {
			envelope.WriteError(w, r, err)
			return
		}
		out = envelope.StartExport(w, "events-"+fq.ProjectID, format, compress, exportColumns)
	}
	out.Close(err)
}

// StatsRow is one row of GET /v1/events/stats.
type StatsRow struct {
	Bucket   *time.Time `json:"bucket"`
	Key      string     `json:"key"`
	Count    int64      `json:"count"`
	Rate     float64    `json:"rate"`
	Measured *int64     `json:"measured,omitempty"`
	P50      *float64   `json:"p50,omitempty"`
	P90      *float64   `json:"p90,omitempty"`
	P99      *float64   `json:"p99,omitempty"`
}

// eventStats is GET /v1/events/stats: counts of an organization's (or a project's) events per
// time bucket and group, outcome rates, top-N and run-time percentiles (feed.Stats).
func (h *handlers) eventStats(w http.ResponseWriter, r *http.Request) {
	q := envelope.NewQuery(r)
	from, rangeErr := q.From()
	sq := feed.StatsQuery{OrgID: q.Str("organizationId"), ProjectID: q.Str("projectId"), Types: q.List("types"),
		Severities: q.List("severities"), From: from, To: q.Time("to"),
		Bucket: q.Enum("bucket", storage.BucketMinute, storage.BucketHour, storage.BucketDay), TimeZone: q.Str("timeZone"),
		GroupBy: q.Enum("groupBy", storage.GroupType, storage.GroupSeverity, storage.GroupProject, storage.GroupStatus),
		Latency: q.Enum("latency", "true", "false") == "true",
		Top:     q.Int("top", 0, 1, 1000)}
	if err := queryErr(q, rangeErr); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	rows, err := h.s.Feed.Stats(r.Context(), sq)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	data := make([]StatsRow, len(rows))
	for i, row := range rows {
		data[i] = StatsRow{Key: row.Key, Count: row.Count, Rate: row.Rate}
		if !row.Bucket.IsZero() {
			data[i].Bucket = &row.Bucket
		}
		if sq.Latency {
			data[i].Measured, data[i].P50, data[i].P90, data[i].P99 = &row.Measured, &row.P50, &row.P90, &row.P99
		}
	}
	envelope.WriteJSON(w, http.StatusOK, envelope.List[StatsRow]{Data: data})
}
