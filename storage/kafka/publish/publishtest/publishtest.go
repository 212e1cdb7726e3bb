// Package publishtest holds the conformance suite every route of storage/kafka/publish passes,
// as storage/storagetest holds the stores'. A route's tests call TestRoute with a constructor
// that builds the route under test on the brokers it is given:
//
//	func TestAcked(t *testing.T) {
//		publishtest.TestRoute(t, func(t *testing.T, brokers []string) publishtest.Route {
//			a := publish.NewAcked(client(t, brokers))
//			return publishtest.Route{Publish: func(ctx context.Context, recs []*kgo.Record) error {
//				return a.All(ctx, recs...)
//			}}
//		})
//	}
//
// The suite pins down what the routes' doc comments promise: a published record is read back
// with its key, value, headers and timestamp; records of one key stay in one partition in the
// order published; an acknowledgement means the records are on the broker (they are read after
// the route is closed); for the all-or-none routes, an aborted publish is never read by a
// read-committed consumer and a committed one is read whole; and a publish to a broker that
// refuses connections, or to one that accepts them and never answers, fails within its bound
// (its context's deadline and the route's grace) instead of hanging. Brokers come from kafkatest: kfake by default, Apache Kafka when
// CAREHUB_TEST_KAFKA_BROKERS names one, so the same suite proves both.
package publishtest

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka/kafkatest"
)

// Route is a route as the suite drives it.
type Route struct {
	// Publish publishes recs as one call of the route and returns once the route holds them
	// durable (acknowledged, or committed), or with its error. It returns when ctx ends at the
	// latest, give or take Grace. Required.
	Publish func(ctx context.Context, recs []*kgo.Record) error
	// Abort, for an all-or-none route, publishes recs as Publish does, waits until the broker
	// has them, and aborts instead of committing. Nil for a route of single records.
	Abort func(ctx context.Context, recs []*kgo.Record) error
	// Close releases the route; the suite calls it before reading back what was acknowledged.
	// It must be idempotent: the constructor also registers it with t.Cleanup. Optional.
	Close func()
	// Grace is how long after ctx's end a Publish to a broker that refuses connections may still
	// take to fail (an all-or-none route aborts on its own bounded context). Default
	// DefaultGrace.
	Grace time.Duration
	// SilentGrace is the same for a broker that accepts connections and never answers. It is
	// longer for a transactional route: franz-go's BeginTransaction on a client that has no
	// producer id yet (a new client, or one replaced after a failure) initializes one under no
	// context, bounded only by the client's request and retry timeouts (about 40 s). Default
	// Grace.
	SilentGrace time.Duration
}

// DefaultGrace is Route.Grace's default.
const DefaultGrace = 2 * time.Second

// unreachableBound is the context deadline of a publish to a broker that does not answer.
const unreachableBound = 2 * time.Second

// TestRoute runs the suite; newRoute builds the route under test on brokers, for t alone.
func TestRoute(t *testing.T, newRoute func(t *testing.T, brokers []string) Route) {
	t.Run("ReadBack", func(t *testing.T) { testReadBack(t, newRoute(t, kafkatest.Brokers(t))) })
	t.Run("KeyOrder", func(t *testing.T) { testKeyOrder(t, newRoute(t, kafkatest.Brokers(t))) })
	t.Run("AckIsDurable", func(t *testing.T) { testAckIsDurable(t, newRoute(t, kafkatest.Brokers(t))) })
	t.Run("AbortedNeverRead", func(t *testing.T) { testAbortedNeverRead(t, newRoute(t, kafkatest.Brokers(t))) })
	t.Run("CommittedReadWhole", func(t *testing.T) { testCommittedReadWhole(t, newRoute(t, kafkatest.Brokers(t))) })
	// The two wait for their bounds, not for a broker: they run side by side.
	t.Run("RefusedFails", func(t *testing.T) {
		t.Parallel()
		r := newRoute(t, []string{refusingBroker(t)})
		testUnreachable(t, r, cmp.Or(r.Grace, DefaultGrace))
	})
	t.Run("SilentFails", func(t *testing.T) {
		t.Parallel()
		r := newRoute(t, []string{silentBroker(t)})
		testUnreachable(t, r, cmp.Or(r.SilentGrace, r.Grace, DefaultGrace))
	})
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func mustPublish(t *testing.T, r Route, recs []*kgo.Record) {
	t.Helper()
	if err := r.Publish(ctxFor(t), recs); err != nil {
		t.Fatalf("publish %d records: %v", len(recs), err)
	}
}

// keyed returns n records of topic spread over keys, each value naming its key and its number
// within the key, so order and completeness can be checked.
func keyed(topic string, keys, n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		k := "key-" + strconv.Itoa(i%keys)
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(k), Value: fmt.Appendf(nil, "%s/%05d", k, i/keys)}
	}
	return recs
}

func values(recs []*kgo.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = string(r.Value)
	}
	return out
}

// sameValues reports whether got and want hold the same values, in any order.
func sameValues(got, want []*kgo.Record) bool {
	g, w := values(got), values(want)
	slices.Sort(g)
	slices.Sort(w)
	return slices.Equal(g, w)
}

// readsExactly reads topic from the start, read-committed, and fails t unless it holds want's
// values and nothing else; what names want in the failure.
func readsExactly(t *testing.T, topic string, want []*kgo.Record, what string) {
	t.Helper()
	if got := kafkatest.ReadAll(t, topic); !sameValues(got, want) {
		t.Fatalf("read %d records %v, want %s: %d records", len(got), values(got), what, len(want))
	}
}

