package consume_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka"
	"carehub/storage/kafka/consume"
	"carehub/storage/kafka/kafkatest"
)

// produceAt writes values to the topic stamped at, one per partition in turn.
func (e *env) produceAt(at time.Time, values ...string) {
	e.t.Helper()
	recs := make([]*kgo.Record, len(values))
	for i, v := range values {
		recs[i] = &kgo.Record{Topic: e.topic, Partition: int32(i % kafkatest.Partitions), Value: []byte(v), Timestamp: at}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := kafkatest.Client(e.t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatal(err)
	}
}

// readAll runs a member of e's group whose reset is the end (so only a committed start makes it
// read anything already produced) and returns the values it reads, sorted, once it has read want.
func (e *env) readAll(want int) []string {
	e.t.Helper()
	cl := kafkatest.Client(e.t, append(consume.GroupOpts(e.group, e.topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()))...)
	defer cl.Close()
	var got []string
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(got) < want && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
		cl.AllowRebalance()
	}
	slices.Sort(got)
	return got
}

// A new group seeded by SeedRecent starts at the first record stamped at or after since on each
// partition, and at the end of a partition with none: a record produced after the seed and before
// the group's first member joins is read (franz-go's AfterMilli reset alone can pass over one).
func TestSeedRecentStartsAtTheRecentRecords(t *testing.T) {
	e := newEnv(t)
	since := time.Now().Add(-time.Minute)
	e.produceAt(since.Add(-time.Hour), "old-0", "old-1", "old-2")
	e.produceAt(since.Add(time.Second), "recent-0", "recent-1") // partitions 0 and 1; 2 has none

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := consume.SeedRecent(ctx, kafkatest.Client(t), e.group, e.topic, since); err != nil {
		t.Fatal(err)
	}
	e.produceAt(time.Now(), "after-0", "after-1", "after-2") // one on each partition, partition 2's first recent
	got := e.readAll(5)
	want := []string{"after-0", "after-1", "after-2", "recent-0", "recent-1"}
	if !slices.Equal(got, want) {
		t.Fatalf("a seeded group read %v, want %v", got, want)
	}
}

// A group with commits of its own keeps them: seeding never moves a running group back or ahead.
func TestSeedRecentLeavesAGroupWithCommits(t *testing.T) {
	e := newEnv(t)
	e.produceAt(time.Now(), "a-0", "a-1", "a-2")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	own := kadm.Offsets{}
	for p := range int32(kafkatest.Partitions) {
		own.Add(kadm.Offset{Topic: e.topic, Partition: p, At: 1, LeaderEpoch: -1})
	}
	if _, err := e.adm.CommitOffsets(ctx, e.group, own); err != nil {
		t.Fatal(err)
	}
	if err := consume.SeedRecent(ctx, kafkatest.Client(t), e.group, e.topic, time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	committed, err := e.adm.FetchOffsets(ctx, e.group)
	if err != nil {
		t.Fatal(err)
	}
	committed.Each(func(o kadm.OffsetResponse) {
		if o.At != 1 {
			t.Errorf("partition %d: committed %d after seeding, want the group's own 1", o.Partition, o.At)
		}
	})
}

// StartRecent seeds through a client of its own built from the consumer's config.
func TestStartRecentSeedsThroughItsOwnClient(t *testing.T) {
	e := newEnv(t)
	e.produceAt(time.Now().Add(-time.Hour), "old-0", "old-1", "old-2")
	_ = consume.StartRecent(kafka.ClientConfig{Brokers: kafkatest.Brokers(t)}, e.group, e.topic, time.Minute)
	e.produceAt(time.Now(), values("new", kafkatest.Partitions)...)
	if got, want := e.readAll(kafkatest.Partitions), values("new", kafkatest.Partitions); !slices.Equal(got, want) {
		t.Fatalf("read %v, want only the new records %v", got, want)
	}
}
