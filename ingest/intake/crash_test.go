package intake_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"carehub/ingest/intake"
	"carehub/internal/testenv"
	"carehub/kernel/access"
	obs "carehub/processors/observations"
	"carehub/schemas/kafka/observation"
	"carehub/storage/postgres"
)

// envWriterChild carries the child writer's configuration (JSON of childConfig).
const envWriterChild = "CAREHUB_TEST_OBSERVATION_WRITER_CHILD"

type childConfig struct {
	DSN     string   `json:"dsn"`
	Brokers []string `json:"brokers"`
	Topic   string   `json:"topic"`
	Group   string   `json:"group"`
	Events  string   `json:"events"`
	TxnID   string   `json:"txnId"`
}

// runWriterChild is the process TestWriterKilledStoresEveryAcceptedObservationOnce kills: an
// observation writer with small batches, run until it is killed.
func runWriterChild() int {
	var cfg childConfig
	if err := json.Unmarshal([]byte(os.Getenv(envWriterChild)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "child config:", err)
		return 2
	}
	ctx := context.Background()
	pool, err := postgres.Connect(ctx, cfg.DSN)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	w, err := obs.NewWriter(obs.WriterConfig{Brokers: cfg.Brokers, Pool: pool, Topic: cfg.Topic, Group: cfg.Group,
		EventsTopic: cfg.Events, TransactionalID: cfg.TxnID, MaxBatch: 97, SessionTimeout: 6 * time.Second, Logger: logger})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Fprintln(os.Stderr, "writer child running")
	if err := w.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	return 1
}

// TestWriterKilledStoresEveryAcceptedObservationOnce runs the writer in a child process, keeps
// ingesting while it stores, kills it with SIGKILL in the middle, and then runs a new writer in
// the same group: every observation answered 202 must be stored exactly once, with exactly one
// event queued each, and nothing else may be stored.
func TestWriterKilledStoresEveryAcceptedObservationOnce(t *testing.T) {
	w := newWorld(t)
	in := newIntake(t, w)
	cfg, _ := json.Marshal(childConfig{DSN: w.dsn, Brokers: w.brokers, Topic: w.topic, Group: w.group,
		Events: w.events, TxnID: w.txnID})
	child := testenv.StartChild(t, envWriterChild+"="+string(cfg))

	ctx := principal(w.orgA, access.Live)
	var accepted []string
	ingest := func(requests int) {
		t.Helper()
		for range requests {
			list := make([]map[string]any, 250)
			for i := range list {
				list[i] = vital([]string{w.synthA, w.realA}[i%2], func(o map[string]any) {
					o["valueQuantity"] = map[string]any{"value": 40 + i%100, "unit": "/min"}
				})
			}
			res, err := submit(t, in, ctx, intake.MediaFHIRNDJSON, ndjson(t, list...))
			if err != nil {
				t.Fatalf("ingest: %v", err)
			}
			accepted = append(accepted, res.Answer.IDs...)
		}
	}

	ingest(8)
	// Kill the writer once it is demonstrably in the middle of the stream.
	deadline := time.Now().Add(60 * time.Second)
	for count(t, w.pool, `select count(*) from observations`) < 300 {
		if time.Now().After(deadline) {
			t.Fatal("the child writer stored nothing")
		}
		ingest(1)
	}
	if err := child.Kill(); err != nil {
		t.Fatal(err)
	}
	stored := count(t, w.pool, `select count(*) from observations`)
	ingest(4) // accepted while no writer runs
	t.Logf("killed the writer after it stored %d of %d accepted observations", stored, len(accepted))

	startWriter(t, w)
	waitStored(t, w, accepted)
	if n := count(t, w.pool, `select count(*) from observations`); n != len(accepted) {
		t.Fatalf("%d observations stored; %d were accepted", n, len(accepted))
	}
	// Exactly one committed event each, although the killed writer had stored observations
	// whose events it never committed: its successor (the same transactional id) fenced its
	// open transaction, re-read the uncommitted batch and produced them again.
	evs := waitEvents(t, w, accepted)
	missing, duplicated := 0, 0
	for _, id := range accepted {
		switch n := len(evs[observation.EventID(id)]); {
		case n == 0:
			missing++
		case n > 1:
			duplicated++
		}
	}
	t.Logf("acknowledged %d, stored %d (rows, unique by id), events %d (%d missing, %d committed twice)", len(accepted),
		count(t, w.pool, `select count(*) from observations`), len(evs), missing, duplicated)
	if missing > 0 || duplicated > 0 || len(evs) != len(accepted) {
		t.Fatalf("%d events for %d observations: %d missing, %d committed twice", len(evs), len(accepted), missing, duplicated)
	}
}
