// Package fanout routes platform events from Kafka to the subscribers of this node. Every carehub
// API node reads carehub.events.v1 without a consumer group (all partitions, from the tail), so
// any node can serve any subscriber and a subscriber on one node sees events caused through
// another. Each subscriber has a bounded buffer: one too slow to keep up is dropped (its channel
// closed with Overflowed set) instead of stalling the others or growing memory.
//
// The buffer absorbs bursts: the scorer emits its predictions in bursts of up to 2,000 events
// (one Kafka poll), which the hub routes in about a millisecond while a GraphQL subscription
// executes tens of microseconds an event. A subscription's buffer is a small channel (C) and,
// behind it, a queue that grows with a burst and lets its room go once the subscriber has
// caught up; a goroutine of the subscription moves the queue into C, and exists only while the
// queue holds events. The queue is bounded in events and in bytes, whichever fills first (see
// SubscribeFilter): only a subscriber behind by more than that is dropped.
//
// Subscriptions may name the project and the event types they want (Filter). The hub indexes
// them by project and, for exact types, by type (index.go), so an event visits only the
// subscriptions that may want it, not every subscription of the node; and an event a
// subscription does not select is never sent, so it neither wakes the subscriber nor takes room
// in its buffer. With thousands of subscriptions that is the difference between one channel
// send per subscription per event on the hub goroutine and a handful. The hub reads an event's
// head first (events.PeekHead) and decodes only the events a subscription may select.
package fanout

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/config"
	"carehub/kernel/events"
	"carehub/storage/kafka"
)

// Hub reads the events topic and delivers each event to every current subscriber.
type Hub struct {
	cl     *kgo.Client
	logger *slog.Logger

	// mu guards idx and every Subscription's refs. route holds it for reading while it visits
	// an event's subscriptions; Subscribe and Close take it for writing, so they wait for an
	// event being routed.
	mu  sync.RWMutex
	idx index

	// maxBytes bounds the bytes (eventSize) a subscription's queue holds: MaxQueueBytes, less
	// in tests.
	maxBytes int
	// pumps is the number of subscriptions' goroutines running (tests).
	pumps atomic.Int64

	delivered prometheus.Counter
	dropped   prometheus.Counter
	latency   prometheus.Histogram
	active    prometheus.GaugeFunc
}

// Config configures a Hub. Zero fields take their defaults.
type Config struct {
	Brokers     []string          // required
	Credentials kafka.Credentials // authenticate to brokers that require SASL
	Topic       string            // default kafka.DefaultTopics().Events
	Logger      *slog.Logger
	Registerer  prometheus.Registerer
	// ClientOpts are extra franz-go options (tests).
	ClientOpts []kgo.Opt
}

func (c *Config) defaults() {
	config.Default(&c.Topic, kafka.DefaultTopics().Events)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// New returns a hub reading cfg.Topic from its end as of now, before Run starts it: the node
// reports ready only after New, so an event produced once the node is ready is never missed (a
// plain "start at the end" would be resolved at the first fetch, after some events).
func New(cfg Config) (*Hub, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("fan-out: no brokers")
	}
	cfg.defaults()
	start := kgo.ConsumeTopics(cfg.Topic)
	if ends, err := endOffsets(cfg); err == nil && len(ends) > 0 {
		start = kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{cfg.Topic: ends})
	} else {
		cfg.Logger.Warn("fan-out: reading from the end at first fetch", "err", err)
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID("carehub-fanout"),
		start,
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.MetadataMaxAge(10 * time.Second),
	}, append(cfg.Credentials.Opts(), cfg.ClientOpts...)...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	h := &Hub{cl: cl, logger: cfg.Logger, idx: newIndex(), maxBytes: MaxQueueBytes}
	h.delivered = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "fanout",
		Name: "events_delivered_total", Help: "Events handed to subscribers on this node."})
	h.dropped = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "fanout",
		Name: "slow_subscribers_dropped_total", Help: "Subscribers dropped because their buffer was full."})
	h.latency = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "carehub", Subsystem: "fanout",
		Name: "event_age_seconds", Help: "Age of events (createdAt to fan-out) when routed to subscribers.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)})
	h.active = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "carehub", Subsystem: "fanout",
		Name: "subscribers", Help: "Current subscribers on this node."}, func() float64 {
		h.mu.RLock()
		defer h.mu.RUnlock()
		return float64(h.idx.count)
	})
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(h.delivered, h.dropped, h.latency, h.active)
	}
	return h, nil
}

// endOffsets returns the current end offset of every partition of cfg.Topic.
func endOffsets(cfg Config) (map[int32]kgo.Offset, error) {
	cl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, cfg.Credentials.Opts()...), cfg.ClientOpts...)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	listed, err := kadm.NewClient(cl).ListEndOffsets(ctx, cfg.Topic)
	if err != nil {
		return nil, err
	}
	if err := listed.Error(); err != nil {
		return nil, err
	}
	out := map[int32]kgo.Offset{}
	listed.Each(func(o kadm.ListedOffset) { out[o.Partition] = kgo.NewOffset().At(o.Offset) })
	return out, nil
}

