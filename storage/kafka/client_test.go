package kafka_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka"
	"carehub/storage/kafka/kafkatest"
)

func TestMurmur2MatchesKafkaVectors(t *testing.T) {
	// org.apache.kafka.common.utils.UtilsTest#testMurmur2
	for in, want := range map[string]int32{
		"21":                         -973932308,
		"foobar":                     -790332482,
		"a-little-bit-long-string":   -985981536,
		"a-little-bit-longer-string": -1486304829,
		"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
		"abc": 479470107,
	} {
		if got := murmur2([]byte(in)); got != want {
			t.Errorf("murmur2(%q) = %d, want %d", in, got, want)
		}
	}
}

// TestRoundTrip produces keyed records with NewClient's defaults, reads them
// back through a consumer group with manual commits, and checks placement,
// order, completeness, lag and that a restarted member resumes after the
// commit.
func TestRoundTrip(t *testing.T) {
	topic := kafkatest.Topic(t, "roundtrip")
	group := kafkatest.Group(t, "roundtrip")
	prod := kafkatest.Client(t)

	const keys, perKey = 20, 30
	var recs []*kgo.Record
	for seq := range perKey {
		for k := range keys {
			recs = append(recs, record(topic, msg{ID: len(recs), Key: fmt.Sprintf("patient-%02d", k), Seq: seq}))
		}
	}
	produceSync(t, prod, recs...)
	for _, r := range recs {
		if want := javaPartition(r.Key, kafkatest.Partitions); r.Partition != want {
			t.Fatalf("key %s went to partition %d, the Java client would pick %d", r.Key, r.Partition, want)
		}
	}

	cons := kafkatest.Client(t,
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	got := consume(t, cons, len(recs), 60*time.Second)
	if len(got) != len(recs) {
		t.Fatalf("read %d records, produced %d", len(got), len(recs))
	}
	seen := make(map[int]bool)
	lastSeq := make(map[string]int)
	for _, r := range got {
		m := decode(t, r)
		if seen[m.ID] {
			t.Fatalf("record id %d read twice", m.ID)
		}
		seen[m.ID] = true
		if prev, ok := lastSeq[m.Key]; ok && m.Seq != prev+1 {
			t.Fatalf("key %s: seq %d after %d", m.Key, m.Seq, prev)
		}
		lastSeq[m.Key] = m.Seq
	}
	if err := cons.CommitUncommittedOffsets(timeout(t, 10*time.Second)); err != nil {
		t.Fatalf("commit: %v", err)
	}

	adm := kadm.NewClient(prod)
	lags, err := kafka.Lag(timeout(t, 10*time.Second), adm, group, topic)
	if err != nil {
		t.Fatalf("lag: %v", err)
	}
	if len(lags) != kafkatest.Partitions {
		t.Fatalf("lag covers %d partitions, want %d: %+v", len(lags), kafkatest.Partitions, lags)
	}
	committed := make(map[int32]int64)
	for _, l := range lags {
		if l.Lag != 0 || l.Committed != l.End {
			t.Errorf("after commit, partition %d: %+v", l.Partition, l)
		}
		committed[l.Partition] = l.Committed
	}
	cons.Close()

	// A new member of the group reads only what came after the commit.
	var more []*kgo.Record
	for i := range 12 {
		more = append(more, record(topic, msg{ID: len(recs) + i, Key: fmt.Sprintf("patient-%02d", i), Seq: perKey}))
	}
	produceSync(t, prod, more...)
	cons2 := kafkatest.Client(t, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit())
	for _, r := range consume(t, cons2, len(more), 60*time.Second) {
		if m := decode(t, r); m.ID < len(recs) || r.Offset < committed[r.Partition] {
			t.Errorf("resumed member re-read id %d at %d/%d (committed %d)", m.ID, r.Partition, r.Offset, committed[r.Partition])
		}
	}
}

func TestNewClientValidates(t *testing.T) {
	for _, cfg := range []kafka.ClientConfig{{}, {Brokers: []string{""}}} {
		if cl, err := kafka.NewClient(cfg); err == nil {
			cl.Close()
			t.Errorf("NewClient(%+v) succeeded", cfg)
		}
	}
}

// TestMetricsShareRegistry: clients with distinct ids share one registry,
// a duplicate id is an error rather than a panic, and closing a client frees
// its id.
func TestMetricsShareRegistry(t *testing.T) {
	topic := kafkatest.Topic(t, "metrics")
	reg := prometheus.NewRegistry()
	newClient := func(id string) (*kgo.Client, error) {
		return kafka.NewClient(kafka.ClientConfig{
			Brokers:    kafkatest.Brokers(t),
			ClientID:   id,
			Registerer: reg,
			Logger:     testLogger(t),
		})
	}

	a, err := newClient("metrics-a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := newClient("metrics-b")
	if err != nil {
		t.Fatalf("second client on the registry: %v", err)
	}
	defer b.Close()
	produceSync(t, a, record(topic, msg{ID: 1, Key: "k"}), record(topic, msg{ID: 2, Key: "k"}))
	produceSync(t, b, record(topic, msg{ID: 3, Key: "k"}))

	// franz-go runs produce hooks on their own goroutine, after the
	// promises: poll until the counts arrive.
	var produced map[string]float64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		produced = clientCounter(t, reg, "carehub_kafka_produce_records_total")
		if produced["metrics-a"] == 2 && produced["metrics-b"] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("carehub_kafka_produce_records_total by client_id = %v, want a=2 b=1", produced)
		}
	}

	if dup, err := newClient("metrics-a"); err == nil {
		dup.Close()
		t.Fatal("a second client with id metrics-a registered")
	} else if !strings.Contains(err.Error(), "distinct ClientID") {
		t.Errorf("duplicate id error = %v", err)
	}
	if !hasClientMetric(t, reg, "carehub_kafka_buffered_produce_records", "metrics-a") {
		t.Fatal("the rejected duplicate took the metrics of the first metrics-a client with it")
	}

	a.Close()
	again, err := newClient("metrics-a")
	if err != nil {
		t.Fatalf("id metrics-a after its client closed: %v", err)
	}
	defer again.Close()
	// Closing the old client again must not take the new one's metrics.
	a.Close()
	if !hasClientMetric(t, reg, "carehub_kafka_buffered_produce_records", "metrics-a") {
		t.Error("metrics of the second metrics-a client vanished when the first was closed twice")
	}
}

// clientCounter sums a counter by its client_id label.
func clientCounter(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := make(map[string]float64)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "client_id" {
					out[lp.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

func hasClientMetric(t *testing.T, reg *prometheus.Registry, name, clientID string) bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "client_id" && lp.GetValue() == clientID {
					return true
				}
			}
		}
	}
	return false
}
