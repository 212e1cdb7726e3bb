// Package kafkatest gives tests a Kafka-protocol broker and isolated names on
// it.
//
// By default every test gets a fresh in-memory kfake cluster (franz-go's
// Kafka implementation, in process, no Docker). When the environment sets
// CAREHUB_TEST_KAFKA_BROKERS (comma-separated host:port, e.g. by
// `make test-kafka`), every test uses that real Apache Kafka instead. The
// same suites run unchanged against both, which is the point: tests must
// not depend on kfake quirks nor on a broker of their own. On a shared
// broker, isolation comes from names: take topics from Topic and groups from
// Group, never fixed names.
package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka"
)

// EnvBrokers names the environment variable that points tests at a real
// broker.
const EnvBrokers = "CAREHUB_TEST_KAFKA_BROKERS"

// Partitions is the partition count of topics made by Topic.
const Partitions = 6

var (
	mu       sync.Mutex
	clusters = map[testing.TB][]string{}
	seq      atomic.Uint64
	runID    = randomHex(3)
)

// Real reports whether tests run against a real broker (EnvBrokers is set).
func Real() bool { return os.Getenv(EnvBrokers) != "" }

// Brokers returns the seed brokers for t: those in CAREHUB_TEST_KAFKA_BROKERS
// when it is set, else those of a kfake cluster started for t (three
// brokers, in memory, no automatic topic creation) and closed when t ends.
// Calls with the same t return the same brokers.
func Brokers(t testing.TB) []string {
	t.Helper()
	if env := os.Getenv(EnvBrokers); env != "" {
		var out []string
		for b := range strings.SplitSeq(env, ",") {
			if b = strings.TrimSpace(b); b != "" {
				out = append(out, b)
			}
		}
		return out
	}
	mu.Lock()
	defer mu.Unlock()
	if addrs, ok := clusters[t]; ok {
		return addrs
	}
	// kfake's warnings and errors go to stderr, which go test shows for a failing package only:
	// a transaction it aborted on its own (a timeout) or a request it refused is then in the
	// failure's output, beside servertest's Kafka diagnosis.
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.WithLogger(warnings{kfake.BasicLogger(os.Stderr, kfake.LogLevelWarn)}))
	if err != nil {
		t.Fatalf("kafkatest: start kfake: %v", err)
	}
	addrs := c.ListenAddrs()
	clusters[t] = addrs
	t.Cleanup(func() {
		c.Close()
		mu.Lock()
		delete(clusters, t)
		mu.Unlock()
	})
	return addrs
}

// Client returns a client built by kafka.NewClient on t's brokers, closed
// when t ends.
func Client(t testing.TB, extra ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kafka.NewClient(kafka.ClientConfig{
		Brokers:  Brokers(t),
		ClientID: "carehub-test",
	}, extra...)
	if err != nil {
		t.Fatalf("kafkatest: client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// Topic returns a topic name unique to this call, starting with prefix, and
// creates it on t's brokers with Partitions partitions. On a real broker the
// topic is deleted when t ends, unless t failed (keep it to look at).
func Topic(t testing.TB, prefix string) string {
	t.Helper()
	name := Name(t, prefix)
	cl := Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafka.EnsureTopics(ctx, cl, kafka.Layout{Partitions: Partitions}, name); err != nil {
		t.Fatalf("kafkatest: create topic %s: %v", name, err)
	}
	if Real() {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("kafkatest: keeping topic %s of failed test", name)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// Best effort: a leftover topic costs disk, not correctness.
			_, _ = kadm.NewClient(cl).DeleteTopics(ctx, name)
		})
	}
	return name
}

// Group returns a consumer group name unique to this call, starting with
// prefix.
func Group(t testing.TB, prefix string) string {
	t.Helper()
	return Name(t, prefix)
}

var unsafe = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// Name returns a name unique to this call, valid as a Kafka topic or group:
// prefix, the test's name (for finding it on a shared broker) and a
// per-process random part with a counter.
func Name(t testing.TB, prefix string) string {
	t.Helper()
	test := unsafe.ReplaceAllString(t.Name(), "_")
	if len(test) > 80 {
		test = test[:80]
	}
	return prefix + "." + test + "." + runID + "-" + strconv.FormatUint(seq.Add(1), 10)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// warnings passes kfake's warnings and errors on, but for the slow-commit warning it gives every
// transaction that takes over 5 ms, routine on a loaded test machine (as the embedded broker's
// logger does).
type warnings struct{ kfake.Logger }

func (w warnings) Logf(level kfake.LogLevel, msg string, args ...any) {
	if strings.HasPrefix(msg, "txn: EndTxn slow") {
		return
	}
	w.Logger.Logf(level, msg, args...)
}
