package kafka_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/internal/testenv"
)

func TestMain(m *testing.M) {
	// The kill -9 test re-executes this binary as the process it kills.
	testenv.ChildMain(crashChildEnv, crashChild)
	os.Exit(m.Run())
}

// testLogger logs warnings and errors into the test's output.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func timeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// msg is the value of records the tests produce: ids are unique per test,
// Seq orders the records of one key.
type msg struct {
	ID  int    `json:"id"`
	Key string `json:"key"`
	Seq int    `json:"seq"`
}

func record(topic string, m msg) *kgo.Record {
	v, _ := json.Marshal(m)
	return &kgo.Record{Topic: topic, Key: []byte(m.Key), Value: v}
}

func decode(t testing.TB, r *kgo.Record) msg {
	t.Helper()
	var m msg
	if err := json.Unmarshal(r.Value, &m); err != nil {
		t.Fatalf("record %s/%d@%d: %v", r.Topic, r.Partition, r.Offset, err)
	}
	return m
}

func produceSync(t testing.TB, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	if err := cl.ProduceSync(timeout(t, 30*time.Second), recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// consume polls cl until it has n records, failing the test after d.
func consume(t testing.TB, cl *kgo.Client, n int, d time.Duration) []*kgo.Record {
	t.Helper()
	ctx := timeout(t, d)
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records in %v", len(out), n, d)
		}
		fs.EachError(func(topic string, p int32, err error) {
			// A group the client is still (re)joining, as right after a
			// broker restart (NOT_COORDINATOR), is reported here while
			// the client keeps trying; only d bounds it.
			if _, ok := errors.AsType[*kgo.ErrGroupSession](err); ok || kerr.IsRetriable(err) {
				t.Logf("fetch %s/%d, retrying: %v", topic, p, err)
				return
			}
			t.Fatalf("fetch %s/%d: %v", topic, p, err)
		})
		out = append(out, fs.Records()...)
	}
	return out
}

// murmur2 is the Java client's Utils.murmur2, written from its definition
// so that the partitioner test compares franz-go against an independent
// implementation (itself checked against Kafka's published vectors).
func murmur2(data []byte) int32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	h := seed ^ uint32(len(data))
	n := len(data) / 4
	for i := range n {
		k := binary.LittleEndian.Uint32(data[4*i:])
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := data[4*n:]
	switch len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

// javaPartition is the Java default partitioner's choice for a keyed record.
func javaPartition(key []byte, partitions int) int32 {
	return int32(int(uint32(murmur2(key))&0x7fffffff) % partitions)
}
