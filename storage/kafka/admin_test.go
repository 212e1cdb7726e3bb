package kafka_test

import (
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka"
	"carehub/storage/kafka/kafkatest"
)

func TestPing(t *testing.T) {
	if err := kafka.Ping(timeout(t, 10*time.Second), kafkatest.Client(t)); err != nil {
		t.Errorf("Ping of a live broker: %v", err)
	}

	// A port nothing listens on: Ping must fail, and by the deadline.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: []string{dead}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	start := time.Now()
	if err := kafka.Ping(timeout(t, 2*time.Second), cl); err == nil {
		t.Error("Ping of a dead address succeeded")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Ping of a dead address took %v with a 2s deadline", d)
	}
}

func TestLag(t *testing.T) {
	topic := kafkatest.Topic(t, "lag")
	group := kafkatest.Group(t, "lag")
	const perPartition = 10
	prod := kafkatest.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var recs []*kgo.Record
	for i := range perPartition * kafkatest.Partitions {
		r := record(topic, msg{ID: i, Key: "k"})
		r.Partition = int32(i % kafkatest.Partitions)
		recs = append(recs, r)
	}
	produceSync(t, prod, recs...)
	adm := kadm.NewClient(prod)

	lag := func(topics ...string) []kafka.PartitionLag {
		t.Helper()
		lags, err := kafka.Lag(timeout(t, 10*time.Second), adm, group, topics...)
		if err != nil {
			t.Fatalf("Lag(%v): %v", topics, err)
		}
		return lags
	}

	// A group that never committed owes the whole topic.
	lags := lag(topic)
	if len(lags) != kafkatest.Partitions {
		t.Fatalf("lag of a new group covers %d partitions, want %d", len(lags), kafkatest.Partitions)
	}
	for i, l := range lags {
		want := kafka.PartitionLag{Topic: topic, Partition: int32(i), Committed: -1, Start: 0, End: perPartition, Lag: perPartition}
		if l != want {
			t.Errorf("new group: got %+v, want %+v", l, want)
		}
	}
	if lags := lag(); len(lags) != 0 {
		t.Errorf("without topics, a group with no commits has lag %+v", lags)
	}

	// Commit partition 0 part way.
	var offs kadm.Offsets
	offs.AddOffset(topic, 0, 4, -1)
	if err := adm.CommitAllOffsets(timeout(t, 10*time.Second), group, offs); err != nil {
		t.Fatalf("commit: %v", err)
	}
	for _, l := range lag(topic) {
		want := int64(perPartition)
		if l.Partition == 0 {
			want = perPartition - 4
			if l.Committed != 4 {
				t.Errorf("partition 0 committed %d, want 4", l.Committed)
			}
		}
		if l.Lag != want {
			t.Errorf("partition %d lag %d, want %d", l.Partition, l.Lag, want)
		}
	}
	// Without topics, Lag covers the committed-to topic.
	if got := kafka.TotalLag(lag()); got != perPartition*kafkatest.Partitions-4 {
		t.Errorf("total lag without topics = %d, want %d", got, perPartition*kafkatest.Partitions-4)
	}

	// A live member consumes and commits everything: no lag, and the
	// member is named.
	cons := kafkatest.Client(t, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit())
	consume(t, cons, len(recs)-4, 60*time.Second)
	if err := cons.CommitUncommittedOffsets(timeout(t, 10*time.Second)); err != nil {
		t.Fatalf("commit: %v", err)
	}
	for _, l := range lag(topic) {
		if l.Lag != 0 || l.MemberID == "" {
			t.Errorf("after a member committed everything: %+v", l)
		}
	}

	if _, err := kafka.Lag(timeout(t, 10*time.Second), adm, group, kafkatest.Name(t, "missing")); err == nil {
		t.Error("Lag on a topic that does not exist succeeded")
	}
}
