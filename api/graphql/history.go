package graphql

import (
	"context"
	"math"
	"strings"
	"time"

	gql "github.com/graph-gophers/graphql-go"

	"carehub/kernel/fault"
	"carehub/processors/feed"
	"carehub/storage"
)

// Analysts' queries (docs/ANALYSTS.md): eventHistory and eventStats serve what GET /v1/events and
// GET /v1/events/stats serve, through the same feed service.

type eventHistoryArgs struct {
	ProjectID                                    gql.ID
	From, Since, To                              *DateTime
	Types                                        *[]string
	PatientID, AgentID, WorkflowID, DeploymentID *gql.ID
	Order                                        *string
	Limit                                        *int32
	After                                        *string
	Total                                        *string
}

func (q *queryResolver) EventHistory(ctx context.Context, args eventHistoryArgs) (*eventPageResolver, error) {
	limit, err := limitArg(args.Limit, DefaultLimit, MaxLimit)
	if err != nil {
		return nil, err
	}
	from, err := fromArg(args.From, args.Since)
	if err != nil {
		return nil, err
	}
	fq := feed.Query{ProjectID: string(args.ProjectID), Since: from, To: timeArg(args.To),
		PatientID: idArg(args.PatientID), AgentID: idArg(args.AgentID), WorkflowID: idArg(args.WorkflowID),
		DeploymentID: idArg(args.DeploymentID), Ascending: str(args.Order) == "OLDEST_FIRST",
		Total: totalModes[str(args.Total)], Limit: limit, Cursor: str(args.After)}
	if args.Types != nil {
		fq.Types = *args.Types
	}
	page, err := q.eventPage(ctx, fq, "events.payload")
	if err != nil {
		return nil, err
	}
	return &eventPageResolver{page: page, mode: fq.Total}, nil
}

// eventPage fetches a page of events for a list field whose selection names their payload at
// payloadPath. Payloads are the large values of an event list: one page is fetched at a time per
// operation, and its payloads are charged to the answer-size budget before the next may be
// fetched (answer.go), so that aliases cannot hold many pages at once.
func (q *queryResolver) eventPage(ctx context.Context, fq feed.Query, payloadPath string) (feed.Page, error) {
	release, err := holdFetch(ctx)
	if err != nil {
		return feed.Page{}, err
	}
	defer release()
	page, err := q.s.Feed.Events(ctx, fq)
	if err != nil || !gql.HasSelectedField(ctx, payloadPath) {
		return page, err
	}
	for i := range page.Events {
		if err := charge(ctx, encodedSize(page.Events[i].Payload)); err != nil {
			return feed.Page{}, err
		}
	}
	return page, nil
}

// totalModes maps EventTotal to the store's modes; EXACT (or none given) is the zero mode.
var totalModes = map[string]storage.TotalMode{"ESTIMATE": storage.TotalEstimate, "NONE": storage.TotalNone}

type eventPageResolver struct {
	page feed.Page
	mode storage.TotalMode
}

func (r *eventPageResolver) Events() []*eventResolver {
	out := make([]*eventResolver, len(r.page.Events))
	for i := range r.page.Events {
		out[i] = &eventResolver{&r.page.Events[i]}
	}
	return out
}

func (r *eventPageResolver) Total() *int32 {
	if r.mode == storage.TotalNone {
		return nil
	}
	n := int32(min(r.page.Total, math.MaxInt32))
	return &n
}

func (r *eventPageResolver) TotalEstimated() bool { return r.mode == storage.TotalEstimate }

func (r *eventPageResolver) NextCursor() *string {
	if r.page.NextCursor == "" {
		return nil
	}
	return &r.page.NextCursor
}

type eventStatsArgs struct {
	OrganizationID, ProjectID *gql.ID
	From                      DateTime
	To                        *DateTime
	Types, Severities         *[]string
	Bucket                    *string
	TimeZone                  *string
	GroupBy                   *string
	Latency                   *bool
	Top                       *int32
}

func (q *queryResolver) EventStats(ctx context.Context, args eventStatsArgs) ([]*statsRowResolver, error) {
	sq := feed.StatsQuery{OrgID: idArg(args.OrganizationID), ProjectID: idArg(args.ProjectID), From: args.From.Time,
		To: timeArg(args.To), Bucket: strings.ToLower(str(args.Bucket)), TimeZone: str(args.TimeZone),
		GroupBy: strings.ToLower(str(args.GroupBy)), Latency: args.Latency != nil && *args.Latency}
	if args.Types != nil {
		sq.Types = *args.Types
	}
	if args.Severities != nil {
		sq.Severities = *args.Severities
	}
	if args.Top != nil {
		top, err := limitArg(args.Top, 0, 1000)
		if err != nil {
			return nil, err
		}
		sq.Top = top
	}
	rows, err := q.s.Feed.Stats(ctx, sq)
	if err != nil {
		return nil, err
	}
	out := make([]*statsRowResolver, len(rows))
	for i := range rows {
		out[i] = &statsRowResolver{&rows[i], sq.Latency}
	}
	return out, nil
}

type statsRowResolver struct {
	r       *feed.StatsRow
	latency bool
}

func (r *statsRowResolver) Bucket() *DateTime {
	if r.r.Bucket.IsZero() {
		return nil
	}
	d := dateTime(r.r.Bucket)
	return &d
}

func (r *statsRowResolver) Key() string   { return r.r.Key }
func (r *statsRowResolver) Count() int32  { return int32(min(r.r.Count, math.MaxInt32)) }
func (r *statsRowResolver) Rate() float64 { return r.r.Rate }

func (r *statsRowResolver) Measured() *int32 {
	if !r.latency {
		return nil
	}
	n := int32(min(r.r.Measured, math.MaxInt32))
	return &n
}

func (r *statsRowResolver) P50() *float64 { return r.percentile(r.r.P50) }
func (r *statsRowResolver) P90() *float64 { return r.percentile(r.r.P90) }
func (r *statsRowResolver) P99() *float64 { return r.percentile(r.r.P99) }

func (r *statsRowResolver) percentile(v float64) *float64 {
	if !r.latency {
		return nil
	}
	return &v
}

// fromArg is the inclusive start of a time range: from, or since, which every field with a range
// takes as its synonym (DECISIONS §8). Both given must name the same time.
func fromArg(from, since *DateTime) (time.Time, error) {
	f, s := timeArg(from), timeArg(since)
	if !f.IsZero() && !s.IsZero() && !f.Equal(s) {
		return f, fault.Invalid("since is a synonym of from; give one of them (or both equal)")
	}
	if f.IsZero() {
		return s, nil
	}
	return f, nil
}

func timeArg(t *DateTime) (out time.Time) {
	if t != nil {
		out = t.Time
	}
	return out
}

func idArg(id *gql.ID) string {
	if id == nil {
		return ""
	}
	return string(*id)
}
