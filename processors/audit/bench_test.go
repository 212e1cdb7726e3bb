package audit_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/processors/audit"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

// BenchmarkWriter measures audit records per second from the audit topic into the Postgres
// audit store through the Writer (decode, COPY batch, commit). The records are produced before
// the timer starts; the timer stops when the last one is stored. Target: ≥ 20,000 records/s.
func BenchmarkWriter(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.New(b)
	store := postgres.NewAuditLog(pool)
	topic := kafkatest.Topic(b, "audit-bench")
	cl := kafkatest.Client(b, kgo.DefaultProduceTopic(topic), kgo.MaxBufferedRecords(1<<20))

	// Realistic records: one patient read in three, org keys spread over partitions.
	recs := make([]*kgo.Record, b.N)
	for i := range recs {
		org := []string{"org_a", "org_b", "org_c", "org_d", "org_e", "org_f"}[i%6]
		r := record(org)
		if i%3 == 0 {
			r = record(org, "pat_1")
		}
		v, err := json.Marshal(r)
		if err != nil {
			b.Fatal(err)
		}
		recs[i] = &kgo.Record{Key: []byte(org), Value: v}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		b.Fatal(err)
	}
	w, err := audit.NewWriter(audit.WriterConfig{Brokers: kafkatest.Brokers(b), Topic: topic, Group: kafkatest.Group(b, "audit-bench"), Store: store})
	if err != nil {
		b.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)

	b.ResetTimer()
	start := time.Now()
	go func() { done <- w.Run(wctx) }()
	for {
		var n int
		if err := pool.QueryRow(ctx, `select count(*) from audit_log`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n >= b.N {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	<-done
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "records/s")
}
