package clickhouse_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"carehub/kernel/events"
	"carehub/kernel/ids"
	"carehub/storage"
	"carehub/storage/clickhouse"
	"carehub/storage/clickhouse/chtest"
)

// The benchmarks need a server (CAREHUB_CLICKHOUSE_URL, `make clickhouse-up`):
//
//	CAREHUB_CLICKHOUSE_URL=$(deploy/local/clickhouse/clickhouse.sh url) \
//	  go test -run '^$' -bench . -benchtime 200x ./storage/clickhouse/
//
// Query benchmarks report p50 and p99 latency besides the mean (ns/op), and the rows the server
// read per query (count and page); append benchmarks report rows/s.

var benchBase = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func benchEvent(r *rand.Rand, org, project, typ string, at time.Time) events.Event {
	return events.Event{
		ID: ids.At(ids.Event, at, randReader{r}), Type: typ, OrgID: org, ProjectID: project,
		Source: "workflow", Severity: "info", CreatedAt: at,
		Payload: json.RawMessage(fmt.Sprintf(`{"runId":"run_%08d","status":"completed","durationMs":%d,"steps":[{"name":"score","ok":true}]}`,
			r.IntN(1e8), r.IntN(60000))),
	}
}

type randReader struct{ r *rand.Rand }

func (rr randReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(rr.r.Uint32())
	}
	return len(p), nil
}

