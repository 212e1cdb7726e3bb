// Command analystload loads an event log with a synthetic history at scale and measures the
// analysts' query shapes on it: keyset pages (first, deep, by type prefix, by patient), counts
// per type per hour, organization-wide day counts, top-N types, outcome rates, run-time
// percentiles, and the export rate (one streamed query, as GET /v1/events/export reads). It
// talks to the store directly (storage.EventLog), so it measures the store, not HTTP.
//
//	analystload -store clickhouse -url clickhouse://127.0.0.1:29000/bench -events 100000000
//	analystload -store postgres -pg-dir /tmp/analysts-pg -events 10000000
//	analystload -store postgres -url postgres://…/bench -events 1000000
//
// The server generates the events itself (events.clickhouse.sql: INSERT … SELECT … FROM
// numbers(N); events.postgres.sql: generate_series), -chunk events per statement. The history:
// -orgs organizations of -projects projects each plus a busy project (prj_bench000_00) holding
// -busy percent of all events; -days days ending 2026-06-01, in time order; the event catalogue's
// types in realistic proportions (device observations of 10,000 patients per organization,
// agent sessions completed, failed and updated with a latency, workflow runs with a duration in
// both payload shapes, diagnostic alerts of three severities, deployment, webhook and asset
// changes). -pg-dir starts (or reuses) a local Postgres cluster in that directory through
// storage/postgres.StartLocal (as the postgres user; fsync off: a throwaway bench cluster) and
// -pg-stop stops it at the end. -skip-load measures an already loaded store. The report is a
// Markdown table of p50/p99 per shape (-reps runs each) on stdout.
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/jackc/pgx/v5"

	"carehub/kernel/events"
	"carehub/storage"
	"carehub/storage/clickhouse"
	"carehub/storage/postgres"
)

// end is the fixed end of the generated history (events.*.sql), so runs are comparable.
var end = time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)

var (
	//go:embed events.clickhouse.sql
	clickhouseEvents string
	//go:embed events.postgres.sql
	postgresEvents string
)

type config struct {
	store, url, pgDir, match                     string
	events, chunk, from                          int
	orgs, projects, days, busy, reps, exportRows int
	skipLoad, pgStop                             bool
}

func main() {
	var c config
	flag.StringVar(&c.store, "store", "clickhouse", "clickhouse or postgres")
	flag.StringVar(&c.url, "url", "", "the store's URL (postgres: or -pg-dir)")
	flag.StringVar(&c.pgDir, "pg-dir", "", "postgres: start (or reuse) a local cluster in this directory")
	flag.BoolVar(&c.pgStop, "pg-stop", false, "postgres: stop the -pg-dir cluster at the end")
	flag.IntVar(&c.events, "events", 1_000_000, "events to load")
	flag.IntVar(&c.chunk, "chunk", 10_000_000, "events generated per statement")
	flag.IntVar(&c.from, "from", 0, "resume an interrupted load at this event (a multiple of -chunk)")
	flag.IntVar(&c.orgs, "orgs", 50, "organizations")
	flag.IntVar(&c.projects, "projects", 10, "projects per organization")
	flag.IntVar(&c.days, "days", 180, "days of history")
	flag.IntVar(&c.busy, "busy", 10, "percent of the events in the busy project")
	flag.IntVar(&c.reps, "reps", 50, "runs of each query shape")
	flag.IntVar(&c.exportRows, "export", 2_000_000, "most events the export measure reads")
	flag.BoolVar(&c.skipLoad, "skip-load", false, "measure the store as it is")
	flag.StringVar(&c.match, "match", "", "measure only the shapes whose name contains this (\"export\": the export only)")
	flag.Parse()
	if (c.url == "") == (c.pgDir == "") || (c.pgDir != "" && c.store != "postgres") || c.events < 1 || c.events > 1_000_000_000 ||
		c.chunk < 1 || c.from < 0 || c.from >= c.events || c.orgs < 1 || c.projects < 1 || c.days < 1 || c.busy < 0 || c.busy > 100 || c.reps < 1 {
		flag.Usage()
		os.Exit(2)
	}
	ctx := context.Background()
	var l storage.EventLog
	var load func(from, n int) error
	switch c.store {
	case "clickhouse":
		l, load = openClickHouse(ctx, c)
	case "postgres":
		var stop func()
		l, load, stop = openPostgres(ctx, c)
		defer stop()
	default:
		log.Fatalf("unknown store %q", c.store)
	}
	if !c.skipLoad {
		start := time.Now()
		for from := c.from; from < c.events; from += c.chunk {
			n := min(c.chunk, c.events-from)
			if err := load(from, n); err != nil {
				log.Fatalf("load events %d…: %v", from, err)
			}
			log.Printf("loaded %d events, %.0f events/s", from+n, float64(from+n-c.from)/time.Since(start).Seconds())
		}
		el := time.Since(start)
		fmt.Printf("loaded %d events in %s: %.0f events/s\n\n", c.events-c.from, el.Round(time.Second), float64(c.events-c.from)/el.Seconds())
	}
	measure(ctx, l, c)
}

