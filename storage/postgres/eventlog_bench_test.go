package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/internal/testenv"
	"carehub/kernel/events"
	"carehub/kernel/ids"
	"carehub/storage"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

// benchPayload is the size and shape of a typical event payload (a deployment transition).
var benchPayload = json.RawMessage(`{"deploymentId":"dep_01jd7x8m3k2q9r5t6v7w8x9y0z","installationId":"ins_01jd7x8m3k2q9r5t6v7w8x9y0z","from":"RUNNING","to":"DEGRADED","reason":"replica 2 failed its health check"}`)

var benchTypes = []string{"deployment.status_changed", "agent.run_completed", "agent.run.failed", "agent.session.updated",
	"workflow.run.updated", "workflow.run.completed", "workflow.completed", "device.observation_received",
	"diagnostic.result_ready", "asset.installed"}

func benchEvents(n int, project func(i int) string, at func(i int) time.Time) []events.Event {
	evs := make([]events.Event, n)
	for i := range evs {
		p := project(i)
		evs[i] = events.Event{
			ID:        ids.New(ids.Event),
			Type:      benchTypes[i%len(benchTypes)],
			OrgID:     "org_" + p,
			ProjectID: p,
			Source:    "deployment",
			Severity:  "info",
			Payload:   benchPayload,
			CreatedAt: at(i),
		}
	}
	return evs
}

// BenchmarkAppendEvents measures AppendEvents' throughput per batch size and path (the COPY
// through a staging table, the COPY straight in, the unnest insert, and AppendEvents itself,
// which picks one by size). The test server runs with fsync and synchronous_commit off, so
// these are upper bounds of what a durable server does; the relative order of the paths is what
// picks copyThreshold, together with what the loaded node's log writer does (docs/PERFORMANCE.md).
//
//	go test ./storage/postgres -run '^$' -bench AppendEvents -benchtime 20x
func BenchmarkAppendEvents(b *testing.B) {
	paths := []struct {
		name   string
		append func(*postgres.EventLog, context.Context, []events.Event) error
	}{
		{"copy", (*postgres.EventLog).AppendEventsCopy},
		{"copynew", (*postgres.EventLog).AppendEventsCopyNew},
		{"unnest", (*postgres.EventLog).AppendEventsUnnest},
		{"AppendEvents", (*postgres.EventLog).AppendEvents},
	}
	for _, size := range []int{10, 30, 100, 300, 1000, 5000} {
		for _, path := range paths {
			b.Run(fmt.Sprintf("batch=%d/%s", size, path.name), func(b *testing.B) {
				log := postgres.NewEventLog(pgtest.New(b))
				ctx := context.Background()
				now := time.Now()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					b.StopTimer()
					evs := benchEvents(size, func(j int) string { return fmt.Sprintf("prj_%d", j%50) },
						func(j int) time.Time { return now.Add(time.Duration(i*size+j) * time.Microsecond) })
					b.StartTimer()
					if err := path.append(log, ctx, evs); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "events/s")
			})
		}
	}
}

