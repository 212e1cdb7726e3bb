package consume_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka/consume"
	"carehub/storage/kafka/kafkatest"
)

// overlapper records what Runner.Overlap did: the polls begun and ended, in order, and those
// handed to the serial handler.
type overlapper struct {
	mu       sync.Mutex
	begun    []int64 // a poll's first offset of its first partition, as an id
	ended    []int64
	held     int // polls begun and not ended
	overlaps int // polls begun while another was held
	serial   int // records handed to the handler
	f        *effects
}

func pollID(recs []*kgo.Record) int64 { return int64(recs[0].Partition)<<40 | recs[0].Offset }

// startOverlap runs a consumer of e's group with Overlap until stop. failEnd, when set, is asked
// at each end whether it fails; endWait is how long each end takes.
func (e *env) startOverlap(o *overlapper, endWait time.Duration, failEnd func(n int) bool) *member {
	e.t.Helper()
	rb := &consume.Rebalancing{}
	cl := kafkatest.Client(e.t, append(consume.GroupOpts(e.group, e.topic), rb.Opt(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	r, err := consume.New(cl, consume.Config{Name: "test", MaxRecords: 10, Backoff: noBackoff})
	if err != nil {
		e.t.Fatal(err)
	}
	ends := 0
	begin := func(_ context.Context, recs []*kgo.Record) (consume.Effect, error) {
		id := pollID(recs)
		o.mu.Lock()
		o.begun = append(o.begun, id)
		if o.held > 0 {
			o.overlaps++
		}
		o.held++
		o.mu.Unlock()
		ready := make(chan struct{})
		time.AfterFunc(endWait, func() { close(ready) })
		return consume.Effect{Ready: ready, End: func() error {
			<-ready
			o.mu.Lock()
			defer o.mu.Unlock()
			o.held--
			o.ended = append(o.ended, id)
			ends++
			if failEnd != nil && failEnd(ends) {
				return errors.New("store down")
			}
			o.f.add(recs...)
			return nil
		}}, nil
	}
	serial := func(_ context.Context, recs []*kgo.Record) error {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.serial += len(recs)
		o.f.add(recs...)
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Overlap(ctx, consume.Overlapped{Begin: begin, Commit: cl, Rebalancing: rb}, serial, consume.Commit(cl, nil)); err != nil {
			e.t.Error(err)
		}
	}()
	var once sync.Once
	m := &member{cl: cl, stopping: make(chan struct{}), stop: func() { once.Do(func() { cancel(); <-done; cl.Close() }) }}
	e.t.Cleanup(m.stop)
	return m
}

// With records buffered, the next poll is begun before the one in hand is ended; polls are still
// ended, and committed, in the order they were begun, each once, and every record's effect is
// there.
func TestOverlapBeginsTheNextPollBeforeEndingThisOne(t *testing.T) {
	e := newEnv(t)
	vals := values("o", 300)
	e.produce(vals...)
	o := &overlapper{f: newEffects()}
	e.startOverlap(o, 2*time.Millisecond, nil)
	waitFor(t, "the group to commit every record", e.caughtUp)
	o.f.each(t, vals, true)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.overlaps == 0 {
		t.Errorf("no poll was begun while another was in hand (%d polls)", len(o.begun))
	}
	if len(o.ended) != len(o.begun) {
		t.Fatalf("%d polls begun, %d ended", len(o.begun), len(o.ended))
	}
	for i := range o.begun {
		if o.begun[i] != o.ended[i] {
			t.Fatalf("poll %d: begun %x, ended %x: not ended in the order begun", i, o.begun[i], o.ended[i])
		}
	}
	if o.serial != 0 {
		t.Errorf("%d records handed to the serial handler with nothing failing", o.serial)
	}
}

// A poll whose effect fails to end is read again with the poll begun after it (whose effect is
// ended, not committed), through the serial handler; then polls overlap again. Nothing is
// skipped.
func TestOverlapFailureReadsThePollsInHandAgainOneAtATime(t *testing.T) {
	e := newEnv(t)
	vals := values("f", 300)
	e.produce(vals...)
	o := &overlapper{f: newEffects()}
	e.startOverlap(o, 2*time.Millisecond, func(n int) bool { return n == 3 })
	waitFor(t, "the group to commit every record", e.caughtUp)
	o.f.each(t, vals, false)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.serial == 0 {
		t.Error("the failed poll was not handed to the serial handler")
	}
	if o.overlaps < 2 {
		t.Errorf("%d polls overlapped: overlapping did not resume after the failure", o.overlaps)
	}
}

// A member that keeps beginning polls still lets a rebalance through: a member that joins gets
// partitions, and a clean rebalance hands nothing over twice.
func TestOverlapLetsARebalanceThrough(t *testing.T) {
	e := newEnv(t)
	vals := values("j", 3000)
	e.produce(vals...)
	first := &overlapper{f: newEffects()}
	e.startOverlap(first, 5*time.Millisecond, nil)
	waitFor(t, "the first member to end some polls", func() bool {
		first.mu.Lock()
		defer first.mu.Unlock()
		return len(first.ended) >= 5
	})
	second := &overlapper{f: newEffects()}
	e.startOverlap(second, 5*time.Millisecond, nil)
	waitFor(t, "the group to commit every record", e.caughtUp)
	second.mu.Lock()
	took := len(second.ended)
	second.mu.Unlock()
	if took == 0 {
		t.Error("the member that joined ended no poll: the rebalance waited for the first to run out of records")
	}
	for _, v := range vals {
		if n := first.f.count(v) + second.f.count(v); n != 1 {
			t.Errorf("%s handled %d times", v, n)
		}
	}
}
