// Package fanout routes platform events from Kafka to the subscribers of this node. Every carehub
// API node reads carehub.events.v1 without a consumer group (all partitions, from the tail), so
// any node can serve any subscriber and a subscriber on one node sees events caused through
// another. Each subscriber has a bounded buffer: one too slow to keep up is dropped (its channel
// closed with Overflowed set) instead of stalling the others or growing memory.
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
	h := &Hub{cl: cl, logger: cfg.Logger, idx: newIndex()}
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
	// was full, before C is closed: the end of C alone looks like any other end, and a consumer
	// that passes events on (a WebSocket subscription) should tell its client it fell behind
	// rather than that the stream is over. It runs on the hub's goroutine and must not block.
	OnOverflow func()
}

// Overflowed reports whether the subscription ended because its buffer filled up.
func (s *Subscription) Overflowed() bool { return s.overflowed.Load() }

// Close ends the subscription. It is idempotent.
func (s *Subscription) Close() { s.hub.remove(s) }

// Subscribe registers a subscriber of every event with a buffer of n events (n ≥ 1).
func (h *Hub) Subscribe(n int) *Subscription { return h.SubscribeFilter(n, Filter{}) }

// SubscribeFilter registers a subscriber of the events f selects with a buffer of n events
// (n ≥ 1). It receives the events routed after it returns, in the order the hub reads them.
func (h *Hub) SubscribeFilter(n int, f Filter) *Subscription {
	if n < 1 {
		n = 1
	}
	c := make(chan events.Event, n)
	if f.Types != nil {
		f.Types = slices.Clone(f.Types) // the index keeps it
	}
	s := &Subscription{C: c, c: c, hub: h, filter: f}
	h.mu.Lock()
	h.idx.add(s)
	h.mu.Unlock()
	return s
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

func (h *Hub) end(s *Subscription) {
	h.mu.Lock()
	h.idx.remove(s)
	h.mu.Unlock()
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

// route hands ev to every subscription that selects it, without blocking: a full buffer drops
// that subscriber.
func (h *Hub) route(ev events.Event) {
	if !ev.CreatedAt.IsZero() {
		h.latency.Observe(time.Since(ev.CreatedAt).Seconds())
	}
	var slow []*Subscription
	delivered := 0
	h.mu.RLock()
	h.idx.each(ev, func(s *Subscription) {
		select {
		case s.c <- ev:
			delivered++
		default:
			slow = append(slow, s)
		}
	})
	h.mu.RUnlock()
	h.delivered.Add(float64(delivered))
	for _, s := range slow {
		h.drop(s)
	}
}
