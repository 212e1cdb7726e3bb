// Command analystload loads an event log with a synthetic history at scale and measures the
// analysts' query shapes on it: keyset pages (first, deep, by type prefix, by patient), counts
// per type per hour, organization-wide day counts, top-N types, outcome rates, run-time
// percentiles, and export rate (pages of 1,000 without a total, as GET /v1/events/export reads).
// It talks to the store directly (storage.EventLog), so it measures the store, not HTTP.
//
//	analystload -store clickhouse -url clickhouse://127.0.0.1:19000/bench -events 10000000
//	analystload -store postgres -url postgres://…/bench -events 1000000
//
// Events: -orgs organizations of -projects projects each, spread over -days days ending at a
// fixed date, of six types (agent runs that complete or fail with a latency, workflow runs with a
// duration, device observations of 10,000 patients per organization, alerts); appended in batches
// of 10,000 by -writers writers. -skip-load measures an already loaded store. The report is a
// Markdown table of p50/p99 per shape (-reps runs each) on stdout.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"carehub/storage"
	"carehub/storage/clickhouse"
	"carehub/storage/ids"
	"carehub/storage/postgres"
)

// end is the fixed end of the generated history, so runs are comparable.
var end = time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)

type config struct {
	store, url                          string
	events                              int
	orgs, projects, days, writers, reps int
	skipLoad                            bool
}

func main() {
	var c config
	flag.StringVar(&c.store, "store", "clickhouse", "clickhouse or postgres")
	flag.StringVar(&c.url, "url", "", "the store's URL")
	flag.IntVar(&c.events, "events", 1_000_000, "events to load")
	flag.IntVar(&c.orgs, "orgs", 10, "organizations")
	flag.IntVar(&c.projects, "projects", 5, "projects per organization")
	flag.IntVar(&c.days, "days", 90, "days of history")
	flag.IntVar(&c.writers, "writers", 4, "concurrent writers")
	flag.IntVar(&c.reps, "reps", 50, "runs of each query shape")
	flag.BoolVar(&c.skipLoad, "skip-load", false, "measure the store as it is")
	flag.Parse()
	if c.url == "" || c.events < 1 || c.events > 1_000_000_000 || c.writers < 1 || c.writers > 64 {
		flag.Usage()
		os.Exit(2)
	}
	ctx := context.Background()
	log := open(ctx, c)
	if !c.skipLoad {
		start := time.Now()
		load(ctx, log, c)
		el := time.Since(start)
		fmt.Printf("loaded %d events in %s: %.0f events/s\n\n", c.events, el.Round(time.Second), float64(c.events)/el.Seconds())
	}
	measure(ctx, log, c)
}

func open(ctx context.Context, c config) storage.EventLog {
	switch c.store {
	case "clickhouse":
		s, err := clickhouse.Open(ctx, c.url)
		if err != nil {
			log.Fatal(err)
		}
		return s
	case "postgres":
		pool, err := postgres.Connect(ctx, c.url)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := postgres.Migrate(ctx, pool, nil); err != nil {
			log.Fatal(err)
		}
		return postgres.NewEventLog(pool)
	}
	log.Fatalf("unknown store %q", c.store)
	return nil
}

func orgID(i int) string        { return fmt.Sprintf("org_bench%03d", i) }
func projectID(o, p int) string { return fmt.Sprintf("prj_bench%03d_%02d", o, p) }