func BenchmarkAppendEvents(b *testing.B) {
	for _, tc := range []struct{ batch, writers int }{{1, 1}, {100, 1}, {5000, 1}, {5000, 4}, {20000, 1}} {
		b.Run(fmt.Sprintf("batch=%d/writers=%d", tc.batch, tc.writers), func(b *testing.B) {
			store := newStore(b)
			r := rand.New(rand.NewPCG(1, 2))
			batches := make([][]events.Event, tc.writers)
			for w := range batches {
				for i := range tc.batch {
					batches[w] = append(batches[w], benchEvent(r, "org_bench", fmt.Sprintf("prj_%d", w), "workflow.completed",
						benchBase.Add(time.Duration(i)*time.Millisecond)))
				}
			}
			ctx := context.Background()
			b.ResetTimer()
			for b.Loop() {
				var wg sync.WaitGroup
				for _, batch := range batches {
					wg.Go(func() {
						if err := store.AppendEvents(ctx, batch); err != nil {
							b.Error(err)
						}
					})
				}
				wg.Wait()
			}
			b.ReportMetric(float64(b.N*tc.batch*tc.writers)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// eventData is the query benchmarks' event log: one busy project of 300,000 events over six
// months (20 types, one of them 1%), 40 small projects of 5,000 in 4 organizations, written in
// writer-sized batches, with 1% of the busy project's batches delivered twice.
type eventData struct {
	store              *clickhouse.Store
	url                string // the store's database, for the analysts' SQL
	busyOrg, busy      string
	smallOrg, small    string
	middle             events.Event // an event half-way down the busy project
	rareType, someType string
	loadRate           float64 // rows/s while loading
}

func loadEventData(b *testing.B) *eventData {
	url := chtest.NewURL(b)
	d := &eventData{store: newStoreAt(b, url), url: url, busyOrg: "org_busy", busy: "prj_busy", rareType: "agent.run.failed",
		someType: "type.07"}
	r := rand.New(rand.NewPCG(3, 4))
	const busyN, smallN, smallProjects, batch = 300_000, 5_000, 40, 5_000
	span := 182 * 24 * time.Hour
	var all [][]events.Event
	var busy []events.Event
	for i := range busyN {
		typ := fmt.Sprintf("type.%02d", r.IntN(19))
		if r.IntN(100) == 0 {
			typ = d.rareType
		}
		busy = append(busy, benchEvent(r, d.busyOrg, d.busy, typ, benchBase.Add(span/busyN*time.Duration(i))))
	}
	for i := 0; i < len(busy); i += batch {
		all = append(all, busy[i:min(i+batch, len(busy))])
		if r.IntN(100) == 0 {
			all = append(all, busy[i:min(i+batch, len(busy))]) // redelivered
		}
	}
	for p := range smallProjects {
		org, project := fmt.Sprintf("org_%d", p%4), fmt.Sprintf("prj_small_%02d", p)
		var evs []events.Event
		for i := range smallN {
			evs = append(evs, benchEvent(r, org, project, fmt.Sprintf("type.%02d", r.IntN(19)), benchBase.Add(span/smallN*time.Duration(i))))
		}
		all = append(all, evs)
		d.smallOrg, d.small = org, project
	}
	slices.SortFunc(busy, func(a, b events.Event) int { return b.CreatedAt.Compare(a.CreatedAt) })
	d.middle = busy[len(busy)/2]
	ctx := context.Background()
	start, rows := time.Now(), 0
	for _, evs := range all {
		if err := d.store.AppendEvents(ctx, evs); err != nil {
			b.Fatal(err)
		}
		rows += len(evs)
	}
	d.loadRate = float64(rows) / time.Since(start).Seconds()
	return d
}

func BenchmarkQueryEvents(b *testing.B) {
	d := loadEventData(b)
	b.Logf("loaded at %.0f rows/s", d.loadRate)
	cursor := storage.EncodeCursor(d.middle.CreatedAt, d.middle.ID)
	for _, tc := range []struct {
		name string
		q    storage.EventQuery
	}{
		{"busy/first page", storage.EventQuery{OrgID: d.busyOrg, ProjectID: d.busy}},
		{"busy/middle page", storage.EventQuery{OrgID: d.busyOrg, ProjectID: d.busy, Cursor: cursor}},
		{"busy/type 5%", storage.EventQuery{OrgID: d.busyOrg, ProjectID: d.busy, Type: d.someType}},
		{"busy/type 1%", storage.EventQuery{OrgID: d.busyOrg, ProjectID: d.busy, Type: d.rareType}},
		{"busy/last week", storage.EventQuery{OrgID: d.busyOrg, ProjectID: d.busy, Since: benchBase.Add(175 * 24 * time.Hour)}},
		{"busy/operator", storage.EventQuery{ProjectID: d.busy}},
		{"small/first page", storage.EventQuery{OrgID: d.smallOrg, ProjectID: d.small}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			measureQuery(b, func(ctx context.Context) error {
				page, err := d.store.QueryEvents(ctx, tc.q)
				if err == nil && len(page.Events) == 0 {
					err = errors.New("empty page")
				}
				return err
			})
		})
	}
}

// BenchmarkAnalystQueries runs the analysts' query shapes (issue 17) on the same data: counts per
// type per time bucket over a project or an organization, top types, a type-prefix page. They
// are SQL here, not store calls, so that the schema is measured before the store has them.
func BenchmarkAnalystQueries(b *testing.B) {
	d := loadEventData(b)
	conn := openConn(b, d.url)
	month, week := benchBase.Add(90*24*time.Hour), benchBase.Add(175*24*time.Hour)
	for _, tc := range []struct {
		name, sql string
		args      []any
	}{
		{"busy/hourly counts by type, a month", `SELECT toStartOfHour(created_at) AS h, type, count() FROM event_log
WHERE org_id = ? AND project_id = ? AND created_at >= ? AND created_at < ? GROUP BY h, type`,
			[]any{d.busyOrg, d.busy, month, month.Add(30 * 24 * time.Hour)}},
		{"busy/daily counts of one type, six months", `SELECT toDate(created_at) AS d, count() FROM event_log
WHERE org_id = ? AND project_id = ? AND type = ? GROUP BY d`, []any{d.busyOrg, d.busy, d.rareType}},
		{"busy/top types, last week", `SELECT type, count() AS n FROM event_log
WHERE org_id = ? AND project_id = ? AND created_at >= ? GROUP BY type ORDER BY n DESC LIMIT 10`, []any{d.busyOrg, d.busy, week}},
		{"org/daily counts by type, six months", `SELECT toDate(created_at) AS d, type, count() FROM event_log
WHERE org_id = ? GROUP BY d, type`, []any{d.smallOrg}},
		{"busy/type prefix page", `SELECT id, type, payload, created_at FROM event_log
WHERE org_id = ? AND project_id = ? AND startsWith(type, 'agent.') ORDER BY created_at DESC, id DESC LIMIT 101`,
			[]any{d.busyOrg, d.busy}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			measureQuery(b, func(ctx context.Context) error {
				rs, err := conn.Query(ctx, tc.sql, tc.args...)
				if err != nil {
					return err
				}
				defer func() { _ = rs.Close() }()
				n := 0
				for rs.Next() {
					n++
				}
				if err == nil && n == 0 {
					err = errors.New("no rows")
				}
				return cmp.Or(rs.Err(), err)
			})
		})
	}
}

// measureQuery runs query b.N times and reports its latency (p50, p99 besides the mean) and the
// rows and bytes the server read per query: what a query costs, whatever else the machine is doing.
func measureQuery(b *testing.B, query func(ctx context.Context) error) {
	var rows, bytes atomic.Uint64
	ctx := ch.Context(context.Background(), ch.WithProgress(func(p *ch.Progress) {
		rows.Add(p.Rows)
		bytes.Add(p.Bytes)
	}))
	var lat []time.Duration
	for b.Loop() {
		t0 := time.Now()
		err := query(ctx)
		lat = append(lat, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
	}
	reportLatency(b, lat)
	b.ReportMetric(float64(rows.Load())/float64(b.N), "rows-read/op")
	b.ReportMetric(float64(bytes.Load())/float64(b.N)/1e6, "MB-read/op")
}

func reportLatency(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds())/1000, "p99-ms")
}
