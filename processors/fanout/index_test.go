package fanout

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/events"
)

func produceEvents(t *testing.T, cl *kgo.Client, evs ...events.Event) {
	t.Helper()
	recs := make([]*kgo.Record, len(evs))
	for i, ev := range evs {
		ev.CreatedAt = time.Now()
		b, _ := json.Marshal(ev)
		// One key: the events keep their order across projects.
		recs[i] = &kgo.Record{Key: []byte("k"), Value: b}
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// received reads s until an event with id last arrives and returns the ids before it.
func received(t *testing.T, s *Subscription, last string) []string {
	t.Helper()
	var ids []string
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-s.C:
			if !ok {
				t.Fatalf("subscription closed after %v", ids)
			}
			if ev.ID == last {
				return ids
			}
			if !strings.HasPrefix(ev.ID, "probe") {
				ids = append(ids, ev.ID)
			}
		case <-timeout:
			t.Fatalf("no %s after %v", last, ids)
		}
	}
}

// TestFilter: a subscription with a project receives that project's events only, Match narrows
// further, and an unfiltered subscription still receives everything.
func TestFilter(t *testing.T) {
	h, prod, _ := startHub(t)
	waitAssigned(t, h, prod)
	isLab := func(ev events.Event) bool { return ev.Type == "lab.result" || ev.ID == "end" }
	subs := map[string]*Subscription{
		"all":       h.Subscribe(100),
		"a types":   h.SubscribeFilter(100, Filter{ProjectID: "prj_a", Types: []string{"lab.result", "device.reading"}}),
		"lab.*":     h.SubscribeFilter(100, Filter{Types: []string{"lab.*"}}),
		"b device":  h.SubscribeFilter(100, Filter{ProjectID: "prj_b", Types: []string{"device.reading", "lab.result"}, Match: func(ev events.Event) bool { return ev.Type != "lab.result" || ev.ID == "end" }}),
		"a":         h.SubscribeFilter(100, Filter{ProjectID: "prj_a"}),
		"a lab":     h.SubscribeFilter(100, Filter{ProjectID: "prj_a", Match: isLab}),
		"any lab":   h.SubscribeFilter(100, Filter{Match: isLab}),
		"b":         h.SubscribeFilter(100, Filter{ProjectID: "prj_b"}),
		"c (quiet)": h.SubscribeFilter(100, Filter{ProjectID: "prj_c"}),
	}
	for _, s := range subs {
		defer s.Close()
	}
	produceEvents(t, prod,
		events.Event{ID: "1", Type: "lab.result", ProjectID: "prj_a"},
		events.Event{ID: "2", Type: "device.reading", ProjectID: "prj_a"},
		events.Event{ID: "3", Type: "lab.result", ProjectID: "prj_b"},
		events.Event{ID: "4", Type: "device.reading", ProjectID: "prj_b"},
		events.Event{ID: "5", Type: "lab.result", ProjectID: "prj_a"},
	)
	// An end marker every subscription selects, in every project.
	for _, p := range []string{"prj_a", "prj_b", "prj_c"} {
		produceEvents(t, prod, events.Event{ID: "end", Type: "lab.result", ProjectID: p})
	}
	want := map[string][]string{
		"all":       {"1", "2", "3", "4", "5"},
		"a types":   {"1", "2", "5"},
		"lab.*":     {"1", "3", "5"},
		"b device":  {"4"},
		"a":         {"1", "2", "5"},
		"a lab":     {"1", "5"},
		"any lab":   {"1", "3", "5"},
		"b":         {"3", "4"},
		"c (quiet)": nil,
	}
	for name, s := range subs {
		if got := received(t, s, "end"); !slices.Equal(got, want[name]) {
			t.Errorf("%s received %v, want %v", name, got, want[name])
		}
	}
}

