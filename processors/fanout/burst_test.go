package fanout

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"carehub/kernel/events"
)

// burst is n events of project prj_1 numbered from first, as one Kafka poll of the scorer.
func burst(first, n int, payload json.RawMessage) []events.Event {
	evs := make([]events.Event, n)
	for i := range evs {
		evs[i] = events.Event{ID: fmt.Sprint(first + i), Type: "deployment.prediction", ProjectID: "prj_1", Payload: payload}
	}
	return evs
}

func counter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// work spins for d, as a GraphQL execution of an event does (a sleep would take far longer).
func work(d time.Duration) {
	for t0 := time.Now(); time.Since(t0) < d; {
	}
}

// readAll reads s until it has want events or closes, spending perEvent on each, and returns
// the ids.
func readAll(s *Subscription, want int, perEvent time.Duration) []string {
	ids := make([]string, 0, min(want, 4096))
	for len(ids) < want {
		ev, ok := <-s.C
		if !ok {
			break
		}
		ids = append(ids, ev.ID)
		work(perEvent)
	}
	return ids
}

func inOrder(t *testing.T, name string, ids []string, want int) {
	t.Helper()
	if len(ids) != want {
		t.Fatalf("%s received %d of %d events", name, len(ids), want)
	}
	for i, id := range ids {
		if id != fmt.Sprint(i) {
			t.Fatalf("%s: event %d is %s", name, i, id)
		}
	}
}

// waitPumps waits until no subscription's goroutine runs.
func waitPumps(t *testing.T, h *Hub) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.pumps.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d subscription goroutines still running", h.pumps.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBurstReachesSteadyReader: bursts of 2,000 events, each routed at once as one Kafka poll
// is, reach a subscriber that takes 20µs an event (it keeps up on average, not with a burst)
// whole and in order, without a drop; once it has caught up, its goroutine is gone and the
// burst's room let go.
func TestBurstReachesSteadyReader(t *testing.T) {
	h := newBenchHub(t)
	s := h.SubscribeFilter(DefaultBuffer, Filter{ProjectID: "prj_1", OnOverflow: func() { t.Error("steady reader dropped") }})
	defer s.Close()
	const bursts, size = 3, 2000
	got := make(chan []string, 1)
	go func() { got <- readAll(s, bursts*size, 20*time.Microsecond) }()
	payload := json.RawMessage(`{"score":0.42,"patientId":"pat_1"}`)
	for b := range bursts {
		for _, ev := range burst(b*size, size, payload) {
			h.route(ev)
		}
		time.Sleep(100 * time.Millisecond)
	}
	inOrder(t, "steady reader", <-got, bursts*size)
	if s.Overflowed() || counter(h.dropped) != 0 {
		t.Fatal("steady reader dropped")
	}
	waitPumps(t, h)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held != 0 || s.bytes != 0 || cap(s.queue) > queueKeep || s.pumping {
		t.Fatalf("after catching up: held %d, %d bytes, queue capacity %d, pumping %v", s.held, s.bytes, cap(s.queue), s.pumping)
	}
}

// TestBurstThroughKafka: the same through a running hub, a burst of 2,000 events produced in one
// request, to a subscriber taking DefaultBuffer as the GraphQL event source does.
func TestBurstThroughKafka(t *testing.T) {
	h, prod, _ := startHub(t)
	waitAssigned(t, h, prod)
	s := h.SubscribeFilter(DefaultBuffer, Filter{ProjectID: "prj_1", Types: []string{"x.y"}})
	defer s.Close()
	got := make(chan []string, 1)
	go func() { got <- readAll(s, 2000, 20*time.Microsecond) }()
	produce(t, prod, 2000, "")
	select {
	case ids := <-got:
		inOrder(t, "subscriber", ids, 2000)
	case <-time.After(30 * time.Second):
		t.Fatal("burst not delivered in 30s")
	}
	if s.Overflowed() {
		t.Fatal("subscriber dropped")
	}
}