// event returns the i-th synthetic event: organizations and projects round robin, times spread
// evenly over the history, types in realistic proportions.
func event(r *rand.Rand, c config, i int) storage.Event {
	o, p := i%c.orgs, (i/c.orgs)%c.projects
	span := time.Duration(c.days) * 24 * time.Hour
	at := end.Add(-span + time.Duration(int64(span)/int64(c.events)*int64(i)))
	ev := storage.Event{ID: ids.At(ids.Event, at, randReader{r}), OrgID: orgID(o), ProjectID: projectID(o, p),
		Source: "system", Severity: "info", CreatedAt: at}
	patient := fmt.Sprintf("pat_bench%03d_%05d", o, r.IntN(10_000))
	var payload any
	switch n := r.IntN(100); {
	case n < 50:
		ev.Type, ev.Source = "device.observation_received", "integration"
		payload = map[string]any{"observationId": fmt.Sprintf("obs_%d", i), "patientId": patient, "code": "8867-4", "value": 60 + r.IntN(80)}
	case n < 70:
		ev.Type, ev.Source = "agent.run_completed", "agent"
		payload = map[string]any{"sessionId": fmt.Sprintf("ses_%d", i), "agentId": fmt.Sprintf("agt_%d", r.IntN(20)), "patientId": patient,
			"status": "COMPLETED", "latencyMs": 200 + r.IntN(3000), "tokensUsed": r.IntN(4000)}
	case n < 75:
		ev.Type, ev.Source, ev.Severity = "agent.run.failed", "agent", "error"
		payload = map[string]any{"sessionId": fmt.Sprintf("ses_%d", i), "agentId": fmt.Sprintf("agt_%d", r.IntN(20)), "patientId": patient,
			"status": "FAILED", "latencyMs": 100 + r.IntN(30000), "error": "timeout"}
	case n < 92:
		ev.Type, ev.Source = "workflow.completed", "workflow"
		status := "COMPLETED"
		if r.IntN(10) == 0 {
			status = "FAILED"
		}
		payload = map[string]any{"workflowId": fmt.Sprintf("wf_%d", r.IntN(10)), "runId": fmt.Sprintf("run_%d", i), "status": status, "durationMs": 50 + r.IntN(5000)}
	case n < 98:
		ev.Type, ev.Source = "diagnostic.result_ready", "agent"
		ev.Severity = []string{"warning", "error", "critical"}[r.IntN(3)]
		payload = map[string]any{"reportId": fmt.Sprintf("rep_%d", i), "patientId": patient, "code": "news2", "severity": "HIGH"}
	default:
		ev.Type, ev.Source = "deployment.status_changed", "deployment"
		payload = map[string]any{"deploymentId": fmt.Sprintf("dep_%d", r.IntN(5)), "from": "PENDING", "to": "RUNNING"}
	}
	ev.Payload, _ = json.Marshal(payload)
	return ev
}

type randReader struct{ r *rand.Rand }

func (rr randReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(rr.r.UintN(256))
	}
	return len(p), nil
}

const batch = 10_000

func load(ctx context.Context, log_ storage.EventLog, c config) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range c.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 17))
			evs := make([]storage.Event, 0, batch)
			for {
				from := int(next.Add(batch)) - batch
				if from >= c.events {
					return
				}
				evs = evs[:0]
				for i := from; i < min(from+batch, c.events); i++ {
					evs = append(evs, event(r, c, i))
				}
				if err := log_.AppendEvents(ctx, evs); err != nil {
					log.Fatal(err)
				}
			}
		}()
	}
	wg.Wait()
}

// shape is one measured query.
type shape struct {
	name string
	run  func(r *rand.Rand) (int, error) // rows returned
}

