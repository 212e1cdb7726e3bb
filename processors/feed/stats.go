package feed

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/phi"
	"carehub/storage"
)

// MaxBuckets bounds how many time buckets one statistics query may span (a week of minutes is
// 10,080).
const MaxBuckets = 10_080

var bucketWidth = map[string]time.Duration{
	storage.BucketMinute: time.Minute,
	storage.BucketHour:   time.Hour,
	storage.BucketDay:    24 * time.Hour,
}

// StatsQuery asks for counts of the events of an organization or one of its projects in
// [From, To), per time bucket and group. OrgID "" is the caller's organization (the platform
// operator must name one or a project). TimeZone is an IANA name ("" = UTC) buckets start in.
// Top > 0 keeps the Top largest groups (without buckets only).
type StatsQuery struct {
	OrgID, ProjectID string
	Types            []string
	Severities       []string
	From, To         time.Time
	Bucket           string
	TimeZone         string
	GroupBy          string
	Latency          bool
	Top              int
}

// StatsRow is one group of Stats: the store's row and its share of its bucket's events.
type StatsRow struct {
	storage.AggregateRow
	Rate float64 // Count / the bucket's count of every group
}

// Stats answers q: counts per type, severity, project or payload status per minute, hour or day
// (in a time zone), top-N types, outcome rates (GroupBy status: the share of each status) and
// run-time percentiles (Latency). Any valid credential may ask, for its own organization; one
// that does not see all patient data (phi.Reader.SeesAll) is not grouped by the statuses, nor
// measured by the run times, of events that carry patient data (phi.StatsPrivate): a status is
// a payload value, which a free-form event about a patient fills as it likes.
func (s *Service) Stats(ctx context.Context, q StatsQuery) ([]StatsRow, error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return nil, err
	}
	aq, err := s.statsQuery(ctx, p, q)
	if err != nil {
		return nil, err
	}
	rows, err := s.log.AggregateEvents(ctx, aq)
	if err != nil {
		return nil, fmt.Errorf("event statistics: %w", err)
	}
	totals := map[time.Time]int64{}
	for _, r := range rows {
		totals[r.Bucket] += r.Count
	}
	out := make([]StatsRow, len(rows))
	for i, r := range rows {
		out[i] = StatsRow{AggregateRow: r, Rate: float64(r.Count) / float64(totals[r.Bucket])}
	}
	if q.Top > 0 {
		slices.SortStableFunc(out, func(a, b StatsRow) int { return cmp.Compare(b.Count, a.Count) })
		out = out[:min(q.Top, len(out))]
	}
	return out, nil
}

func (s *Service) statsQuery(ctx context.Context, p *access.Principal, q StatsQuery) (storage.AggregateQuery, error) {
	bad := map[string]string{}
	if q.From.IsZero() {
		bad["from"] = "is required"
	}
	if q.To.IsZero() {
		q.To = time.Now().UTC()
	}
	if !q.From.IsZero() && !q.To.After(q.From) {
		bad["to"] = "must be after from"
	}
	loc := time.UTC
	if q.TimeZone != "" {
		var err error
		if loc, err = time.LoadLocation(q.TimeZone); err != nil || q.TimeZone == "Local" {
			bad["timeZone"] = "must be an IANA time zone such as Europe/Paris or UTC"
		}
	}
	if w, ok := bucketWidth[q.Bucket]; ok && !q.From.IsZero() && q.To.Sub(q.From)/w > MaxBuckets {
		bad["bucket"] = fmt.Sprintf("spans more than %d buckets over this range: use a coarser bucket or a shorter range", MaxBuckets)
	}
	if q.Top > 0 && q.Bucket != storage.BucketNone {
		bad["top"] = "applies to totals over the range: leave bucket out"
	}
	if err := checkPatterns(q.Types); err != nil {
		return storage.AggregateQuery{}, err
	}
	if len(bad) > 0 {
		return storage.AggregateQuery{}, fault.Validation("invalid statistics query", bad)
	}
	orgID := q.OrgID
	switch {
	case q.ProjectID != "":
		projectOrg, err := s.projects.Lookup(ctx, s.pool, p, q.ProjectID)
		if err != nil {
			return storage.AggregateQuery{}, err
		}
		if orgID != "" && orgID != projectOrg {
			return storage.AggregateQuery{}, fault.NotFound("project", q.ProjectID)
		}
		orgID = projectOrg
	case orgID == "" && p.Platform:
		return storage.AggregateQuery{}, fault.Validation("invalid statistics query",
			map[string]string{"organizationId": "the platform operator names an organization or a project"})
	case orgID == "":
		orgID = p.OrgID
	case !p.SeesOrg(orgID):
		return storage.AggregateQuery{}, fault.NotFound("organization", orgID)
	}
	aq := storage.AggregateQuery{OrgID: orgID, ProjectID: q.ProjectID, Types: q.Types, Severities: q.Severities,
		From: q.From, To: q.To, Bucket: q.Bucket, Location: loc, GroupBy: q.GroupBy, Latency: q.Latency}
	if !phi.ReaderOf(p).SeesAll() {
		types, open := phi.StatsPrivate()
		aq.Private = &storage.Private{Types: types, Open: open}
	}
	return aq, nil
}