// Subscription is one subscriber's stream. C is closed when the subscription ends: by Close, by
// the hub stopping, or because the subscriber fell behind (then Overflowed reports true).
type Subscription struct {
	C          <-chan events.Event
	c          chan events.Event
	hub        *Hub
	filter     Filter
	refs       []ref // where the index holds it; guarded by hub.mu
	once       sync.Once
	overflowed atomic.Bool

	// mu guards what follows. While pumping is false the hub sends to c itself, without
	// waiting; once c is full it queues events instead and starts pump, which alone sends to c
	// until it has emptied the queue. Whoever sends to c last closes it: end when not pumping,
	// else pump (end closes done to tell it).
	mu      sync.Mutex
	queue   []events.Event // waiting behind c, oldest first
	held    int            // events queued or taken by pump and not yet all sent to c
	bytes   int            // their eventSize
	maxHeld int            // bound of held: n less cap(c)
	pumping bool
	ended   bool
	done    chan struct{} // made when pump first starts; closed by end while pumping
}

// Filter selects the events a subscription receives. The zero Filter selects every event.
type Filter struct {
	// ProjectID, when not empty, selects the events of that project only. Such subscriptions are
	// indexed by project: events of other projects never visit them.
	ProjectID string
	// Types, when not nil, selects the events whose type matches one of these patterns: an exact
	// type, prefix.* or * (kernel/events.MatchAny); an empty list selects nothing. When every
	// pattern is an exact type the subscription is indexed by type too.
	Types []string
	// Match, when not nil, must also accept an event for it to be sent. It runs on the hub's
	// goroutine for every event the other fields select, so it must be cheap and must not block.
	Match func(events.Event) bool
	// OnOverflow, when not nil, is called when the subscription is dropped because its buffer
	// (channel and queue) was full, before C is closed: the end of C alone looks like any other
	// end, and a consumer that passes events on (a WebSocket subscription) should tell its client
	// it fell behind rather than that the stream is over. It runs on the hub's goroutine and must
	// not block.
	OnOverflow func()
}

// Overflowed reports whether the subscription ended because its buffer filled up.
func (s *Subscription) Overflowed() bool { return s.overflowed.Load() }

// Close ends the subscription. It is idempotent.
func (s *Subscription) Close() { s.hub.remove(s) }

// Buffer bounds. DefaultBuffer is the n a subscription that may be sent bursts (a GraphQL
// subscription of predictions, say) should take: two of the scorer's bursts of 2,000 events and
// more. The memory it may hold is bounded by MaxQueueBytes too, and is held only while the
// subscriber is behind: what a subscription allocates up front is a channel of at most
// channelBuffer events (a few KiB).
const (
	DefaultBuffer = 8192
	// MaxQueueBytes bounds the bytes a subscription's queue holds (eventSize: an event's payload
	// and its own size). A payload is shared by every subscription that holds its event, so this
	// is what one subscription can keep alive, not what it copies.
	MaxQueueBytes = 4 << 20
	// channelBuffer is the most C buffers; the rest of n waits in the queue.
	channelBuffer = 16
	// queueKeep is the capacity the queue keeps for the next burst once the subscriber has
	// caught up; a larger one, left by a burst, is let go.
	queueKeep = 32
	// settleEvery is how many events pump sends between two updates of what is held.
	settleEvery = 64
)

// eventSize is what ev weighs against MaxQueueBytes.
func eventSize(ev events.Event) int { return int(unsafe.Sizeof(ev)) + len(ev.Payload) }

// Subscribe registers a subscriber of every event with a buffer of n events (n ≥ 1).
func (h *Hub) Subscribe(n int) *Subscription { return h.SubscribeFilter(n, Filter{}) }

// SubscribeFilter registers a subscriber of the events f selects with a buffer of n events
// (n ≥ 1): the subscription is dropped when an event finds n events waiting for its reader, or
// MaxQueueBytes of them waiting behind C. Up to 16 of them wait in C; the rest in a queue
// allocated as events arrive and let go once the reader has caught up, so n may be large
// (DefaultBuffer) at no cost until a burst needs it. The subscription receives the events routed
// after it returns, in the order the hub reads them.
func (h *Hub) SubscribeFilter(n int, f Filter) *Subscription {
	if n < 1 {
		n = 1
	}
	c := make(chan events.Event, min(n, channelBuffer))
	if f.Types != nil {
		f.Types = slices.Clone(f.Types) // the index keeps it
	}
	s := &Subscription{C: c, c: c, hub: h, filter: f, maxHeld: n - cap(c)}
	h.mu.Lock()
	h.idx.add(s)
	h.mu.Unlock()
	return s
}

