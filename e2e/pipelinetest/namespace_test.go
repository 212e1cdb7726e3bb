package pipelinetest_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/e2e/pipelinetest"
	"carehub/e2e/servertest"
	"carehub/processors/audit"
	"carehub/processors/eventlog"
	"carehub/processors/observations"
	"carehub/processors/webhooks"
	"carehub/processors/workflows"
	"carehub/storage/kafka"
	"carehub/storage/kafka/kafkatest"
)

// TestNamespacesShareABroker runs two nodes with different --kafka-namespace on one broker, each
// with its own database: an event published on one reaches its own log and its own events topic,
// never the other's, and each node's consumer groups and topics are named in its namespace.
func TestNamespacesShareABroker(t *testing.T) {
	cfgA, cfgB := servertest.Config(t), servertest.Config(t)
	if !kafkatest.Real() { // one kfake cluster per test: both configs name the same broker
		cfgA.KafkaNamespace, cfgB.KafkaNamespace = "tenant-a", "tenant-b"
	}
	if cfgA.KafkaNamespace == cfgB.KafkaNamespace || !slices.Equal(cfgA.KafkaBrokers, cfgB.KafkaBrokers) {
		t.Fatalf("want two namespaces on one broker: %q %v, %q %v", cfgA.KafkaNamespace, cfgA.KafkaBrokers, cfgB.KafkaNamespace, cfgB.KafkaBrokers)
	}
	a, b := servertest.StartConfig(t, cfgA), servertest.StartConfig(t, cfgB)
	ca := client(a)
	typ := uniqueType(t, "namespace")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	project := sepsisProject(t, ca)
	pub, err := ca.Publish(ctx, project, typ, payload{Seq: 1})
	if err != nil {
		t.Fatal(err)
	}
	servertest.Eventually(t, time.Minute, "the event in its node's log", func() bool {
		return len(readLog(t, ca, project, typ, 10).byID) == 1
	})

	// By now the event is in a's events topic; b's topic, read to its end, must not have it.
	if ids := eventIDs(t, cfgA.KafkaBrokers, a.Topics().Events); !slices.Contains(ids, pub.ID) {
		t.Errorf("%s: %d events, not %s", a.Topics().Events, len(ids), pub.ID)
	}
	if ids := eventIDs(t, cfgB.KafkaBrokers, b.Topics().Events); slices.Contains(ids, pub.ID) {
		t.Errorf("%s holds the other namespace's event %s", b.Topics().Events, pub.ID)
	}

	adm := kadm.NewClient(kafkatest.Client(t))
	base := []string{eventlog.DefaultGroup, audit.DefaultGroup, observations.DefaultGroup, webhooks.DefaultGroup,
		workflows.DefaultRunnerGroup, workflows.DefaultTriggersGroup}
	var want []string
	for _, ns := range []kafka.Namespace{kafka.Namespace(cfgA.KafkaNamespace), kafka.Namespace(cfgB.KafkaNamespace)} {
		for _, g := range base {
			want = append(want, ns.Name(g))
		}
	}
	var listed []string
	servertest.Eventually(t, time.Minute, "every consumer group of both nodes, namespaced", func() bool {
		groups, err := adm.ListGroups(ctx)
		if err != nil {
			return false
		}
		listed = groups.Groups()
		return !slices.ContainsFunc(want, func(g string) bool { return !slices.Contains(listed, g) })
	})
	if kafkatest.Real() {
		return // a shared broker has other tests' names besides these two nodes'
	}
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range append(topics.Names(), listed...) {
		if !strings.HasPrefix(name, "tenant-a.") && !strings.HasPrefix(name, "tenant-b.") {
			t.Errorf("topic or group %q is in neither namespace", name)
		}
	}
}

// eventIDs reads topic from its start to its current end and returns the ids of its events.
func eventIDs(t *testing.T, brokers []string, topic string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	remaining := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			remaining[o.Partition] = o.Offset
		}
	})
	cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: startOffsets(remaining)})
	var ids []string
	for len(remaining) > 0 {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %s: %v (partitions left %v)", topic, err, remaining)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			var ev pipelinetest.Event
			if json.Unmarshal(r.Value, &ev) == nil {
				ids = append(ids, ev.ID)
			}
			if r.Offset+1 >= remaining[r.Partition] {
				delete(remaining, r.Partition)
			}
		})
	}
	return ids
}

func startOffsets(partitions map[int32]int64) map[int32]kgo.Offset {
	out := make(map[int32]kgo.Offset, len(partitions))
	for p := range partitions {
		out[p] = kgo.NewOffset().AtStart()
	}
	return out
}
