package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/internal/testenv"
	"carehub/kernel/events"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/outbox"
	"carehub/storage/postgres/pgtest"
)

// BenchmarkRelay measures the relay's throughput from committed outbox rows to acknowledged
// records marked sent (default batch size; kfake unless CAREHUB_TEST_KAFKA_BROKERS is set).
// Each iteration commits 5,000 events in 50 transactions and waits until all are sent.
//
//	go test ./ingest/outbox -run '^$' -bench Relay -benchtime 10x
func BenchmarkRelay(b *testing.B) {
	pool := pgtest.New(b)
	topic := kafkatest.Topic(b, "events")
	relay := outbox.New(pool, kafkatest.Client(b), outbox.Config{})
	defer testenv.Run(b, relay.Run)()
	ctx := context.Background()

	const perTx, txs = 100, 50
	batch := make([]events.Event, perTx)
	b.ResetTimer()
	for b.Loop() {
		for range txs {
			for i := range batch {
				ev, err := events.New("a.b", "org_1", "prj_1", events.SourceSystem, events.SeverityInfo, nil)
				if err != nil {
					b.Fatal(err)
				}
				batch[i] = ev
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.AppendEvents(ctx, tx, topic, batch...) }); err != nil {
				b.Fatal(err)
			}
		}
		for {
			var n int
			if err := pool.QueryRow(ctx, "select count(*) from outbox where sent_at is null").Scan(&n); err != nil {
				b.Fatal(err)
			}
			if n == 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	b.ReportMetric(float64(b.N*perTx*txs)/b.Elapsed().Seconds(), "events/s")
}
