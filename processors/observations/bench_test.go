package observations_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	obs "carehub/processors/observations"
	"carehub/schemas/kafka/observation"

	"carehub/storage/kafka/kafkatest"
)

// BenchmarkWriter measures the writer end to end on the test broker and database: b.N
// observations are produced to the topic, then one writer stores them all, producing their
// events (BENCH_NO_EVENTS=1: without). Report: observations stored per second, counted from the
// first one stored (joining the group is not storing). BENCH_MAX_BATCH, BENCH_CHUNK and
// BENCH_CONCURRENCY override the writer's defaults.
//
//	go test -run '^$' -bench BenchmarkWriter -benchtime 50000x ./processors/observations/
func BenchmarkWriter(b *testing.B) {
	e := newEnv(b)
	msgs := make([]observation.Message, b.N)
	for i := range msgs {
		msgs[i] = message(e.orgA, e.patientA, float64(40+i%100))
	}
	cl := kafkatest.Client(b)
	const chunk = 5000
	for i := 0; i < len(msgs); i += chunk {
		produceTo(b, cl, e.topic, encode(msgs[i:min(i+chunk, len(msgs))]...))
	}
	b.ResetTimer()
	start := time.Now()
	w, err := obs.NewWriter(obs.WriterConfig{Brokers: e.brokers, Pool: e.pool, Topic: e.topic, Group: kafkatest.Group(b, "bench"), EventsTopic: e.events,
		DisableEvents: os.Getenv("BENCH_NO_EVENTS") != "", MaxBatch: envInt(b, "BENCH_MAX_BATCH", obs.DefaultMaxBatch),
		ChunkSize: envInt(b, "BENCH_CHUNK", obs.DefaultChunkSize), Concurrency: envInt(b, "BENCH_CONCURRENCY", obs.DefaultConcurrency)})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	var first time.Time
	firstN := 0
	for {
		var n int
		if err := e.pool.QueryRow(context.Background(), `select count(*) from observations`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n > 0 && first.IsZero() {
			first, firstN = time.Now(), n
		}
		if n >= b.N {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N-firstN)/time.Since(first).Seconds(), "stored/s")
	b.ReportMetric(time.Since(start).Seconds(), "s_total")
	cancel()
	<-done
}

// BenchmarkStore measures the Postgres side alone: b.N observations stored in batches of
// BENCH_BATCH (default obs.DefaultChunkSize) by BENCH_CONCURRENCY (default obs.DefaultMembers
// × obs.DefaultConcurrency) transactions at once, as the writer's members store chunks. Report:
// observations stored per second. BENCH_STORE=raw is the raw baseline: a plain COPY of the same
// rows, in the same batches, into a table like observations (its indexes, no foreign keys, no
// staging).
//
//	go test -run '^$' -bench BenchmarkStore -benchtime 100000x ./processors/observations/
func BenchmarkStore(b *testing.B) {
	e := newEnv(b)
	batch := envInt(b, "BENCH_BATCH", obs.DefaultChunkSize)
	conc := envInt(b, "BENCH_CONCURRENCY", obs.DefaultMembers*obs.DefaultConcurrency)
	msgs := make([]observation.Message, b.N)
	for i := range msgs {
		msgs[i] = message(e.orgA, e.patientA, float64(40+i%100))
	}
	store := obs.StoreFunc(e.pool)
	ctx := context.Background()
	switch os.Getenv("BENCH_STORE") {
	case "raw":
		if _, err := e.pool.Exec(ctx, `create table raw_observations (like observations including all)`); err != nil {
			b.Fatal(err)
		}
		cols := []string{"id", "org_id", "patient_id", "status", "loinc", "value", "unit", "effective_at", "device_type", "resource", "received_at"}
		store = func(ctx context.Context, msgs []observation.Message) error {
			rows := make([][]any, len(msgs))
			for i, m := range msgs {
				rows[i] = []any{m.ID, m.OrgID, m.PatientID, m.Status, m.LOINC, m.Value, m.Unit, m.EffectiveAt, m.DeviceType, []byte(m.Observation), m.ReceivedAt}
			}
			_, err := e.pool.CopyFrom(ctx, pgx.Identifier{"raw_observations"}, cols, pgx.CopyFromRows(rows))
			return err
		}
	}
	work := make(chan []observation.Message, len(msgs)/batch+1)
	for i := 0; i < len(msgs); i += batch {
		work <- msgs[i:min(i+batch, len(msgs))]
	}
	close(work)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for w := range work {
				if err := store(context.Background(), w); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "stored/s")
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q", name, v)
	}
	return n
}
