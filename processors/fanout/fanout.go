// Package fanout routes platform events from Kafka to the subscribers of this node. Every carehub
// API node reads carehub.events.v1 without a consumer group (all partitions, from the tail), so
// any node can serve any subscriber and a subscriber on one node sees events caused through
// another. Each subscriber has a bounded buffer: one too slow to keep up is dropped (its channel
// closed with Overflowed set) instead of stalling the others or growing memory.
package fanout

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage"
)

// Hub reads the events topic and delivers each event to every current subscriber.
type Hub struct {
	cl     *kgo.Client
	logger *slog.Logger

	mu   sync.RWMutex
	subs map[*Subscription]struct{}

	delivered prometheus.Counter
	dropped   prometheus.Counter
	latency   prometheus.Histogram
	active    prometheus.GaugeFunc
}

// Config configures a Hub.
type Config struct {
	Brokers    []string
	Topic      string
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// ClientOpts are extra franz-go options (tests).
	ClientOpts []kgo.Opt
}

// New returns a hub reading cfg.Topic from its current end. Run starts it.
func New(cfg Config) (*Hub, error) {
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID("carehub-fanout"),
		kgo.ConsumeTopics(cfg.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.MetadataMaxAge(10 * time.Second),
	}, cfg.ClientOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	h := &Hub{cl: cl, logger: cfg.Logger, subs: map[*Subscription]struct{}{}}
	if h.logger == nil {
		h.logger = slog.Default()
	}
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
		return float64(len(h.subs))
	})
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(h.delivered, h.dropped, h.latency, h.active)
	}
	return h, nil
}

// Subscription is one subscriber's stream. C is closed when the subscription ends: by Close, by
// the hub stopping, or because the subscriber fell behind (then Overflowed reports true).
type Subscription struct {
	C          <-chan storage.Event
	c          chan storage.Event
	hub        *Hub
	once       sync.Once
	overflowed atomic.Bool
}

// Overflowed reports whether the subscription ended because its buffer filled up.
func (s *Subscription) Overflowed() bool { return s.overflowed.Load() }

// Close ends the subscription. It is idempotent.
func (s *Subscription) Close() { s.hub.remove(s) }

// Subscribe registers a subscriber with a buffer of n events (n ≥ 1).
func (h *Hub) Subscribe(n int) *Subscription {
	if n < 1 {
		n = 1
	}
	c := make(chan storage.Event, n)
	s := &Subscription{C: c, c: c, hub: h}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	return s
}

func (h *Hub) remove(s *Subscription) {
	s.once.Do(func() {
		h.mu.Lock()
		delete(h.subs, s)
		h.mu.Unlock()
		close(s.c)
	})
}

// Run reads events until ctx is done, then ends every subscription and closes the client.
func (h *Hub) Run(ctx context.Context) error {
	defer func() {
		h.cl.Close()
		h.mu.Lock()
		subs := make([]*Subscription, 0, len(h.subs))
		for s := range h.subs {
			subs = append(subs, s)
		}
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
		fetches.EachRecord(func(r *kgo.Record) {
			var ev storage.Event
			if err := json.Unmarshal(r.Value, &ev); err != nil || ev.ID == "" {
				h.logger.Warn("fan-out: skipping malformed event", "partition", r.Partition, "offset", r.Offset)
				return
			}
			h.route(ev)
		})
	}
}

// route hands ev to every subscriber without blocking: a full buffer drops that subscriber.
func (h *Hub) route(ev storage.Event) {
	if !ev.CreatedAt.IsZero() {
		h.latency.Observe(time.Since(ev.CreatedAt).Seconds())
	}
	var slow []*Subscription
	h.mu.RLock()
	for s := range h.subs {
		select {
		case s.c <- ev:
			h.delivered.Inc()
		default:
			slow = append(slow, s)
		}
	}
	h.mu.RUnlock()
	for _, s := range slow {
		s.overflowed.Store(true)
		h.dropped.Inc()
		s.Close()
	}
}
