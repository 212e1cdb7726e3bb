package kafka_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"carehub/storage/kafka"
	"carehub/storage/kafka/kafkatest"
)

func TestDefaultTopics(t *testing.T) {
	want := []string{"carehub.events.v1", "carehub.observations.v1", "carehub.workflow-runs.v1", "carehub.audit.v1", "carehub.events.dlq.v1",
		"carehub.audit.dlq.v1", "carehub.observations.dlq.v1"}
	if got := kafka.DefaultTopics().All(); !slices.Equal(got, want) {
		t.Errorf("DefaultTopics().All() = %v, want %v", got, want)
	}
	if got := (kafka.Topics{Events: "e", Audit: "a"}).All(); !slices.Equal(got, []string{"e", "a"}) {
		t.Errorf("All() with unset topics = %v", got)
	}
}

func TestNamespace(t *testing.T) {
	if got, want := kafka.Namespace("").Topics(), kafka.DefaultTopics(); got != want {
		t.Errorf("empty namespace: %v, want the defaults %v", got, want)
	}
	ns := kafka.Namespace("staging-2")
	want := []string{"staging-2.carehub.events.v1", "staging-2.carehub.observations.v1",
		"staging-2.carehub.workflow-runs.v1", "staging-2.carehub.audit.v1", "staging-2.carehub.events.dlq.v1",
		"staging-2.carehub.audit.dlq.v1", "staging-2.carehub.observations.dlq.v1"}
	if got := ns.Topics().All(); !slices.Equal(got, want) {
		t.Errorf("Topics().All() = %v, want %v", got, want)
	}
	if got := ns.Name("carehub-audit"); got != "staging-2.carehub-audit" {
		t.Errorf("Name(group) = %q", got)
	}
	for _, ok := range []string{"", "a", "ci_1.pkg-x", strings.Repeat("n", 100)} {
		if err := kafka.Namespace(ok).Validate(); err != nil {
			t.Errorf("Validate(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{".", "..", "-x", "a/b", "a b", "ns:1", "é", strings.Repeat("n", 101)} {
		if err := kafka.Namespace(bad).Validate(); err == nil {
			t.Errorf("Validate(%q) = nil, want an error", bad)
		}
	}
}

func TestEnsureTopics(t *testing.T) {
	cl := kafkatest.Client(t)
	adm := kadm.NewClient(cl)
	partitions := func(topic string) int {
		t.Helper()
		md, err := adm.ListTopics(timeout(t, 10*time.Second), topic)
		if err != nil {
			t.Fatalf("list %s: %v", topic, err)
		}
		if err := md[topic].Err; err != nil {
			t.Fatalf("list %s: %v", topic, err)
		}
		return len(md[topic].Partitions)
	}
	deleteAfter := func(topics ...string) {
		if kafkatest.Real() {
			t.Cleanup(func() {
				// t.Context() is already cancelled in cleanup.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_, _ = adm.DeleteTopics(ctx, topics...)
			})
		}
	}

	t.Run("creates missing and tolerates existing", func(t *testing.T) {
		a, b := kafkatest.Name(t, "ensure"), kafkatest.Name(t, "ensure")
		deleteAfter(a, b)
		if err := kafka.EnsureTopics(timeout(t, 30*time.Second), cl, kafka.Layout{Partitions: 3}, a); err != nil {
			t.Fatalf("first call: %v", err)
		}
		// a exists, b does not; asking for another count leaves a alone.
		if err := kafka.EnsureTopics(timeout(t, 30*time.Second), cl, kafka.Layout{Partitions: 5}, a, b); err != nil {
			t.Fatalf("second call: %v", err)
		}
		if n := partitions(a); n != 3 {
			t.Errorf("%s has %d partitions, want the original 3", a, n)
		}
		if n := partitions(b); n != 5 {
			t.Errorf("%s has %d partitions, want 5", b, n)
		}
		// Producing right after creation must not hit an unknown topic.
		produceSync(t, cl, record(b, msg{ID: 1, Key: "k"}))
	})

	t.Run("replicas and min.insync.replicas", func(t *testing.T) {
		// As many replicas as the cluster has brokers, up to 3: the fault suite's cluster has 3.
		md, err := adm.BrokerMetadata(timeout(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		replicas := min(3, len(md.Brokers))
		topic := kafkatest.Name(t, "layout")
		deleteAfter(topic)
		l := kafka.Layout{Partitions: 2, Replication: int16(replicas), MinInsync: max(1, replicas-1)}
		if err := kafka.EnsureTopics(timeout(t, 30*time.Second), cl, l, topic); err != nil {
			t.Fatal(err)
		}
		listed, err := adm.ListTopics(timeout(t, 10*time.Second), topic)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range listed[topic].Partitions.Sorted() {
			if len(p.Replicas) != replicas {
				t.Errorf("partition %d has replicas %v, want %d", p.Partition, p.Replicas, replicas)
			}
		}
		configs, err := adm.DescribeTopicConfigs(timeout(t, 10*time.Second), topic)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := configs.On(topic, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, c := range rc.Configs {
			if c.Key == "min.insync.replicas" {
				got = c.MaybeValue()
			}
		}
		if want := fmt.Sprint(l.MinInsync); got != want {
			t.Errorf("min.insync.replicas = %q, want %q", got, want)
		}
	})

	t.Run("concurrent callers", func(t *testing.T) {
		topic := kafkatest.Name(t, "ensure")
		deleteAfter(topic)
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() {
				errs[i] = kafka.EnsureTopics(timeout(t, 30*time.Second), cl, kafka.Layout{Partitions: 2}, topic)
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("caller %d: %v", i, err)
			}
		}
		if n := partitions(topic); n != 2 {
			t.Errorf("%s has %d partitions, want 2", topic, n)
		}
	})

	t.Run("no topics", func(t *testing.T) {
		if err := kafka.EnsureTopics(timeout(t, time.Second), cl, kafka.Layout{Partitions: 1}); err != nil {
			t.Errorf("EnsureTopics() = %v", err)
		}
	})

	t.Run("colliding name", func(t *testing.T) {
		// Kafka rejects a topic that differs from another only in '.'
		// versus '_' (their metric names would collide).
		topic := kafkatest.Name(t, "ensure")
		deleteAfter(topic)
		if err := kafka.EnsureTopics(timeout(t, 30*time.Second), cl, kafka.Layout{Partitions: 1}, topic); err != nil {
			t.Fatal(err)
		}
		collide := strings.ReplaceAll(topic, ".", "_")
		if err := kafka.EnsureTopics(timeout(t, 10*time.Second), cl, kafka.Layout{Partitions: 1}, collide); err == nil {
			deleteAfter(collide)
			t.Errorf("EnsureTopics created %s next to %s", collide, topic)
		}
	})
}
