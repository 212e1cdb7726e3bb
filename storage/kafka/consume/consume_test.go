package consume_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"carehub/internal/testenv"
	"carehub/kernel/telemetry/telemetrytest"
	"carehub/storage/kafka"
	"carehub/storage/kafka/consume"
	"carehub/storage/kafka/kafkatest"
)

// A transactional session polls like a client: a consumer that commits in its transactions
// runs on the runner without Commit.
var _ consume.Source = (*kgo.GroupTransactSession)(nil)

// env is one test's topic and group on its broker.
type env struct {
	t            *testing.T
	topic, group string
	adm          *kadm.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return &env{t: t, topic: kafkatest.Topic(t, "consume"), group: kafkatest.Group(t, "consume"), adm: kadm.NewClient(kafkatest.Client(t))}
}

// produce writes values to the topic, keyed so they spread over its partitions.
func (e *env) produce(values ...string) {
	e.t.Helper()
	recs := make([]*kgo.Record, len(values))
	for i, v := range values {
		recs[i] = &kgo.Record{Topic: e.topic, Key: []byte(strconv.Itoa(i)), Value: []byte(v)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkatest.Client(e.t).ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatal(err)
	}
}

func values(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

// member is one running consumer of the group.
type member struct {
	cl       *kgo.Client
	stop     func()
	stopping chan struct{} // closed when stop has cancelled Run's context
}

// start runs a consumer of e's group with h (Commit added) until stop; max is the poll size.
func (e *env) start(cfg consume.Config, h consume.Handler) *member {
	e.t.Helper()
	cl := kafkatest.Client(e.t, append(consume.GroupOpts(e.group, e.topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	cfg.Name = "test"
	r, err := consume.New(cl, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx, h, consume.Commit(cl, nil))
	}()
	var once sync.Once
	stopping := make(chan struct{})
	m := &member{cl: cl, stopping: stopping, stop: func() { once.Do(func() { cancel(); close(stopping); <-done; cl.Close() }) }}
	e.t.Cleanup(m.stop)
	return m
}

// caughtUp reports whether the group has committed every partition's end offset.
func (e *env) caughtUp() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lag, err := e.adm.Lag(ctx, e.group)
	if err != nil {
		return false
	}
	l, ok := lag[e.group]
	if !ok || l.Error() != nil || len(l.Lag[e.topic]) != kafkatest.Partitions {
		return false
	}
	return l.Lag.Total() == 0
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, what, cond)
}

// effects is a handler's durable effect: how often each value was handled.
type effects struct {
	mu   sync.Mutex
	seen map[string]int
}

func newEffects() *effects { return &effects{seen: map[string]int{}} }

func (f *effects) add(recs ...*kgo.Record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range recs {
		f.seen[string(r.Value)]++
	}
}

func (f *effects) count(v string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seen[v]
}

// each checks every value was handled, once when once is set.
func (f *effects) each(t *testing.T, vals []string, once bool) {
	t.Helper()
	for _, v := range vals {
		if n := f.count(v); n == 0 || (once && n != 1) {
			t.Errorf("%s handled %d times", v, n)
		}
	}
}

func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return telemetrytest.Value(t, reg, name, "consumer", "test")
}

func noBackoff(int) time.Duration { return time.Millisecond }

// A failing handler gets its batch again, from the batch's first record, until it succeeds:
// nothing is skipped, nothing committed before the effect, and the failures are counted.
func TestRetryThenSuccess(t *testing.T) {
	e := newEnv(t)
	vals := values("r", 60)
	e.produce(vals...)
	reg := prometheus.NewRegistry()
	f := newEffects()
	var mu sync.Mutex
	calls := 0
	e.start(consume.Config{MaxRecords: 7, Backoff: noBackoff, Registerer: reg}, func(_ context.Context, recs []*kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 2 || calls == 3 { // the second batch fails twice, its first half "stored"
			f.add(recs[:len(recs)/2]...)
			return errors.New("store down")
		}
		f.add(recs...)
		return nil
	})
	waitFor(t, "the group to commit every record", e.caughtUp)
	f.each(t, vals, false)
	if n := metric(t, reg, "carehub_consumer_failures_total"); n != 2 {
		t.Errorf("failures counted: %v, want 2", n)
	}
	mu.Lock()
	want := float64(calls)
	mu.Unlock()
	if n := metric(t, reg, "carehub_consumer_batches_total"); n != want {
		t.Errorf("batches counted: %v, want %v (every handler call)", n, want)
	}
	if n := metric(t, reg, "carehub_consumer_handler_seconds"); n != want {
		t.Errorf("handler latency samples: %v, want %v", n, want)
	}
	if n := metric(t, reg, "carehub_consumer_records_total"); n < float64(len(vals)) {
		t.Errorf("records counted: %v, want at least %d", n, len(vals))
	}
}

// A batch whose transaction was not committed because the group rebalanced under it is read
// again at once: a member joining or leaving is routine in a group, not a fault to back off
// from. A second refusal in a row backs off as any failure does.
func TestRebalancedBatchReadAgainAtOnce(t *testing.T) {
	e := newEnv(t)
	vals := values("n", 60)
	e.produce(vals...)
	var (
		mu       sync.Mutex
		calls    int
		backoffs []int
	)
	backoff := func(attempt int) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		backoffs = append(backoffs, attempt)
		return time.Millisecond
	}
	f := newEffects()
	e.start(consume.Config{MaxRecords: 7, Backoff: backoff}, func(_ context.Context, recs []*kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		switch calls++; calls {
		case 2, 4, 5: // one rebalance, then two in a row
			return consume.ErrNotCommitted
		}
		f.add(recs...)
		return nil
	})
	waitFor(t, "the group to commit every record", e.caughtUp)
	f.each(t, vals, true)
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(backoffs, []int{2}) {
		t.Errorf("backed off at attempts %v, want only at the second refusal in a row [2]", backoffs)
	}
}

