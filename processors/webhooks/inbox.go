package webhooks

import (
	"sync"
	"time"
)

// Deliveries straight from the stream. A concurrent subscription with a lane on this dispatcher
// gets its new deliveries from the consumer directly: they are recorded delivering, under this
// dispatcher's lease, and handed to the lane's inbox, so a busy subscription's delivery costs
// one insert and one outcome write, with no claim or refill between them (docs/PERFORMANCE.md,
// issue 55). So that a lane still sends in about the order the events were consumed, its inbox
// accepts deliveries only once the lane has caught up with its pending ones (a refill came back
// short), and stops accepting when it fills (inboxLimit): the consumer then records them
// pending, and the lane sends what its inbox holds before it refills from those. A lane closes
// its inbox when it ends: when nothing came for laneIdle, after maxLaneLife, or when it stops.
// What the consumer records after that is pending, for the next claim. An ordered lane has no
// inbox: it must send in seq order, retries included, so it takes only what it claims and
// refills.

// laneIdle is how long a lane with an inbox waits for more before it ends: a second, so that a
// subscription whose events come every second or so keeps its lane (a claim searches every
// subscription). A lane waiting does not count against the dispatcher's MaxInFlight.
const laneIdle = time.Second

// inboxLimit bounds the deliveries waiting in one inbox.
const inboxLimit = 2048

// inbox is the deliveries the consumer handed a lane, not yet taken.
type inbox struct {
	lane      *lane
	mu        sync.Mutex
	items     []claimed
	closed    bool
	accepting bool          // its lane has caught up with its pending deliveries
	spilled   bool          // deliveries were recorded pending while it was full
	ready     chan struct{} // a nudge when items arrive
}

func newInbox(l *lane) *inbox { return &inbox{lane: l, ready: make(chan struct{}, 1)} }

// room is how many more deliveries it takes now: none once closed.
func (b *inbox) room() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || !b.accepting {
		return 0
	}
	return max(inboxLimit-len(b.items), 0)
}

// accept opens the inbox to the consumer: its lane has caught up with its pending deliveries.
func (b *inbox) accept() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.accepting = true
}

// spill notes that deliveries of its subscription were recorded pending because it was full: it
// accepts no more until its lane has sent what it holds and caught up with those again.
func (b *inbox) spill() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.accepting {
		b.accepting, b.spilled = false, true
		b.signal()
	}
}

func (b *inbox) signal() {
	select {
	case b.ready <- struct{}{}:
	default:
	}
}

// put adds items, or reports false when the inbox closed since room said it had some: the
// caller hands them back.
func (b *inbox) put(items []claimed) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.items = append(b.items, items...)
	b.signal()
	return true
}

// take returns what arrived since the last take, and whether deliveries were spilled meanwhile.
func (b *inbox) take() ([]claimed, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	items, spilled := b.items, b.spilled
	b.items, b.spilled = nil, false
	return items, spilled
}

// closeIfEmpty closes the inbox, unless deliveries arrived: it returns those instead and stays
// open.
func (b *inbox) closeIfEmpty() []claimed {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.items) > 0 {
		items := b.items
		b.items = nil
		return items
	}
	b.closed = true
	return nil
}

// close closes the inbox and returns what it still held.
func (b *inbox) close() []claimed {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	items := b.items
	b.items = nil
	return items
}

// laneStarted and laneEnded keep the set of subscriptions this dispatcher serves a lane of, with
// the lane's inbox (nil for an ordered lane). Deliveries of those subscriptions are the lanes'
// to take: they wake no claim.
func (d *Dispatcher) laneStarted(l *lane) {
	// A subscription sent one at a time is promised its first attempts in order (docs/WEBHOOKS.md):
	// it takes only what it claims and refills, as an ordered one does. A hand-over can overtake
	// deliveries recorded pending while the lane's last refill ran.
	if !l.settings.Ordered && l.settings.MaxInFlight > 1 {
		l.box = newInbox(l)
	}
	d.servingMu.Lock()
	defer d.servingMu.Unlock()
	if d.serving == nil {
		d.serving = map[string]*inbox{}
	}
	d.serving[l.webhookID] = l.box
}

func (d *Dispatcher) laneEnded(id string) {
	d.servingMu.Lock()
	defer d.servingMu.Unlock()
	delete(d.serving, id)
}

// served returns the subscriptions with a lane on this dispatcher.
func (d *Dispatcher) served() []string {
	d.servingMu.Lock()
	defer d.servingMu.Unlock()
	out := make([]string, 0, len(d.serving))
	for id := range d.serving {
		out = append(out, id)
	}
	return out
}

// servedHere reports whether id has a lane on this dispatcher.
func (d *Dispatcher) servedHere(id string) bool {
	d.servingMu.Lock()
	defer d.servingMu.Unlock()
	_, ok := d.serving[id]
	return ok
}

// inboxes returns the open inboxes of ids' lanes on this dispatcher, and whether every one of ids
// has a lane here.
func (d *Dispatcher) inboxes(ids []string) (map[string]*inbox, bool) {
	d.servingMu.Lock()
	defer d.servingMu.Unlock()
	boxes, all := map[string]*inbox{}, true
	for _, id := range ids {
		b, ok := d.serving[id]
		all = all && ok
		if b != nil {
			boxes[id] = b
		}
	}
	return boxes, all
}