// openClickHouse opens the store (creating its tables) and a connection of its own for the
// generating INSERT … SELECT.
func openClickHouse(ctx context.Context, c config) (storage.EventLog, func(from, n int) error) {
	start := time.Now()
	s, err := clickhouse.Open(ctx, c.url, clickhouse.Config{})
	if err != nil {
		log.Fatal(err)
	}
	// The first Open of a loaded database counts its events into the hourly sums.
	log.Printf("store opened (migrated) in %s", time.Since(start).Round(time.Millisecond))
	opts, err := ch.ParseDSN(c.url)
	if err != nil {
		log.Fatal(err)
	}
	conn, err := ch.Open(opts)
	if err != nil {
		log.Fatal(err)
	}
	return s, func(from, n int) error {
		ctx := ch.Context(ctx, ch.WithParameters(ch.Parameters{
			"total": fmt.Sprint(c.events), "days": fmt.Sprint(c.days), "busy": fmt.Sprint(c.busy), "orgs": fmt.Sprint(c.orgs),
			"projects": fmt.Sprint(c.projects), "from": fmt.Sprint(from), "count": fmt.Sprint(n),
		}), ch.WithSettings(ch.Settings{"max_insert_threads": 2}))
		return conn.Exec(ctx, "INSERT INTO event_log (id, org_id, project_id, type, source, severity, payload, created_at)\n"+clickhouseEvents)
	}
}

// openPostgres connects to -url, or starts the -pg-dir cluster and its database analysts, and
// migrates it. stop closes the pool and, with -pg-stop, stops the cluster.
func openPostgres(ctx context.Context, c config) (storage.EventLog, func(from, n int) error, func()) {
	url, stopCluster := c.url, func() {}
	if c.pgDir != "" {
		local, err := postgres.StartLocal(ctx, c.pgDir, postgres.LocalConfig{Unsafe: true})
		if err != nil {
			log.Fatal(err)
		}
		if err := local.EnsureDatabase(ctx, "analysts"); err != nil {
			log.Fatal(err)
		}
		url = local.DSN("analysts")
		if c.pgStop {
			stopCluster = func() {
				if err := local.Stop(context.Background()); err != nil {
					log.Print(err)
				}
			}
		}
	}
	pool, err := postgres.Connect(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := postgres.Migrate(ctx, pool, nil); err != nil {
		log.Fatal(err)
	}
	load := func(from, n int) error {
		// A chunk runs for minutes: past the pool's statement timeout.
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "set local statement_timeout = 0"); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, postgresEvents, c.events, c.days, c.busy, c.orgs, c.projects, from, n); err != nil {
				return err
			}
			if from+n < c.events {
				return nil
			}
			_, err := tx.Exec(ctx, "analyze event_log")
			return err
		})
	}
	return postgres.NewEventLog(pool), load, func() { pool.Close(); stopCluster() }
}

func orgID(i int) string        { return fmt.Sprintf("org_bench%03d", i) }
func projectID(o, p int) string { return fmt.Sprintf("prj_bench%03d_%02d", o, p) }