// A consumer stopped in the middle of a batch (its effect half done, nothing committed) leaves
// the batch to the next member, which handles it again; the batches committed before are not
// handed to anyone again, and no record is skipped.
func TestCommitOnlyAfterEffect(t *testing.T) {
	e := newEnv(t)
	vals := values("c", 60)
	e.produce(vals...)
	first := newEffects()
	var (
		mu        sync.Mutex
		calls     int
		committed []*kgo.Record // the batches the first member finished
		crashed   = make(chan struct{})
	)
	m := e.start(consume.Config{MaxRecords: 10}, func(ctx context.Context, recs []*kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls < 3 {
			first.add(recs...)
			committed = append(committed, recs...)
			return nil
		}
		// Half the batch is stored when the member is stopped: the store call is cut short.
		first.add(recs[:len(recs)/2]...)
		close(crashed)
		mu.Unlock()
		<-ctx.Done()
		mu.Lock()
		return ctx.Err()
	})
	<-crashed
	m.stop()

	second := newEffects()
	e.start(consume.Config{MaxRecords: 10}, func(_ context.Context, recs []*kgo.Record) error {
		second.add(recs...)
		return nil
	})
	waitFor(t, "the second member to commit every record", e.caughtUp)
	for _, v := range vals {
		if first.count(v)+second.count(v) == 0 {
			t.Errorf("%s was skipped", v)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range committed {
		if n := second.count(string(r.Value)); n != 0 {
			t.Errorf("%s was committed by the first member and handled again %d times", r.Value, n)
		}
	}
}

// A record the decoder rejects is counted, logged by position and never by value, and skipped:
// it is committed with its batch and does not hold its partition.
func TestPoisonSkippedAndCounted(t *testing.T) {
	e := newEnv(t)
	good := values("g", 40)
	all := append([]string{"poison secret-1", "{secret"}, good[:20]...)
	all = append(all, "poison secret-2", "poison secret-3")
	all = append(all, good[20:]...)
	e.produce(all...)
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	f := newEffects()
	cl := kafkatest.Client(t, append(consume.GroupOpts(e.group, e.topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	r, err := consume.New(cl, consume.Config{Name: "test", MaxRecords: 9, Registerer: reg, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	decode := func(b []byte) (string, error) {
		if bytes.HasPrefix(b, []byte("poison")) {
			return "", errors.New("not a value")
		}
		if b[0] == '{' {
			var v struct{}
			return "", json.Unmarshal(b, &v) // its error quotes the value's first bad character
		}
		return string(b), nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx, consume.Decode(r.Skip, decode, func(_ context.Context, vs []string) error {
			for _, v := range vs {
				f.add(&kgo.Record{Value: []byte(v)})
			}
			return nil
		}), consume.Commit(cl, nil))
	}()
	defer func() { cancel(); <-done }()
	waitFor(t, "the group to commit every record, poison included", e.caughtUp)
	f.each(t, good, true)
	if n := metric(t, reg, "carehub_consumer_poison_records_total"); n != 4 {
		t.Errorf("poison records counted: %v, want 4", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if bytes.Contains(logs.Bytes(), []byte("secret")) || bytes.Contains(logs.Bytes(), []byte("'s'")) {
		t.Errorf("a poison record's value reached the log:\n%s", logs.Bytes())
	}
	if n := bytes.Count(logs.Bytes(), []byte(`"offset"`)); n != 4 {
		t.Errorf("%d poison records logged by offset, want 4:\n%s", n, logs.Bytes())
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// gate holds a handler's first batch until open.
type gate struct {
	inHand, release chan struct{}
	first, opened   sync.Once
}

func newGate() *gate { return &gate{inHand: make(chan struct{}), release: make(chan struct{})} }

// hold, on the first call only, runs before, signals inHand and waits for open; it reports
// whether it held.
func (g *gate) hold(before func()) bool {
	held := false
	g.first.Do(func() {
		held = true
		if before != nil {
			before()
		}
		close(g.inHand)
		<-g.release
	})
	return held
}

func (g *gate) open() { g.opened.Do(func() { close(g.release) }) }

// While a member handles a batch the group cannot move its partitions: a member that joins
// waits (the group stays in PreparingRebalance) until the batch is handled and committed, and
// then reads on from that commit. So a clean rebalance hands nothing over twice.
func TestRebalanceWaitsForTheBatchInHand(t *testing.T) {
	e := newEnv(t)
	vals := values("b", 120)
	e.produce(vals...)
	f := newEffects()
	g := newGate()
	e.start(consume.Config{MaxRecords: 20}, func(_ context.Context, recs []*kgo.Record) error {
		g.hold(nil)
		f.add(recs...)
		return nil
	})
	t.Cleanup(g.open) // before the member stops: a failed test must not leave it waiting
	<-g.inHand
	e.start(consume.Config{MaxRecords: 20}, func(_ context.Context, recs []*kgo.Record) error {
		f.add(recs...)
		return nil
	})
	waitFor(t, "the second member's join to wait on the batch in hand", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		groups, err := e.adm.DescribeGroups(ctx, e.group)
		return err == nil && groups[e.group].State == "PreparingRebalance"
	})
	// The group cannot complete the rebalance while the batch is in hand: sample it a while
	// (with the guarantee broken it is Stable again within a heartbeat).
	for range 40 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		groups, err := e.adm.DescribeGroups(ctx, e.group)
		cancel()
		if err == nil && groups[e.group].State == "Stable" {
			t.Fatal("the group rebalanced while a member had a batch in hand")
		}
		time.Sleep(25 * time.Millisecond)
	}
	g.open()
	waitFor(t, "the group to commit every record", e.caughtUp)
	f.each(t, vals, true)
}

// With a Drain, a member asked to stop while it handles a batch finishes the batch and commits
// it: the next member handles none of it again. (Without one, the handler's context ends with
// Run's, a store call is cut short, and the next owner redoes the batch.)
func TestStopFinishesTheBatchInHand(t *testing.T) {
	e := newEnv(t)
	vals := values("s", 60)
	e.produce(vals...)
	f := newEffects()
	g := newGate()
	m := e.start(consume.Config{MaxRecords: 20, Drain: time.Minute}, func(ctx context.Context, recs []*kgo.Record) error {
		held := g.hold(func() { f.add(recs[:len(recs)/2]...) }) // the first chunk is stored …
		if !held {
			f.add(recs...)
			return nil
		}
		if err := ctx.Err(); err != nil { // … when the stop cuts the second short
			return err
		}
		f.add(recs[len(recs)/2:]...)
		return nil
	})
	t.Cleanup(g.open) // before the member stops: a failed test must not leave it waiting
	<-g.inHand
	stopped := make(chan struct{})
	go func() { m.stop(); close(stopped) }()
	<-m.stopping
	g.open()
	<-stopped
	e.start(consume.Config{MaxRecords: 20}, func(_ context.Context, recs []*kgo.Record) error {
		f.add(recs...)
		return nil
	})
	waitFor(t, "the group to commit every record", e.caughtUp)
	f.each(t, vals, true)
}

// transactor is a transactional consumer of e's group: each batch's values are produced to an
// output topic in the transaction that commits the batch.
type transactor struct {
	src    *consume.Transact
	out    string
	builds int // sessions built, read after stop
	watch  func(kgo.LogLevel, string)
	stop   func()
}

// startTransact runs a transactor with txnID whose handler calls before (if set) first; a
// non-nil error from before fails the batch after half its values are produced.
func (e *env) startTransact(txnID string, before func() error) *transactor {
	e.t.Helper()
	x := &transactor{out: kafkatest.Topic(e.t, "consume-out")}
	var err error
	x.src, err = consume.NewTransact(func(watch func(kgo.LogLevel, string)) (*kgo.GroupTransactSession, error) {
		x.builds++
		x.watch = watch
		return kafka.NewGroupTransactSession(kafka.ClientConfig{Brokers: kafkatest.Brokers(e.t), ClientID: "consume-test", Watch: watch},
			append(consume.GroupOpts(e.group, e.topic), kgo.TransactionalID(txnID), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	}, 30*time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	r, err := consume.New(x.src, consume.Config{Name: "test", MaxRecords: 10, Backoff: noBackoff})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx, func(ctx context.Context, recs []*kgo.Record) error {
			var failed error
			if before != nil {
				failed = before()
			}
			outs := make([]*kgo.Record, len(recs))
			for i, rec := range recs {
				outs[i] = &kgo.Record{Topic: x.out, Key: rec.Key, Value: rec.Value}
			}
			if failed != nil {
				outs = outs[:len(outs)/2]
			}
			if err := x.src.Session().ProduceSync(ctx, outs...).FirstErr(); err != nil {
				return err
			}
			return failed
		}, x.src.Transaction)
	}()
	var once sync.Once
	x.stop = func() { once.Do(func() { cancel(); <-done; x.src.Close() }) }
	e.t.Cleanup(x.stop)
	return x
}

// outputOnce checks the committed output holds each of vals exactly once.
func (x *transactor) outputOnce(t *testing.T, vals []string) {
	t.Helper()
	seen := map[string]int{}
	for _, rec := range kafkatest.ReadAll(t, x.out) {
		seen[string(rec.Value)]++
	}
	for _, v := range vals {
		if seen[v] != 1 {
			t.Errorf("%s output %d times, want once", v, seen[v])
		}
	}
}

// A batch whose handler fails after producing is aborted: what it produced is never read, its
// offsets are not committed, and the batch is handled again.
func TestTransactAbortsAFailedBatch(t *testing.T) {
	e := newEnv(t)
	vals := values("a", 60)
	e.produce(vals...)
	var mu sync.Mutex
	calls := 0
	x := e.startTransact(kafkatest.Name(t, "consume-txn"), func() error {
		mu.Lock()
		defer mu.Unlock()
		if calls++; calls == 2 || calls == 3 {
			return errors.New("store down")
		}
		return nil
	})
	waitFor(t, "the group to commit every record", e.caughtUp)
	x.outputOnce(t, vals)
}

// When franz-go signals that it ended a transaction with an abort although asked to commit (its
// log line; here the test gives it in the second batch), the batch counts as not committed: the
// session is replaced and the batch read again, so no record's output is lost (the abort the
// sign stands for would have dropped it; here the commit happened, so that batch is output twice).
func TestTransactSwallowedCommitReadAgain(t *testing.T) {
	e := newEnv(t)
	vals := values("s", 40)
	e.produce(vals...)
	var (
		mu    sync.Mutex
		calls int
		xp    atomic.Pointer[transactor]
	)
	x := e.startTransact(kafkatest.Name(t, "consume-txn"), func() error {
		mu.Lock()
		defer mu.Unlock()
		if calls++; calls == 2 {
			for xp.Load() == nil {
				time.Sleep(time.Millisecond)
			}
			xp.Load().watch(kgo.LogLevelInfo, "no produce succeeded in this transaction but produces were attempted; issuing an abort")
		}
		return nil
	})
	xp.Store(x)
	waitFor(t, "the group to commit every record", e.caughtUp)
	seen := map[string]int{}
	for _, rec := range kafkatest.ReadAll(t, x.out) {
		seen[string(rec.Value)]++
	}
	for _, v := range vals {
		if seen[v] == 0 {
			t.Errorf("%s never output", v)
		}
	}
	x.stop()
	if x.builds < 2 {
		t.Errorf("the session was built %d times: the one that swallowed a commit was not replaced", x.builds)
	}
}

// A transactional consumer whose session fails beyond retrying (here: fenced by another
// producer taking its transactional id while a batch is in hand) gets a new session with the
// same id and goes on: every record's output is committed exactly once, with the input's
// offsets, and the failed session's batch is read again rather than lost.
func TestTransactRenewedAfterAFatalError(t *testing.T) {
	e := newEnv(t)
	vals := values("x", 80)
	e.produce(vals...)
	txnID := kafkatest.Name(t, "consume-txn")
	g := newGate()
	x := e.startTransact(txnID, func() error { g.hold(nil); return nil })
	t.Cleanup(g.open) // before the consumer stops: a failed test must not leave it waiting

	<-g.inHand
	// Another producer initializes the transactional id: the session in use is fenced, and no
	// transaction of it can end any more.
	fence := kmsg.NewPtrInitProducerIDRequest()
	fence.TransactionalID = &txnID
	fence.TransactionTimeoutMillis = 10_000
	if resp, err := fence.RequestWith(context.Background(), kafkatest.Client(t)); err != nil || resp.ErrorCode != 0 {
		t.Fatalf("fencing the session: %v, %+v", err, resp)
	}
	g.open()

	waitFor(t, "the group to commit every record", e.caughtUp)
	x.outputOnce(t, vals)
	x.stop()
	if x.builds < 2 {
		t.Errorf("the session was built %d times: the fenced one was not replaced", x.builds)
	}
}

// TestSelect: next gets only the records keep returns, is not called for none, and keep's
// error is the batch's.
func TestSelect(t *testing.T) {
	recs := []*kgo.Record{{Offset: 0}, {Offset: 1}, {Offset: 2}}
	var got []int64
	next := func(_ context.Context, rs []*kgo.Record) error {
		for _, r := range rs {
			got = append(got, r.Offset)
		}
		return nil
	}
	odd := func(_ context.Context, rs []*kgo.Record) ([]*kgo.Record, error) {
		var out []*kgo.Record
		for _, r := range rs {
			if r.Offset%2 == 1 {
				out = append(out, r)
			}
		}
		return out, nil
	}
	if err := consume.Select(odd, next)(context.Background(), recs); err != nil || fmt.Sprint(got) != "[1]" {
		t.Fatalf("kept %v, %v; want [1]", got, err)
	}
	got = nil
	if err := consume.Select(odd, next)(context.Background(), recs[:1]); err != nil || got != nil {
		t.Fatalf("next called with %v (%v) for no record kept", got, err)
	}
	failed := errors.New("subscriptions unavailable")
	keepFails := func(context.Context, []*kgo.Record) ([]*kgo.Record, error) { return nil, failed }
	if err := consume.Select(keepFails, next)(context.Background(), recs); !errors.Is(err, failed) || got != nil {
		t.Fatalf("Select = %v, next got %v; want keep's error and no call", err, got)
	}
}

func TestStale(t *testing.T) {
	produced := time.Now()
	recs := []*kgo.Record{{Timestamp: produced.Add(-time.Minute)}, {Timestamp: produced}}
	if !consume.Stale(produced, recs) || !consume.Stale(time.Time{}, recs) {
		t.Error("a copy loaded before the newest record, or within the skew second, is not stale")
	}
	if consume.Stale(produced.Add(2*time.Second), recs) {
		t.Error("a copy loaded after the newest record and the skew second is stale")
	}
}
