package kafkatest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka/publish"
)

// endHeader marks the records ReadAll writes to find the end of a partition.
const endHeader = "kafkatest-end"

// ReadAll returns every committed record of topic produced before the call, in partition and
// offset order. It appends a marker record to each partition and reads (read committed) until
// it has seen every marker, so what it returns is complete: a transaction still open when it is
// called is waited for, an aborted one is not returned. Test code only: it writes to topic.
func ReadAll(t testing.TB, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	marker := Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	topics, err := kadm.NewClient(marker).ListTopics(ctx, topic)
	if err != nil || topics.Error() != nil {
		t.Fatalf("kafkatest: describe %s: %v %v", topic, err, topics.Error())
	}
	parts := topics[topic].Partitions.Numbers()
	id := []byte(randomHex(8)) // this call's markers, not an earlier call's
	recs := make([]*kgo.Record, len(parts))
	for i, p := range parts {
		recs[i] = &kgo.Record{Topic: topic, Partition: p, Headers: []kgo.RecordHeader{{Key: endHeader, Value: id}}}
	}
	if err := publish.NewAcked(marker).All(ctx, recs...); err != nil {
		t.Fatalf("kafkatest: end markers on %s: %v", topic, err)
	}
	cl := Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var out []*kgo.Record
	for ended := map[int32]bool{}; len(ended) < len(parts); {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("kafkatest: read %s: %d of %d partitions read to the end: %v", topic, len(ended), len(parts), err)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			switch {
			case ended[r.Partition]:
			case len(r.Headers) > 0 && r.Headers[0].Key == endHeader:
				if string(r.Headers[0].Value) == string(id) {
					ended[r.Partition] = true
				}
			default:
				out = append(out, r)
			}
		})
	}
	return out
}