func testReadBack(t *testing.T, r Route) {
	topic := kafkatest.Topic(t, "publishtest")
	at := time.Date(2025, 3, 14, 9, 26, 53, 589_000_000, time.UTC) // milliseconds: Kafka's precision
	want := []*kgo.Record{
		{Topic: topic, Key: []byte("org_a"), Value: []byte(`{"n":1}`), Timestamp: at,
			Headers: []kgo.RecordHeader{{Key: "event-id", Value: []byte("evt_1")}, {Key: "empty"}}},
		{Topic: topic, Key: []byte("org_b"), Value: []byte(`{"n":2}`), Timestamp: at.Add(time.Second),
			Headers: []kgo.RecordHeader{{Key: "event-id", Value: []byte("evt_2")}}},
	}
	mustPublish(t, r, want)
	got := kafkatest.ReadAll(t, topic)
	if len(got) != len(want) {
		t.Fatalf("read %d records, want %d", len(got), len(want))
	}
	slices.SortFunc(got, func(a, b *kgo.Record) int { return a.Timestamp.Compare(b.Timestamp) })
	for i, w := range want {
		g := got[i]
		if string(g.Key) != string(w.Key) || string(g.Value) != string(w.Value) || !g.Timestamp.Equal(w.Timestamp) {
			t.Errorf("record %d: read key %q value %q at %v, want key %q value %q at %v", i, g.Key, g.Value, g.Timestamp, w.Key, w.Value, w.Timestamp)
		}
		if len(g.Headers) != len(w.Headers) {
			t.Errorf("record %d: read headers %v, want %v", i, g.Headers, w.Headers)
			continue
		}
		for j, h := range w.Headers {
			if g.Headers[j].Key != h.Key || string(g.Headers[j].Value) != string(h.Value) {
				t.Errorf("record %d header %d: read %s=%q, want %s=%q", i, j, g.Headers[j].Key, g.Headers[j].Value, h.Key, h.Value)
			}
		}
	}
}

// testKeyOrder publishes records of a few keys in two calls and reads each key's records from
// one partition in the order published.
func testKeyOrder(t *testing.T, r Route) {
	topic := kafkatest.Topic(t, "publishtest")
	const keys, n = 5, 200
	want := keyed(topic, keys, n)
	mustPublish(t, r, want[:n/2])
	mustPublish(t, r, want[n/2:])
	got := kafkatest.ReadAll(t, topic)
	if !sameValues(got, want) {
		t.Fatalf("read %d records, want the %d published", len(got), len(want))
	}
	partition := map[string]int32{}
	last := map[string]string{}
	for _, g := range got { // in partition and offset order
		k := string(g.Key)
		if p, ok := partition[k]; ok && p != g.Partition {
			t.Fatalf("key %s in partitions %d and %d", k, p, g.Partition)
		}
		partition[k] = g.Partition
		if v := string(g.Value); v <= last[k] {
			t.Fatalf("key %s: %s read after %s", k, v, last[k])
		}
		last[k] = string(g.Value)
	}
}

// testAckIsDurable closes the route as soon as it acknowledged, and reads the records back: the
// acknowledgement did not depend on the producer living on.
func testAckIsDurable(t *testing.T, r Route) {
	topic := kafkatest.Topic(t, "publishtest")
	want := keyed(topic, 7, 50)
	mustPublish(t, r, want)
	if r.Close != nil {
		r.Close()
	}
	readsExactly(t, topic, want, "after the route closed, the acknowledged")
}

// testAbortedNeverRead aborts a publish whose records reached the broker, commits another, and
// reads only the committed one's.
func testAbortedNeverRead(t *testing.T, r Route) {
	if r.Abort == nil {
		t.Skip("a route of single records: nothing to abort")
	}
	topic := kafkatest.Topic(t, "publishtest")
	aborted := keyed(topic, 7, 40)
	for _, a := range aborted {
		a.Value = append([]byte("aborted-"), a.Value...)
	}
	if err := r.Abort(ctxFor(t), aborted); err != nil {
		t.Fatalf("abort: %v", err)
	}
	committed := keyed(topic, 7, 40)
	mustPublish(t, r, committed)
	readsExactly(t, topic, committed, "the committed publish's records alone")
}

// testCommittedReadWhole publishes records over every partition in one call: a reader sees all
// of them.
func testCommittedReadWhole(t *testing.T, r Route) {
	if r.Abort == nil {
		t.Skip("a route of single records: ReadBack and AckIsDurable cover it")
	}
	topic := kafkatest.Topic(t, "publishtest")
	want := keyed(topic, 3*kafkatest.Partitions, 300)
	mustPublish(t, r, want)
	readsExactly(t, topic, want, "all of the committed publish")
}

// testUnreachable publishes to brokers that do not answer and expects an error once the
// publish's context ends (within grace), not a hang.
func testUnreachable(t *testing.T, r Route, grace time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), unreachableBound)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- r.Publish(ctx, keyed("publishtest-unreachable", 2, 4)) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("publish to a broker that does not answer succeeded")
		}
		t.Logf("failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(unreachableBound + grace):
		t.Fatalf("publish to a broker that does not answer still waiting after %v", unreachableBound+grace)
	}
}

// refusingBroker returns an address that refuses connections: a port listened on, then closed.
func refusingBroker(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// silentBroker returns the address of a listener that accepts connections and never answers,
// as a broker wedged after accepting does; it closes when t ends.
func silentBroker(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // held open, never read nor written
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-accepted
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}
