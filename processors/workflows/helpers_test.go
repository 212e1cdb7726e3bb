package workflows

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/internal/testenv"
	"carehub/kernel/access"
	"carehub/storage/demo"
	"carehub/storage/kafka"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/outbox"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) {
	// The crash test re-executes this binary as a runner it kills with SIGKILL; the child uses
	// the parent's database and broker and must not start servers of its own.
	testenv.ChildMain(crashChildEnv, crashChild)
	pgtest.Main(m)
}

// harness is one test's database (demo data), broker, topics, workflow service and caller.
type harness struct {
	t               testing.TB
	dsn             string
	pool            *pgxpool.Pool
	brokers         []string
	events, runs    string
	svc             *Service
	ctx             context.Context // a live demo-health principal with every scope
	project         string          // the Sepsis Early Warning project
	ward7           string          // its NEWS2 agent
	log             *slog.Logger
	relayed, runner bool
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	h := &harness{t: t, dsn: pgtest.NewDSN(t), brokers: kafkatest.Brokers(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := postgres.Connect(ctx, h.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h.pool = pool
	if _, err := demo.Seed(ctx, pool, nil); err != nil {
		t.Fatalf("seed: %v", err)
	}
	h.events, h.runs = kafkatest.Topic(t, "events"), kafkatest.Topic(t, "runs")
	h.svc = New(pool, Config{EventsTopic: h.events, RunsTopic: h.runs})
	h.ctx = access.With(context.Background(), &access.Principal{OrgID: demo.DemoOrgID, KeyID: "key_test", Mode: access.Live, Scopes: access.Scopes})
	h.project = h.scalar(`select id from projects where name = $1`, demo.SepsisProjectName)
	h.ward7 = h.scalar(`select id from agents where name = $1`, demo.Ward7AgentName)
	h.log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return h
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// relay publishes the outbox (run commands and events) to the broker until the test ends.
func (h *harness) relay() {
	h.t.Helper()
	cl := kafkatest.Client(h.t)
	r := outbox.New(h.pool, cl, outbox.Config{PollInterval: 100 * time.Millisecond})
	h.background("outbox relay", r.Run)
}

// startRunner runs a Runner (short lease and sweep, test group) until the test ends.
func (h *harness) startRunner(cfg RunnerConfig) *Runner {
	h.t.Helper()
	cfg.Brokers, cfg.Service = h.brokers, h.svc
	if cfg.Group == "" {
		cfg.Group = kafkatest.Group(h.t, "runner")
	}
	if cfg.Lease == 0 {
		cfg.Lease = time.Second
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = 100 * time.Millisecond
	}
	cfg.Logger = h.log
	r, err := NewRunner(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.background("runner", r.Run)
	return r
}

// background runs fn until the test ends, then cancels it and waits.
func (h *harness) background(name string, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				h.t.Errorf("%s: %v", name, err)
			}
		case <-time.After(20 * time.Second):
			h.t.Errorf("%s did not stop", name)
		}
	})
}

func (h *harness) scalar(sql string, args ...any) string {
	return pgtest.Scalar[string](h.t, h.pool, sql, args...)
}

func (h *harness) count(sql string, args ...any) int {
	return pgtest.Scalar[int](h.t, h.pool, sql, args...)
}

func (h *harness) workflow(name string, steps []string, triggers ...string) *Workflow {
	h.t.Helper()
	w, err := h.svc.Create(h.ctx, NewWorkflow{Name: name, ProjectID: h.project, Steps: steps, Triggers: triggers})
	if err != nil {
		h.t.Fatalf("create workflow: %v", err)
	}
	return w
}

func (h *harness) start(w *Workflow, patientID string) *Run {
	h.t.Helper()
	in, _ := json.Marshal(map[string]string{"patient_id": patientID})
	r, err := h.svc.Start(h.ctx, w.ID, in, RunOptions{})
	if err != nil {
		h.t.Fatalf("start run: %v", err)
	}
	return r
}

// wait polls until cond holds on the run (read fresh each time) or the timeout passes.
func (h *harness) wait(runID string, timeout time.Duration, what string, cond func(*Run, RunOutput) bool) (*Run, RunOutput) {
	h.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r, out := h.run(runID)
		if cond(r, out) {
			return r, out
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out after %s waiting for %s; run %s is %s, output %s", timeout, what, runID, r.Status, r.Output)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *harness) run(id string) (*Run, RunOutput) {
	h.t.Helper()
	rows, _ := h.pool.Query(context.Background(), `select `+runColumns+` from workflow_runs where id = $1`, id)
	r, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Run])
	if err != nil {
		h.t.Fatal(err)
	}
	var out RunOutput
	if len(r.Output) > 0 {
		if err := json.Unmarshal(r.Output, &out); err != nil {
			h.t.Fatal(err)
		}
	}
	return r, out
}

func ended(r *Run, _ RunOutput) bool { return r.CompletedAt != nil }

// eventStatuses lists the status of each event of typ about run id in the outbox, in order.
func (h *harness) eventStatuses(typ, key, id string) []string {
	h.t.Helper()
	rows, _ := h.pool.Query(context.Background(), `select value->'payload'->>'status' from outbox where value->>'type' = $1
and value->'payload'->>$2 = $3 order by seq`, typ, key, id)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

// payload returns the payload of the single event of typ about run id.
func (h *harness) payload(typ, key, id string) map[string]any {
	h.t.Helper()
	var p map[string]any
	if err := h.pool.QueryRow(context.Background(), `select value->'payload' from outbox where value->>'type' = $1
and value->'payload'->>$2 = $3`, typ, key, id).Scan(&p); err != nil {
		h.t.Fatalf("%s of %s: %v", typ, id, err)
	}
	return p
}

// drained waits until the group has committed everything on topic.
func (h *harness) drained(group, topic string, timeout time.Duration) {
	h.t.Helper()
	cl := kafkatest.Client(h.t)
	deadline := time.Now().Add(timeout)
	for {
		lags, err := kafka.Lag(context.Background(), kadmClient(cl), group, topic)
		if err == nil && kafka.TotalLag(lags) == 0 {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("group %s did not drain %s: %v %v", group, topic, lags, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