// TestStuckSubscriberIsDropped: a subscriber that never reads is dropped (once, told by
// OnOverflow) when an event finds its buffer at its bound, while one beside it receives every
// event; what the stuck one may still read is what C held, the first events, in order.
func TestStuckSubscriberIsDropped(t *testing.T) {
	h := newBenchHub(t)
	var calls atomic.Int32
	const bound = 1000
	stuck := h.SubscribeFilter(bound, Filter{OnOverflow: func() { calls.Add(1) }})
	other := h.SubscribeFilter(DefaultBuffer, Filter{ProjectID: "prj_1"})
	defer other.Close()
	got := make(chan []string, 1)
	go func() { got <- readAll(other, 3000, 0) }()
	for i, ev := range burst(0, 3000, nil) {
		h.route(ev)
		// The stuck subscriber holds bound events, give or take what its goroutine has yet to
		// settle: never more, and it is dropped soon after.
		if i < bound-settleEvery && stuck.Overflowed() {
			t.Fatalf("dropped at event %d, before its bound of %d", i, bound)
		}
	}
	inOrder(t, "the other subscriber", <-got, 3000)
	if !stuck.Overflowed() || calls.Load() != 1 || counter(h.dropped) != 1 {
		t.Fatalf("stuck subscriber: overflowed %v, OnOverflow called %d times, dropped counter %v",
			stuck.Overflowed(), calls.Load(), counter(h.dropped))
	}
	left := readAll(stuck, bound+1, 0)
	if len(left) > channelBuffer {
		t.Fatalf("the dropped subscriber read %d events after its end, more than C holds (%d)", len(left), channelBuffer)
	}
	for i, id := range left {
		if id != fmt.Sprint(i) {
			t.Fatalf("the dropped subscriber's event %d is %s", i, id)
		}
	}
	waitPumps(t, h)
}

// TestQueueBytesBound: a subscriber that never reads events of 64 KiB is dropped once its queue
// would pass MaxQueueBytes, long before its bound in events.
func TestQueueBytesBound(t *testing.T) {
	h := newBenchHub(t)
	stuck := h.SubscribeFilter(DefaultBuffer, Filter{})
	payload := json.RawMessage(`"` + strings.Repeat("x", 64<<10-2) + `"`)
	evs := burst(0, 200, payload)
	fits := channelBuffer + h.maxBytes/eventSize(evs[0]) // C, then the queue
	for i, ev := range evs {
		h.route(ev)
		if dropped := stuck.Overflowed(); dropped != (i >= fits) {
			t.Fatalf("after event %d: dropped %v; %d events fit", i, dropped, fits)
		}
	}
	waitPumps(t, h)
}

// TestCloseDuringBurst: subscriptions closed while bursts are routed to them (readers that read
// at once, slowly, or never; some dropped meanwhile) end without a panic, their channels close,
// and their goroutines exit.
func TestCloseDuringBurst(t *testing.T) {
	h := newBenchHub(t)
	const subs = 40
	all := make([]*Subscription, subs)
	var readers sync.WaitGroup
	for i := range all {
		all[i] = h.SubscribeFilter(DefaultBuffer, Filter{})
		s := all[i]
		switch i % 3 {
		case 0: // never reads until closed
		case 1:
			readers.Go(func() {
				for range s.C {
				}
			})
		case 2:
			readers.Go(func() {
				for range s.C {
					time.Sleep(20 * time.Microsecond)
				}
			})
		}
	}
	closing := make(chan struct{})
	var routing sync.WaitGroup
	routing.Go(func() {
		for b := range 10 {
			for _, ev := range burst(b*2000, 2000, json.RawMessage(`{}`)) {
				h.route(ev)
			}
			select {
			case <-closing:
				return
			default:
			}
		}
	})
	for i, s := range all {
		if i%4 == 0 {
			time.Sleep(100 * time.Microsecond)
		}
		s.Close()
		s.Close()
	}
	close(closing)
	routing.Wait()
	readers.Wait() // every reader saw its channel close
	for i, s := range all {
		if i%3 == 0 {
			readAll(s, 1<<30, 0) // returns only once C is closed
		}
	}
	waitPumps(t, h)
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.idx.count != 0 {
		t.Fatalf("%d subscriptions left in the index", h.idx.count)
	}
}