// TestIndexChurn: subscriptions with every kind of filter (a project or none; no types, exact
// types, patterns, a mix, an empty list) come and go in random order; afterwards every open
// subscription receives exactly the events its filter selects by the reference semantics
// (events.MatchAny), closed ones none, and the index holds exactly the open ones.
func TestIndexChurn(t *testing.T) {
	h, prod, _ := startHub(t)
	waitAssigned(t, h, prod)
	r := rand.New(rand.NewPCG(1, 2))
	typeSets := [][]string{nil, {"a.x"}, {"a.x", "b.x"}, {"a.x", "a.x"}, {"a.*"}, {"b.x", "a.*"}, {"*"}, {}}
	type entry struct {
		s *Subscription
		f Filter
	}
	var open []entry
	for i := range 400 {
		f := Filter{Types: typeSets[r.IntN(len(typeSets))]}
		if i%5 != 0 {
			f.ProjectID = fmt.Sprintf("prj_%d", r.IntN(7))
		}
		open = append(open, entry{h.SubscribeFilter(1000, f), f})
	}
	r.Shuffle(len(open), func(i, j int) { open[i], open[j] = open[j], open[i] })
	for _, e := range open[:250] {
		e.s.Close()
		if _, ok := <-e.s.C; ok {
			t.Fatal("closed subscription's channel still open")
		}
	}
	open = open[250:]
	h.mu.RLock()
	count, all := h.idx.count, len(h.idx.all())
	h.mu.RUnlock()
	if count != len(open) || all != len(open) {
		t.Fatalf("index counts %d and holds %d subscriptions, want %d", count, all, len(open))
	}

	var evs []events.Event
	for p := range 7 {
		for _, typ := range []string{"a.x", "a.y", "b.x", "c.x"} {
			evs = append(evs, events.Event{ID: fmt.Sprintf("prj_%d/%s", p, typ), Type: typ, ProjectID: fmt.Sprintf("prj_%d", p)})
		}
	}
	// The witness sees the last event only after route has handed every earlier one out.
	witness := h.SubscribeFilter(1000, Filter{ProjectID: "prj_w"})
	defer witness.Close()
	produceEvents(t, prod, append(evs, events.Event{ID: "last", Type: "z.z", ProjectID: "prj_w"})...)
	received(t, witness, "last")

	for _, e := range open {
		var want, got []string
		for _, ev := range evs {
			if (e.f.ProjectID == "" || e.f.ProjectID == ev.ProjectID) && (e.f.Types == nil || events.MatchAny(e.f.Types, ev.Type)) {
				want = append(want, ev.ID)
			}
		}
		for _, ev := range drainNow(e.s) {
			if !strings.HasPrefix(ev.ID, "probe") && ev.ID != "last" {
				got = append(got, ev.ID)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("subscription %+v received %v, want %v", e.f, got, want)
		}
		e.s.Close()
	}
	witness.Close()
	h.mu.RLock()
	defer h.mu.RUnlock()
	if x := h.idx; x.count != 0 || x.global.any != nil || len(x.global.byType) != 0 || len(x.projects) != 0 {
		t.Fatalf("index not empty after every Close: count %d, %d projects", x.count, len(x.projects))
	}
}

// BenchmarkRoute is the hub's cost of one event with 10,000 subscriptions, each drained by a
// goroutine of its own as the GraphQL resolvers do, which also keeps 1 % of what it receives
// (one subscription in a hundred wants the event's type). "unindexed" is how subscriptions
// registered before Filter: every event visits, and wakes, every subscription. The others let
// the hub skip them: by project (10,000 subscriptions over 100 projects) and by predicate.
func BenchmarkRoute(b *testing.B) {
	const subs = 10000
	cases := []struct {
		name   string
		filter func(i int) Filter
	}{
		{"unindexed", func(int) Filter { return Filter{} }},
		{"by project", func(i int) Filter { return Filter{ProjectID: fmt.Sprintf("prj_%d", i%100)} }},
		{"by predicate", func(i int) Filter {
			want := fmt.Sprintf("t.%d", i%100)
			return Filter{Match: func(ev events.Event) bool { return ev.Type == want }}
		}},
		{"by project and predicate", func(i int) Filter {
			want := fmt.Sprintf("t.%d", i/100%100)
			return Filter{ProjectID: fmt.Sprintf("prj_%d", i%100), Match: func(ev events.Event) bool { return ev.Type == want }}
		}},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			h := newBenchHub(b)
			var kept atomic.Int64
			var wg sync.WaitGroup
			all := make([]*Subscription, subs)
			for i := range all {
				all[i] = h.SubscribeFilter(256, tc.filter(i))
				want := fmt.Sprintf("t.%d", i%100)
				wg.Go(func() {
					for ev := range all[i].C {
						if ev.Type == want { // the resolver's own check
							kept.Add(1)
						}
					}
				})
			}
			evs := make([]events.Event, 100)
			for i := range evs {
				evs[i] = events.Event{ID: "e", Type: fmt.Sprintf("t.%d", i), ProjectID: fmt.Sprintf("prj_%d", i)}
			}
			b.ResetTimer()
			for i := range b.N {
				h.route(evs[i%len(evs)])
				if i%64 == 63 {
					// Let the subscribers keep up, as they do between fetches: no drops.
					for h.pending() > 0 {
						time.Sleep(10 * time.Microsecond)
					}
				}
			}
			for h.pending() > 0 {
				time.Sleep(10 * time.Microsecond)
			}
			b.StopTimer()
			h.mu.RLock()
			left := h.idx.count
			h.mu.RUnlock()
			if left != subs {
				b.Fatalf("%d subscriptions were dropped as slow", subs-left)
			}
			for _, s := range all {
				s.Close()
			}
			wg.Wait()
			b.ReportMetric(float64(kept.Load())/float64(b.N), "kept/event")
		})
	}
}

