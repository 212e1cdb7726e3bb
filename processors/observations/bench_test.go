package observations_test

import (
	"context"
	"os"
	"testing"
	"time"

	obs "carehub/processors/observations"
	"carehub/storage/kafka/kafkatest"
)

// BenchmarkWriter measures the writer end to end on the test broker and database: b.N
// observations are produced to the topic, then one writer stores them all, queuing their
// events (BENCH_NO_EVENTS=1: without). Report: observations stored per second.
//
//	go test -run '^$' -bench BenchmarkWriter -benchtime 50000x ./processors/observations/
func BenchmarkWriter(b *testing.B) {
	e := newEnv(b)
	msgs := make([]obs.Message, b.N)
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
	w, err := obs.NewWriter(obs.WriterConfig{Brokers: e.brokers, Pool: e.pool, Topic: e.topic, Group: kafkatest.Group(b, "bench"),
		DisableEvents: os.Getenv("BENCH_NO_EVENTS") != ""})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	for {
		var n int
		if err := e.pool.QueryRow(context.Background(), `select count(*) from observations`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n >= b.N {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "stored/s")
	cancel()
	<-done
}