func measure(ctx context.Context, l storage.EventLog, c config) {
	span := time.Duration(c.days) * 24 * time.Hour
	pick := func(r *rand.Rand) (string, string) {
		o := r.IntN(c.orgs)
		return orgID(o), projectID(o, r.IntN(c.projects))
	}
	page := func(mod func(r *rand.Rand, q *storage.EventQuery)) func(r *rand.Rand) (int, error) {
		return func(r *rand.Rand) (int, error) {
			org, prj := pick(r)
			q := storage.EventQuery{OrgID: org, ProjectID: prj, Limit: 100, Total: storage.TotalNone}
			mod(r, &q)
			p, err := l.QueryEvents(ctx, q)
			return len(p.Events), err
		}
	}
	randomAt := func(r *rand.Rand) time.Time { return end.Add(-time.Duration(r.Int64N(int64(span)))) }
	agg := func(mod func(r *rand.Rand, q *storage.AggregateQuery)) func(r *rand.Rand) (int, error) {
		return func(r *rand.Rand) (int, error) {
			org, prj := pick(r)
			q := storage.AggregateQuery{OrgID: org, ProjectID: prj, From: end.Add(-24 * time.Hour), To: end}
			mod(r, &q)
			rows, err := l.AggregateEvents(ctx, q)
			return len(rows), err
		}
	}
	paris, _ := time.LoadLocation("Europe/Paris")
	shapes := []shape{
		{"first page, newest first, exact total", page(func(_ *rand.Rand, q *storage.EventQuery) { q.Total = storage.TotalExact })},
		{"first page, no total", page(func(*rand.Rand, *storage.EventQuery) {})},
		{"deep page (cursor at a random time), no total", page(func(r *rand.Rand, q *storage.EventQuery) {
			q.Cursor = storage.EncodeCursor(randomAt(r), "evt_~")
		})},
		{"deep page, oldest first", page(func(r *rand.Rand, q *storage.EventQuery) {
			q.Ascending, q.Cursor = true, storage.EncodeCursor(randomAt(r), "evt_")
		})},
		{"page by type prefix agent.* in a day", page(func(r *rand.Rand, q *storage.EventQuery) {
			q.Types, q.To = []string{"agent.*"}, randomAt(r)
			q.Since = q.To.Add(-24 * time.Hour)
		})},
		{"page of one patient", page(func(r *rand.Rand, q *storage.EventQuery) {
			q.PatientID = fmt.Sprintf("pat_bench%s_%05d", q.OrgID[len(q.OrgID)-3:], r.IntN(10_000))
		})},
		{"counts per type per hour, project, 1 day", agg(func(_ *rand.Rand, q *storage.AggregateQuery) {
			q.Bucket, q.GroupBy, q.Location = storage.BucketHour, storage.GroupType, paris
		})},
		{"counts per project per day, organization, 30 days", agg(func(_ *rand.Rand, q *storage.AggregateQuery) {
			q.ProjectID, q.From, q.Bucket, q.GroupBy = "", end.Add(-30*24*time.Hour), storage.BucketDay, storage.GroupProject
		})},
		{"top types, organization, 30 days", agg(func(_ *rand.Rand, q *storage.AggregateQuery) {
			q.ProjectID, q.From, q.GroupBy = "", end.Add(-30*24*time.Hour), storage.GroupType
		})},
		{"agent outcome rates per day, project, 30 days", agg(func(_ *rand.Rand, q *storage.AggregateQuery) {
			q.From, q.Types, q.Bucket, q.GroupBy = end.Add(-30*24*time.Hour), []string{"agent.*"}, storage.BucketDay, storage.GroupStatus
		})},
		{"agent latency p50/p90/p99 per hour, project, 1 day", agg(func(_ *rand.Rand, q *storage.AggregateQuery) {
			q.Types, q.Bucket, q.Latency = []string{"agent.*"}, storage.BucketHour, true
		})},
		{"alerts by severity per hour, organization, 7 days", agg(func(_ *rand.Rand, q *storage.AggregateQuery) {
			q.ProjectID, q.From, q.Bucket, q.GroupBy = "", end.Add(-7*24*time.Hour), storage.BucketHour, storage.GroupSeverity
			q.Severities = []string{"warning", "error", "critical"}
		})},
	}
	fmt.Printf("store %s, %d events, %d orgs × %d projects, %d days, %d runs per shape\n\n", c.store, c.events, c.orgs, c.projects, c.days, c.reps)
	fmt.Println("| query shape | p50 ms | p99 ms | rows |")
	fmt.Println("|---|---:|---:|---:|")
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range shapes {
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
	exportRate(ctx, l, c)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// exportRate reads one project's whole history as an export does (pages of 1,000, no total,
// oldest first) and reports events per second.
func exportRate(ctx context.Context, l storage.EventLog, c config) {
	q := storage.EventQuery{OrgID: orgID(0), ProjectID: projectID(0, 0), Limit: 1000, Total: storage.TotalNone, Ascending: true}
	n := 0
	start := time.Now()
	for {
		p, err := l.QueryEvents(ctx, q)
		if err != nil {
			log.Fatal(err)
		}
		n += len(p.Events)
		if p.NextCursor == "" || n >= 2_000_000 {
			break
		}
		q.Cursor = p.NextCursor
	}
	el := time.Since(start)
	fmt.Printf("\nexport of one project (%d events, pages of 1,000): %s, %.0f events/s\n", n, el.Round(time.Millisecond), float64(n)/el.Seconds())
}
