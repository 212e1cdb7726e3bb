package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka"
	"carehub/storage/kafka/consume"
	"carehub/storage/kafka/kafkatest"
)

// deadletter list shows what the event log set aside, by position and never by payload, and
// replay puts a record back on its source topic without the dead-letter headers.
func TestDeadLetterListAndReplay(t *testing.T) {
	ns := strings.ReplaceAll(kafkatest.Topic(t, "dl"), ".", "-")
	topics := kafka.Namespace(ns).Topics()
	cl := kafkatest.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := kafka.EnsureTopics(ctx, cl, kafka.Layout{Partitions: 2}, topics.Events, topics.EventsDLQ); err != nil {
		t.Fatal(err)
	}
	dead := &kgo.Record{Topic: topics.EventsDLQ, Key: []byte("prj_1"), Value: []byte(`{"secret":1e999999}`), Headers: []kgo.RecordHeader{
		{Key: "traceparent", Value: []byte("00-abc")},
		{Key: consume.HeaderSourceTopic, Value: []byte(topics.Events)},
		{Key: consume.HeaderSourcePartition, Value: []byte("1")},
		{Key: consume.HeaderSourceOffset, Value: []byte("42")},
		{Key: consume.HeaderConsumer, Value: []byte("eventlog")},
		{Key: consume.HeaderError, Value: []byte("the store refuses the data (SQLSTATE 22003)")},
	}}
	if err := cl.ProduceSync(ctx, dead).FirstErr(); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--kafka-brokers", strings.Join(kafkatest.Brokers(t), ","), "--kafka-namespace", ns}
	var out, errOut bytes.Buffer
	if code := run(ctx, append([]string{"deadletter", "list"}, flags...), &out, &errOut); code != 0 {
		t.Fatalf("list: exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), topics.Events+"/1@42") || !strings.Contains(out.String(), "SQLSTATE 22003") || strings.Contains(out.String(), "secret") {
		t.Errorf("list:\n%s", out.String())
	}
	out.Reset()
	if code := run(ctx, append([]string{"deadletter", "replay", "--all"}, flags...), &out, &errOut); code != 0 {
		t.Fatalf("replay: exit %d: %s", code, errOut.String())
	}
	var replayed []*kgo.Record
	for _, r := range kafkatest.ReadAll(t, topics.Events) {
		if len(r.Value) > 0 {
			replayed = append(replayed, r)
		}
	}
	if len(replayed) != 1 || string(replayed[0].Value) != string(dead.Value) || string(replayed[0].Key) != "prj_1" ||
		len(replayed[0].Headers) != 1 || replayed[0].Headers[0].Key != "traceparent" {
		t.Errorf("replayed %d records: %+v", len(replayed), replayed)
	}
	if code := run(ctx, append([]string{"deadletter", "replay"}, flags...), &out, &errOut); code != 2 {
		t.Errorf("replay without --offset or --all: exit %d, want 2", code)
	}
	if code := run(ctx, append([]string{"deadletter", "list", "--topic", "fhir"}, flags...), &out, &errOut); code != 2 {
		t.Errorf("list --topic fhir: exit %d, want 2", code)
	}
	// The audit topic's dead letters are another topic: the events' record is not there.
	out.Reset()
	if err := kafka.EnsureTopics(ctx, cl, kafka.Layout{Partitions: 2}, topics.AuditDLQ); err != nil {
		t.Fatal(err)
	}
	if code := run(ctx, append([]string{"deadletter", "list", "--topic", "audit"}, flags...), &out, &errOut); code != 0 || strings.Contains(out.String(), "@42") {
		t.Errorf("list --topic audit: exit %d:\n%s", code, out.String())
	}
}
