package graphql

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"carehub/api/ws"
	"carehub/kernel/access"
)

// sharedExecution joins members to one execution fed from the returned channel, as the
// subscription's resolver would feed it.
type sharedExecution struct {
	m   *multiplexer
	src chan any
}

func newSharedExecution() *sharedExecution {
	return &sharedExecution{m: newMultiplexer(nil), src: make(chan any)}
}

func (x *sharedExecution) join(t *testing.T) (*member, func()) {
	t.Helper()
	mb, leave, err := x.m.join("k", &access.Principal{OrgID: "org_1"}, func(context.Context) (<-chan any, *access.Recorder, error) {
		return x.src, nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(leave)
	return mb, leave
}

// send hands the execution results numbered from..to-1, each of about size bytes of data.
func (x *sharedExecution) send(from, to, size int) {
	for i := from; i < to; i++ {
		x.src <- &ws.Response{Data: numbered(i, size)}
	}
}

// isMember reports whether mb is still a member. It waits for the pump to finish handing out a
// result it is handing out.
func (x *sharedExecution) isMember(mb *member) bool {
	x.m.mu.Lock()
	defer x.m.mu.Unlock()
	for _, g := range x.m.groups {
		if _, ok := g.members[mb]; ok {
			return true
		}
	}
	return false
}

// members is the value of carehub_graphql_subscriptions.
func (x *sharedExecution) members(t *testing.T) float64 {
	t.Helper()
	var m dto.Metric
	if err := x.m.members.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func numbered(i, size int) json.RawMessage {
	pad := max(size-32, 0)
	return json.RawMessage(fmt.Sprintf(`{"n":%d,"pad":"%s"}`, i, bytes.Repeat([]byte("x"), pad)))
}

func resultNumber(t *testing.T, r sharedResult) int {
	t.Helper()
	var v struct{ N int }
	if err := json.Unmarshal(r.res.Data, &v); err != nil {
		t.Fatal(err)
	}
	return v.N
}

// readResults takes n results from mb, checking they are numbered from on, pausing every pauseEvery.
func readResults(t *testing.T, mb *member, from, n, pauseEvery int, pause time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := from; i < from+n; i++ {
		r, ok := mb.next(ctx)
		if !ok {
			t.Fatalf("member ended after %d results; want %d", i-from, n)
		}
		if got := resultNumber(t, r); got != i {
			t.Fatalf("result %d is numbered %d: out of order", i, got)
		}
		if pauseEvery > 0 && (i-from)%pauseEvery == pauseEvery-1 {
			time.Sleep(pause)
		}
	}
}

// TestMultiplexMemberTakesBurst: a burst of 2,000 results, the scorer's emit of one Kafka poll,
// reaches a member that reads slower than it arrives but steadily: whole, in order, without the
// member being dropped; and the member lets the burst's room go once it has caught up. (A
// member of 64 results was dropped by such a burst: issue 55.)
func TestMultiplexMemberTakesBurst(t *testing.T) {
	x := newSharedExecution()
	mb, _ := x.join(t)
	const burst = 2000
	go x.send(0, burst, 400) // a prediction's eventStream answer is a few hundred bytes
	readResults(t, mb, 0, burst, 20, time.Millisecond)
	if !x.isMember(mb) {
		t.Fatal("the member was dropped")
	}
	if got := x.members(t); got != 1 {
		t.Fatalf("carehub_graphql_subscriptions %v; want 1", got)
	}
	mb.mu.Lock()
	held := cap(mb.queue)
	mb.mu.Unlock()
	if held > memberKeep {
		t.Fatalf("the caught-up member holds room for %d results; want at most %d", held, memberKeep)
	}
}

// TestMultiplexMemberDroppedOverBound: a member that never reads is dropped once its queue is
// over its bound, in results or in bytes, while another member of the same execution keeps
// receiving every result; the dropped member is given what it had queued, then its end.
func TestMultiplexMemberDroppedOverBound(t *testing.T) {
	for _, tc := range []struct {
		name       string
		size, kept int // bytes of each result; how many the stalled member's queue takes
	}{
		{"results", 100, MemberMaxResults},
		{"bytes", 64 << 10, MemberMaxBytes / (64 << 10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newSharedExecution()
			reader, _ := x.join(t)
			stalled, _ := x.join(t)

			go x.send(0, tc.kept, tc.size)
			readResults(t, reader, 0, tc.kept, 0, 0)
			if !x.isMember(stalled) {
				t.Fatalf("the stalled member was dropped at %d results, within its bound", tc.kept)
			}
			go x.send(tc.kept, tc.kept+10, tc.size)
			readResults(t, reader, tc.kept, 10, 0, 0)
			if x.isMember(stalled) {
				t.Fatalf("the stalled member is still a member %d results past its bound", 10)
			}
			if !x.isMember(reader) {
				t.Fatal("the reading member was dropped")
			}
			if got := x.members(t); got != 1 {
				t.Fatalf("carehub_graphql_subscriptions %v; want 1", got)
			}

			readResults(t, stalled, 0, tc.kept, 0, 0)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if r, ok := stalled.next(ctx); ok {
				t.Fatalf("the dropped member was given result %d past its bound", resultNumber(t, r))
			}
			if ctx.Err() != nil {
				t.Fatal("the dropped member was not ended")
			}
		})
	}
}

// TestMultiplexMemberTakesOneLargeResult: an empty queue takes a result larger than the byte
// bound (one answer is bounded elsewhere), as the fixed buffer did; a second one behind it does
// not fit.
func TestMultiplexMemberTakesOneLargeResult(t *testing.T) {
	mb := newMember()
	large := sharedResult{res: &ws.Response{Data: numbered(0, MemberMaxBytes+1)}}
	if !mb.push(large) {
		t.Fatal("an empty member refused a result over the byte bound")
	}
	if mb.push(sharedResult{res: &ws.Response{Data: numbered(1, 100)}}) {
		t.Fatal("a member past the byte bound took another result")
	}
}

// TestMultiplexMemberBatchesWhatWaits: a member's reader takes the results waiting together (each
// batch is audited as one record), in order, at most maxAuditBatch at a time, and waits for the
// next one when none is waiting.
func TestMultiplexMemberBatchesWhatWaits(t *testing.T) {
	mb := newMember()
	for i := range maxAuditBatch + 44 {
		if !mb.push(sharedResult{res: &ws.Response{Data: numbered(i, 64)}}) {
			t.Fatalf("result %d refused", i)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	next := 0
	for _, want := range []int{maxAuditBatch, 44} {
		batch, ok := mb.nextBatch(ctx, maxAuditBatch)
		if !ok || len(batch) != want {
			t.Fatalf("batch of %d (ok %v), want %d", len(batch), ok, want)
		}
		for _, r := range batch {
			if got := resultNumber(t, r); got != next {
				t.Fatalf("result %d is numbered %d: out of order", next, got)
			}
			next++
		}
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		mb.push(sharedResult{res: &ws.Response{Data: numbered(next, 64)}})
	}()
	if batch, ok := mb.nextBatch(ctx, maxAuditBatch); !ok || len(batch) != 1 {
		t.Fatalf("after waiting: %d results (ok %v), want the 1 pushed", len(batch), ok)
	}
	mb.close()
	if _, ok := mb.nextBatch(ctx, maxAuditBatch); ok {
		t.Fatal("a closed, empty member gave a batch")
	}
}