// push hands ev to s without waiting: into C while nothing is queued and C has room, else onto
// the queue. It reports false when the queue is at its bound: s is to be dropped. An empty queue
// takes ev whatever its size (a queue of one event is bounded by the event's).
func (s *Subscription) push(ev events.Event) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return true // its owner is closing it: nothing to deliver or drop
	}
	if !s.pumping {
		select {
		case s.c <- ev:
			return true
		default:
		}
	}
	size := eventSize(ev)
	if s.held >= s.maxHeld || (s.held > 0 && s.bytes+size > s.hub.maxBytes) {
		return false
	}
	s.queue = append(s.queue, ev)
	s.held++
	s.bytes += size
	if !s.pumping {
		s.pumping = true
		if s.done == nil {
			s.done = make(chan struct{})
		}
		s.hub.pumps.Add(1)
		go s.pump()
	}
	return true
}

// pump moves the queue into C until the queue is empty (then the hub sends to C itself again)
// or the subscription ends (then it closes C). It takes all the events queued at once, and
// settles what it has sent (held, bytes) every settleEvery events, so a burst takes the
// subscription's lock a few times rather than once an event, and the bound counts what the
// reader has yet to receive, give or take settleEvery events. The hub does not wake it: while it
// runs, an event queued is one it will find when it comes back for the queue.
func (s *Subscription) pump() {
	defer s.hub.pumps.Add(-1)
	var batch []events.Event // taken from the queue, being sent
	sent, sentBytes := 0, 0  // sent and not yet settled
	for {
		s.mu.Lock()
		s.held -= sent
		s.bytes -= sentBytes
		sent, sentBytes = 0, 0
		if s.ended {
			s.queue = nil
			close(s.c)
			s.mu.Unlock()
			return
		}
		if len(s.queue) == 0 { // caught up
			s.pumping = false
			s.mu.Unlock()
			return
		}
		spare := batch[:0]
		if cap(spare) > queueKeep {
			spare = nil // a burst's room is let go
		}
		batch, s.queue = s.queue, spare
		s.mu.Unlock()
	send:
		for i, ev := range batch {
			select {
			case s.c <- ev:
			case <-s.done:
				break send
			}
			batch[i] = events.Event{} // no longer kept alive by s
			sent++
			sentBytes += eventSize(ev)
			if sent == settleEvery && i < len(batch)-1 {
				s.mu.Lock()
				s.held -= sent
				s.bytes -= sentBytes
				s.mu.Unlock()
				sent, sentBytes = 0, 0
			}
		}
	}
}

func (h *Hub) remove(s *Subscription) { s.once.Do(func() { h.end(s) }) }

// drop ends a subscription whose buffer was full, unless it has ended already (its owner may be
// closing it right now): only then is it Overflowed and told so.
func (h *Hub) drop(s *Subscription) {
	s.once.Do(func() {
		s.overflowed.Store(true)
		h.dropped.Inc()
		if s.filter.OnOverflow != nil {
			s.filter.OnOverflow()
		}
		h.end(s)
	})
}

// end takes s out of the index and closes C, at once or, while pump sends to it, by pump: the
// events already in C stay there for the reader, the queued ones are let go.
func (h *Hub) end(s *Subscription) {
	h.mu.Lock()
	h.idx.remove(s)
	h.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	if s.pumping {
		close(s.done)
		return
	}
	s.queue = nil
	close(s.c)
}

// Run reads events until ctx is done, then ends every subscription and closes the client.
func (h *Hub) Run(ctx context.Context) error {
	defer func() {
		h.cl.Close()
		h.mu.Lock()
		subs := h.idx.all()
		h.mu.Unlock()
		for _, s := range subs {
			s.Close()
		}
	}()
	for {
		fetches := h.cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		fetches.EachError(func(topic string, p int32, err error) {
			h.logger.Warn("fan-out fetch error", "topic", topic, "partition", p, "err", err)
		})
		if !h.listened() {
			continue // nobody to route to: not worth decoding (every event passes here)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if head, ok := events.PeekHead(r.Value); ok && !h.wanted(head) {
				return // no subscription selects it: not worth decoding either
			}
			var ev events.Event
			if err := json.Unmarshal(r.Value, &ev); err != nil || ev.ID == "" {
				h.logger.Warn("fan-out: skipping malformed event", "partition", r.Partition, "offset", r.Offset)
				return
			}
			h.route(ev)
		})
	}
}

// listened reports whether the node has any subscription.
func (h *Hub) listened() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.idx.count > 0
}

// wanted reports whether a subscription may select an event with head hd.
func (h *Hub) wanted(hd events.Head) bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.idx.wants(hd)
}

// route hands ev to every subscription that selects it, without blocking: a full buffer (channel
// and queue) drops that subscriber.
func (h *Hub) route(ev events.Event) {
	if !ev.CreatedAt.IsZero() {
		h.latency.Observe(time.Since(ev.CreatedAt).Seconds())
	}
	var slow []*Subscription
	delivered := 0
	h.mu.RLock()
	h.idx.each(ev, func(s *Subscription) {
		if s.push(ev) {
			delivered++
		} else {
			slow = append(slow, s)
		}
	})
	h.mu.RUnlock()
	h.delivered.Add(float64(delivered))
	for _, s := range slow {
		h.drop(s)
	}
}
