package publish_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"carehub/storage/kafka/publish"
)

// TestCommitPublishesAgainWhenSwallowed: when franz-go reports a commit it turned into an abort
// (its log line is the only sign; here the test raises the sign during the first EndTxn),
// Commit publishes the records again in a new transaction and commits that one, so what it
// acknowledges is read. The first EndTxn really committed here, so the records are read twice:
// the price of a retry, which the callers' derived ids absorb.
func TestCommitPublishesAgainWhenSwallowed(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	const topic = "swallowed"
	if err := c.CreateTopic(topic, 1, nil); err != nil {
		t.Fatal(err)
	}
	p := publish.NewTransactional(publish.TransactionalConfig{Brokers: c.ListenAddrs(), Prefix: "swallowed", TxnTimeout: 30 * time.Second})
	t.Cleanup(p.Close)
	var commits atomic.Int32
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, Count: -1, Observe: true, When: func(r kmsg.Request) bool {
		if r.(*kmsg.EndTxnRequest).Commit && commits.Add(1) == 1 {
			p.Swallow(0)
		}
		return false
	}})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	txn, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := txn.Add(ctx, &kgo.Record{Topic: topic, Value: []byte("a")}, &kgo.Record{Topic: topic, Value: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	if err := txn.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if n := commits.Load(); n != 2 {
		t.Fatalf("%d EndTxn commits, want 2 (the swallowed one and the one after)", n)
	}
	if off := txn.Offsets()[0]; off < 3 {
		t.Fatalf("offsets %v are the first attempt's; want the second transaction's", txn.Offsets())
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []string
	for len(got) < 4 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	if want := []string{"a", "b", "a", "b"}; !slices.Equal(got, want) {
		t.Fatalf("read %q, want %q", got, want)
	}
}