// shape is one measured query.
type shape struct {
	name string
	run  func(r *rand.Rand) (int, error) // rows returned
}

func measure(ctx context.Context, l storage.EventLog, c config) {
	span := time.Duration(c.days) * 24 * time.Hour
	busyOrg, busyProject := orgID(0), projectID(0, 0)
	// pick is the busy project, or a project at random.
	pick := func(r *rand.Rand, busy bool) (string, string) {
		if busy {
			return busyOrg, busyProject
		}
		o := r.IntN(c.orgs)
		return orgID(o), projectID(o, r.IntN(c.projects))
	}
	page := func(busy bool, mod func(r *rand.Rand, q *storage.EventQuery)) func(r *rand.Rand) (int, error) {
		return func(r *rand.Rand) (int, error) {
			org, prj := pick(r, busy)
			q := storage.EventQuery{OrgID: org, ProjectID: prj, Limit: 100, Total: storage.TotalNone}
			mod(r, &q)
			p, err := l.QueryEvents(ctx, q)
			return len(p.Events), err
		}
	}
	randomAt := func(r *rand.Rand) time.Time { return end.Add(-time.Duration(r.Int64N(int64(span)))) }
	days := func(n int) time.Time { return end.Add(-time.Duration(n) * 24 * time.Hour) }
	agg := func(busy bool, mod func(r *rand.Rand, q *storage.AggregateQuery)) func(r *rand.Rand) (int, error) {
		return func(r *rand.Rand) (int, error) {
			org, prj := pick(r, busy)
			q := storage.AggregateQuery{OrgID: org, ProjectID: prj, From: days(1), To: end}
			mod(r, &q)
			rows, err := l.AggregateEvents(ctx, q)
			return len(rows), err
		}
	}
	paris, _ := time.LoadLocation("Europe/Paris")
	shapes := []shape{
		{"first page, busy project, exact total", page(true, func(_ *rand.Rand, q *storage.EventQuery) { q.Total = storage.TotalExact })},
		{"first page, busy project, estimated total", page(true, func(_ *rand.Rand, q *storage.EventQuery) { q.Total = storage.TotalEstimate })},
		{"first page, busy project, no total", page(true, func(*rand.Rand, *storage.EventQuery) {})},
		{"first page, a project at random, no total", page(false, func(*rand.Rand, *storage.EventQuery) {})},
		{"deep page (cursor at a random time), busy project", page(true, func(r *rand.Rand, q *storage.EventQuery) {
			q.Cursor = storage.EncodeCursor(randomAt(r), "evt_~")
		})},
		{"deep page, oldest first, busy project", page(true, func(r *rand.Rand, q *storage.EventQuery) {
			q.Ascending, q.Cursor = true, storage.EncodeCursor(randomAt(r), "evt_")
		})},
		{"page by type prefix agent.* in a day, busy project", page(true, func(r *rand.Rand, q *storage.EventQuery) {
			q.Types, q.To = []string{"agent.*"}, randomAt(r)
			q.Since = q.To.Add(-24 * time.Hour)
		})},
		{"page of one patient, busy project", page(true, func(r *rand.Rand, q *storage.EventQuery) {
			q.PatientID = fmt.Sprintf("pat_bench000_%05d", r.IntN(10_000))
		})},
		{"page of one workflow, busy project", page(true, func(r *rand.Rand, q *storage.EventQuery) {
			q.WorkflowID = fmt.Sprintf("wf_%d", r.IntN(10))
		})},
		{"counts per type per hour, busy project, 1 day (Europe/Paris)", agg(true, func(_ *rand.Rand, q *storage.AggregateQuery) {
			q.Bucket, q.GroupBy, q.Location = storage.BucketHour, storage.GroupType, paris
		})},
		{"counts per type per hour, busy project, 30 days", agg(true, func(_ *rand.Rand, q *storage.AggregateQuery) {
			q.From, q.Bucket, q.GroupBy = days(30), storage.BucketHour, storage.GroupType
		})},
		{"counts per type per hour, busy project, 7 days from a random minute", agg(true, func(r *rand.Rand, q *storage.AggregateQuery) {
			q.To = end.Add(-time.Duration(r.IntN(30*24*60)) * time.Minute)
			q.From, q.Bucket, q.GroupBy = q.To.Add(-7*24*time.Hour), storage.BucketHour, storage.GroupType
		})},
		{"counts per project per day, busy organization, 30 days", agg(true, func(_ *rand.Rand, q *storage.AggregateQuery) {
			q.ProjectID, q.From, q.Bucket, q.GroupBy = "", days(30), storage.BucketDay, storage.GroupProject
		})},
		{"top types, busy organization, whole history", agg(true, func(_ *rand.Rand, q *storage.AggregateQuery) {
			q.ProjectID, q.From, q.GroupBy = "", days(c.days), storage.GroupType
		})},
		{"top types, every organization, 30 days", agg(true, func(_ *rand.Rand, q *storage.AggregateQuery) {
			q.OrgID, q.ProjectID, q.From, q.GroupBy = "", "", days(30), storage.GroupType
		})},
		{"agent outcome rates per day, busy project, 30 days", agg(true, func(_ *rand.Rand, q *storage.AggregateQuery) {
			q.From, q.Types, q.Bucket, q.GroupBy = days(30), []string{"agent.*"}, storage.BucketDay, storage.GroupStatus
		})},
		{"alerts by severity per hour, an organization at random, 7 days", agg(false, func(_ *rand.Rand, q *storage.AggregateQuery) {
			q.ProjectID, q.From, q.Bucket, q.GroupBy = "", days(7), storage.BucketHour, storage.GroupSeverity
			q.Severities = []string{"warning", "error", "critical"}
		})},
		{"agent latency p50/p90/p99 per hour, busy project, 1 day", agg(true, func(_ *rand.Rand, q *storage.AggregateQuery) {
			q.Types, q.Bucket, q.Latency = []string{"agent.*"}, storage.BucketHour, true
		})},
		{"agent latency p50/p90/p99 per day, busy project, 7 days", agg(true, func(_ *rand.Rand, q *storage.AggregateQuery) {
			q.From, q.Types, q.Bucket, q.Latency = days(7), []string{"agent.*"}, storage.BucketDay, true
		})},
	}
	fmt.Printf("store %s, %d events, %d orgs × %d projects + a busy project (%d%%), %d days, %d runs per shape\n\n",
		c.store, c.events, c.orgs, c.projects, c.busy, c.days, c.reps)
	fmt.Println("| query shape | p50 ms | p99 ms | rows |")
	fmt.Println("|---|---:|---:|---:|")
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range shapes {
		if !strings.Contains(s.name, c.match) {
			continue
		}
		var took []time.Duration
		rows := 0
		for range c.reps {
			start := time.Now()
			n, err := s.run(r)
			if err != nil {
				log.Fatalf("%s: %v", s.name, err)
			}
			took = append(took, time.Since(start))
			rows = n
		}
		slices.Sort(took)
		fmt.Printf("| %s | %.1f | %.1f | %d |\n", s.name, ms(took[len(took)/2]), ms(took[(len(took)*99)/100]), rows)
	}
	exportRate(ctx, l, c, busyOrg, busyProject)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

var errEnough = errors.New("enough")

// exportRate exports the busy project oldest first as GET /v1/events/export does (one streamed
// query, no total), up to -export events, and reports events per second.
func exportRate(ctx context.Context, l storage.EventLog, c config, org, project string) {
	q := storage.EventQuery{OrgID: org, ProjectID: project, Ascending: true}
	n := 0
	start := time.Now()
	err := l.ExportEvents(ctx, q, func(chunk []events.Event) error {
		n += len(chunk)
		if n >= c.exportRows {
			return errEnough
		}
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		log.Fatal(err)
	}
	el := time.Since(start)
	fmt.Printf("\nexport of the busy project (%d events, one streamed query): %s, %.0f events/s\n", n, el.Round(time.Millisecond), float64(n)/el.Seconds())
}