// BenchmarkAppendEventsRedelivered measures a batch that is entirely stored already (the
// eventlog writer after a rebalance or crash): the conflict path.
func BenchmarkAppendEventsRedelivered(b *testing.B) {
	log := postgres.NewEventLog(pgtest.New(b))
	ctx := context.Background()
	now := time.Now()
	evs := benchEvents(5000, func(j int) string { return fmt.Sprintf("prj_%d", j%50) },
		func(j int) time.Time { return now.Add(time.Duration(j) * time.Microsecond) })
	if err := log.AppendEvents(ctx, evs); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if err := log.AppendEvents(ctx, evs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(evs))/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkQueryEvents1M loads 1,000,000 events with AppendEvents and measures QueryEvents
// latency (p50 and p99 in ms, page and total together, as GET /v1/events asks for them) for
// the shapes the API issues. It is gated because the load takes a while:
//
//	CAREHUB_BENCH_1M=1 go test ./storage/postgres -run '^$' -bench QueryEvents1M -benchtime 200x -timeout 30m
//
// The data: 200 projects of 200 organizations over 30 days; one busy project (prj_hot) holds
// 400,000 events, the others about 3,000 each.
func BenchmarkQueryEvents1M(b *testing.B) {
	if os.Getenv("CAREHUB_BENCH_1M") == "" {
		b.Skip("set CAREHUB_BENCH_1M=1 to load 1M events and measure QueryEvents")
	}
	pool := pgtest.New(b)
	log := postgres.NewEventLog(pool)
	ctx := context.Background()
	const total, batch = 1_000_000, 5000
	end := time.Now().UTC().Truncate(time.Second)
	span := 30 * 24 * time.Hour
	rng := rand.New(rand.NewPCG(1, 2))
	project := func(int) string {
		if rng.IntN(10) < 4 {
			return "prj_hot"
		}
		return fmt.Sprintf("prj_%03d", rng.IntN(199))
	}
	step := span / total
	loadStart := time.Now()
	for n := 0; n < total; n += batch {
		evs := benchEvents(batch, project, func(j int) time.Time {
			return end.Add(-step * time.Duration(total-n-j)).Add(time.Duration(rng.IntN(1000)) * time.Microsecond)
		})
		if err := log.AppendEvents(ctx, evs); err != nil {
			b.Fatal(err)
		}
	}
	load := time.Since(loadStart)
	b.Logf("loaded %d events in %s: %.0f events/s", total, load.Round(time.Millisecond), total/load.Seconds())
	// Two passes: the first sets hint bits, the second the visibility map (see TestQueryEventsPlans).
	for _, sql := range []string{"checkpoint", "vacuum analyze event_log", "vacuum event_log"} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	pool.Reset()
	logSizes(b, pool)
	explain(b, pool, "select count(*) from event_log where project_id = 'prj_hot' and org_id = 'org_prj_hot'")
	explain(b, pool, "select * from event_log where project_id = 'prj_hot' and org_id = 'org_prj_hot' order by created_at desc, id desc limit 101")

	first, err := log.QueryEvents(ctx, storage.EventQuery{OrgID: "org_prj_hot", ProjectID: "prj_hot", Limit: 100})
	if err != nil {
		b.Fatal(err)
	}
	mid := postgres.EncodeCursor(end.Add(-span/2), "evt_~") // the middle of the 30 days
	shapes := []struct {
		name string
		q    storage.EventQuery
	}{
		{"busy project/first page", storage.EventQuery{OrgID: "org_prj_hot", ProjectID: "prj_hot", Limit: 100}},
		{"busy project/next page", storage.EventQuery{OrgID: "org_prj_hot", ProjectID: "prj_hot", Limit: 100, Cursor: first.NextCursor}},
		{"busy project/page at half", storage.EventQuery{OrgID: "org_prj_hot", ProjectID: "prj_hot", Limit: 100, Cursor: mid}},
		{"busy project/type", storage.EventQuery{OrgID: "org_prj_hot", ProjectID: "prj_hot", Type: "agent.run.failed", Limit: 100}},
		{"busy project/since 1h", storage.EventQuery{OrgID: "org_prj_hot", ProjectID: "prj_hot", Since: end.Add(-time.Hour), Limit: 100}},
		{"busy project/since 7d", storage.EventQuery{OrgID: "org_prj_hot", ProjectID: "prj_hot", Since: end.Add(-7 * 24 * time.Hour), Limit: 100}},
		{"small project/first page", storage.EventQuery{OrgID: "org_prj_042", ProjectID: "prj_042", Limit: 100}},
		{"small project/type", storage.EventQuery{OrgID: "org_prj_042", ProjectID: "prj_042", Type: "workflow.completed", Limit: 100}},
		{"operator/busy project", storage.EventQuery{ProjectID: "prj_hot", Limit: 100}},
	}
	for _, s := range shapes {
		b.Run(s.name, func(b *testing.B) {
			var lat []time.Duration
			var page storage.EventPage
			for b.Loop() {
				t0 := time.Now()
				p, err := log.QueryEvents(ctx, s.q)
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
				page = p
			}
			slices.Sort(lat)
			b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
			b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
			b.ReportMetric(float64(page.Total), "total")
		})
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func logSizes(b *testing.B, pool *pgxpool.Pool) {
	rows, err := pool.Query(context.Background(), `select relname, pg_size_pretty(pg_relation_size(oid))
from pg_class where relname like 'event_log%' order by relname`)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, size string
		if err := rows.Scan(&name, &size); err != nil {
			b.Fatal(err)
		}
		b.Logf("%s: %s", name, size)
	}
}

func explain(b *testing.B, pool *pgxpool.Pool, sql string) {
	rows, err := pool.Query(context.Background(), "explain (analyze, buffers) "+sql)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	b.Logf("%s:", sql)
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			b.Fatal(err)
		}
		b.Logf("  %s", line)
	}
}

// BenchmarkAppendEventsDurable measures the event log writer's append on a durable server (a
// local cluster as carehub serve runs it: fsync and synchronous_commit on): AppendEvents, which
// waits for each batch's WAL to reach disk, against AppendEventsDeferred, which does not (the
// writer commits the batch's offsets once Durable has passed it). Gated, as it starts a cluster
// of its own:
//
//	CAREHUB_BENCH_DURABLE=1 go test ./storage/postgres -run '^$' -bench AppendEventsDurable -benchtime 100x
func BenchmarkAppendEventsDurable(b *testing.B) {
	if os.Getenv("CAREHUB_BENCH_DURABLE") == "" {
		b.Skip("set CAREHUB_BENCH_DURABLE=1 to start a durable cluster and measure appends on it")
	}
	l, _ := startLocal(b, testenv.ClusterDir(b), postgres.LocalConfig{Attached: true})
	ctx := context.Background()
	pool, err := postgres.Connect(ctx, l.DSN("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := postgres.Migrate(ctx, pool, nil); err != nil {
		b.Fatal(err)
	}
	log := postgres.NewEventLog(pool)
	appends := map[string]func(context.Context, []events.Event) error{
		"AppendEvents": log.AppendEvents,
		"AppendEventsDeferred": func(ctx context.Context, evs []events.Event) error {
			_, err := log.AppendEventsDeferred(ctx, evs)
			return err
		},
	}
	for _, size := range []int{10, 1000, 5000} {
		for _, name := range []string{"AppendEvents", "AppendEventsDeferred"} {
			b.Run(fmt.Sprintf("batch=%d/%s", size, name), func(b *testing.B) {
				now := time.Now()
				for i := 0; b.Loop(); i++ {
					b.StopTimer()
					evs := benchEvents(size, func(j int) string { return fmt.Sprintf("prj_%d", j%50) },
						func(j int) time.Time { return now.Add(time.Duration(i*size+j) * time.Microsecond) })
					b.StartTimer()
					if err := appends[name](ctx, evs); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "events/s")
			})
		}
	}
}