// drainNow returns the events routed to s so far: those in C and those still queued behind it,
// which its goroutine moves into C while this reads.
func drainNow(s *Subscription) []events.Event {
	var out []events.Event
	for {
		s.mu.Lock()
		held := s.held // 0: every event routed to s is in C by now
		s.mu.Unlock()
		select {
		case ev, ok := <-s.C:
			if !ok {
				return out
			}
			out = append(out, ev)
			continue
		default:
		}
		if held == 0 {
			return out
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// newBenchHub is a hub that is never run: route is driven directly.
func newBenchHub(b testing.TB) *Hub {
	h, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Topic: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(h.cl.Close)
	return h
}

// pending is the number of events waiting in subscription buffers (channels and queues).
func (h *Hub) pending() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	n := 0
	for _, s := range h.idx.all() {
		s.mu.Lock()
		n += len(s.c) + s.held
		s.mu.Unlock()
	}
	return n
}

// TestOnOverflow: a subscription dropped for a full buffer has OnOverflow called once, before
// its channel closes; Close and the end of the hub do not call it.
func TestOnOverflow(t *testing.T) {
	h, prod, _ := startHub(t)
	waitAssigned(t, h, prod)
	var calls atomic.Int32
	var openAtCall atomic.Bool
	var slow *Subscription
	slow = h.SubscribeFilter(2, Filter{ProjectID: "prj_1", OnOverflow: func() {
		calls.Add(1)
		// C is still open: its buffer is full, so a non-blocking receive succeeds.
		select {
		case _, ok := <-slow.C:
			openAtCall.Store(ok)
		default:
		}
	}})
	closed := h.SubscribeFilter(2, Filter{ProjectID: "prj_1", OnOverflow: func() { t.Error("OnOverflow of a closed subscription") }})
	closed.Close()
	produce(t, prod, 10, "e")
	// Nothing reads C until the hub has dropped the subscription: a reader draining it as events
	// arrive would keep the buffer from ever filling.
	deadline := time.Now().Add(30 * time.Second)
	for !slow.Overflowed() {
		if time.Now().After(deadline) {
			t.Fatal("the subscription with a full buffer was not dropped")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for range slow.C {
	}
	if calls.Load() != 1 || !slow.Overflowed() || !openAtCall.Load() {
		t.Fatalf("OnOverflow called %d times (channel open then: %v), overflowed %v; want once, before the close",
			calls.Load(), openAtCall.Load(), slow.Overflowed())
	}
}

// TestIndexWants: the hub skips decoding an event when index.wants says no subscription may
// select its head, so wants must say yes whenever each would visit a subscription.
func TestIndexWants(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	projects := []string{"", "prj_a", "prj_b"}
	types := []string{"lab.result", "lab.order", "device.reading", "z.z"}
	patterns := append([]string{"lab.*", "*", "device.*"}, types...)
	for round := range 200 {
		x := newIndex()
		for range rng.IntN(4) {
			f := Filter{ProjectID: projects[rng.IntN(len(projects))]}
			if rng.IntN(4) > 0 {
				f.Types = []string{}
				for range rng.IntN(3) {
					f.Types = append(f.Types, patterns[rng.IntN(len(patterns))])
				}
			}
			x.add(&Subscription{filter: f})
		}
		for _, p := range projects[1:] {
			for _, typ := range types {
				ev := events.Event{Type: typ, ProjectID: p}
				visited := false
				x.each(ev, func(*Subscription) { visited = true })
				if got := x.wants(events.Head{Type: typ, ProjectID: p}); got != visited {
					t.Fatalf("round %d: wants(%s, %s) = %v, each visited one: %v", round, p, typ, got, visited)
				}
			}
		}
	}
}
