package graphql

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	gql "github.com/graph-gophers/graphql-go"
	"github.com/prometheus/client_golang/prometheus"

	"carehub/api/ws"
	"carehub/kernel/access"
)

// Subscriptions multiplexed: the subscriptions of one document with the same variables, opened
// by principals who see the same data (organization, mode, scopes), share one execution. Each
// event is executed, serialized and checked once for all of them, and each member only writes
// the shared bytes to its socket. A hundred dashboards on one ward's stream cost one execution,
// not a hundred; and the thousand identical subscriptions of issue 51's soak, which had made a
// 100 KB event a second 100 MB a second to execute and encode, cost one.
//
// What stays each member's own: its socket, send queue and slow-consumer handling (api/ws), the
// recheck of its credential, its audit record per message (with the patients the shared
// execution touched for that message, as its own execution would have), its operation count
// against the limits. The execution runs under a principal of the class, without the members'
// key ids, until its last member leaves.

// A member's results wait in a queue of its own, which grows as they arrive and shrinks back
// once the member has caught up. The scorer emits its predictions in bursts of up to 2,000 (one
// Kafka poll), about 4,000 a second in all, which a subscriber that keeps up on average writes
// out over half a second or so; a fixed buffer sized for that, allocated for each of several
// thousand members, would be memory held for nothing most of the time. The queue is bounded in
// results and in bytes of data, whichever fills first: a member that falls further behind is
// dropped (its operation completes) rather than slowing the others or holding memory without
// end. The bytes are the shared results' (the members of an execution hold the same ones), so
// they are what this member keeps alive, not copies. Its socket's own send queue, behind it,
// then bounds what the socket holds (4008).
const (
	// MemberMaxResults is about two bursts of the scorer.
	MemberMaxResults = 4096
	// MemberMaxBytes holds a burst of 2,000 events of 1 KiB each: a prediction's eventStream
	// answer is a few hundred bytes.
	MemberMaxBytes = 2 << 20
	// memberKeep is the capacity an emptied queue keeps for the next results; a larger one, left
	// by a burst, is let go.
	memberKeep = 64
)

// multiplexer holds the shared executions by key.
type multiplexer struct {
	mu     sync.Mutex
	groups map[string]*subGroup
	// members counts the subscriptions registered (each sees every event from then on);
	// executions the shared executions running.
	members, executions prometheus.Gauge
}

func newMultiplexer(reg prometheus.Registerer) *multiplexer {
	m := &multiplexer{groups: map[string]*subGroup{},
		members: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "carehub", Subsystem: "graphql", Name: "subscriptions",
			Help: "GraphQL subscriptions running on this node's WebSockets, each registered for the events from then on."}),
		executions: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "carehub", Subsystem: "graphql", Name: "subscription_executions",
			Help: "Executions the running subscriptions share (identical documents and variables of principals who see the same data share one)."})}
	if reg != nil {
		reg.MustRegister(m.members, m.executions)
	}
	return m
}

// subGroup is one shared execution and its members. Members are pushed to and closed only under
// the multiplexer's lock, by the group's pump.
type subGroup struct {
	cancel  context.CancelFunc
	members map[*member]struct{}
}

// sharedResult is one result of a shared execution, with the ids it touched.
type sharedResult struct {
	res       *ws.Response
	patients  []string
	resources []string // not patients
}

// size is what r weighs against MemberMaxBytes: its data, which is most of it.
func (r sharedResult) size() int { return len(r.res.Data) }

// member is one subscription of a shared execution: the results its socket has still to be
// sent, in order. The pump pushes and closes it, the member's operation takes from it
// (memberResults.Next).
type member struct {
	mu     sync.Mutex
	queue  []sharedResult // waiting from queue[head] on
	head   int
	bytes  int // the sizes of the results waiting
	closed bool
	// ready holds a token when something has happened since the reader last looked: a result
	// queued or the member closed. One token stands for any number of them.
	ready chan struct{}
	// notify, when set, is called (once) on the next result queued or on the close, in place
	// of a reader waiting (memberResults.Notify).
	notify func()
}

func newMember() *member { return &member{ready: make(chan struct{}, 1)} }

// push queues r, unless the member already has results waiting and r would take it past
// MemberMaxResults or MemberMaxBytes: then it reports false and the member is to be dropped. An
// empty queue always takes r, however large (one answer is bounded by finish), as the fixed
// buffer before it did.
func (mb *member) push(r sharedResult) bool {
	n := r.size()
	mb.mu.Lock()
	if waiting := len(mb.queue) - mb.head; waiting > 0 && (waiting >= MemberMaxResults || mb.bytes+n > MemberMaxBytes) {
		mb.mu.Unlock()
		return false
	}
	mb.compact()
	mb.queue = append(mb.queue, r)
	mb.bytes += n
	notify := mb.wake()
	mb.mu.Unlock()
	if notify != nil {
		notify()
	}
	return true
}

// compact moves the waiting results to the front of a full queue, so that a member that stays
// a little behind reuses the room of what it has taken instead of growing the queue; the
// caller holds mu.
func (mb *member) compact() {
	if mb.head == 0 || len(mb.queue) < cap(mb.queue) {
		return
	}
	n := copy(mb.queue, mb.queue[mb.head:])
	clear(mb.queue[n:])
	mb.queue, mb.head = mb.queue[:n], 0
}

// close ends the member: its reader is given what is queued, then the end.
func (mb *member) close() {
	mb.mu.Lock()
	mb.closed = true
	notify := mb.wake()
	mb.mu.Unlock()
	if notify != nil {
		notify()
	}
}

// wake tells the reader something happened, without waiting: a token already there says so.
// It returns the notify function set, if any, for the caller to call once it has let go of mu;
// the caller holds mu.
func (mb *member) wake() func() {
	select {
	case mb.ready <- struct{}{}:
	default:
	}
	notify := mb.notify
	mb.notify = nil
	return notify
}

// hasNext reports whether next would return at once: a result is queued or the member closed.
func (mb *member) hasNext() bool {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	return mb.head < len(mb.queue) || mb.closed
}

// onNext has f called once, when hasNext is true: at once if it is now.
func (mb *member) onNext(f func()) {
	mb.mu.Lock()
	if mb.head < len(mb.queue) || mb.closed {
		mb.mu.Unlock()
		f()
		return
	}
	mb.notify = f
	mb.mu.Unlock()
}

// next returns the member's next result, waiting for one; false when the member was closed and
// has nothing queued, or ctx ended.
func (mb *member) next(ctx context.Context) (sharedResult, bool) {
	for {
		r, ok, closed := mb.pop()
		if ok || closed {
			return r, ok
		}
		select {
		case <-mb.ready:
		case <-ctx.Done():
			return sharedResult{}, false
		}
	}
}

// nextBatch returns the results queued, up to most of them, waiting for one; false when the
// member was closed and has nothing queued, or ctx ended.
func (mb *member) nextBatch(ctx context.Context, most int) ([]sharedResult, bool) {
	r, ok := mb.next(ctx)
	if !ok {
		return nil, false
	}
	batch := []sharedResult{r}
	for len(batch) < most {
		r, ok, _ := mb.pop()
		if !ok {
			break
		}
		batch = append(batch, r)
	}
	return batch, true
}

// pop takes the first result queued, if any, and reports whether the member is closed.
func (mb *member) pop() (r sharedResult, ok, closed bool) {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	if mb.head == len(mb.queue) {
		return sharedResult{}, false, mb.closed
	}
	r = mb.queue[mb.head]
	mb.queue[mb.head] = sharedResult{} // the result is no longer kept alive by this member
	mb.head++
	mb.bytes -= r.size()
	if mb.head == len(mb.queue) { // caught up: a burst's room is let go
		mb.head = 0
		if cap(mb.queue) > memberKeep {
			mb.queue = nil
		} else {
			mb.queue = mb.queue[:0]
		}
	}
	return r, true, false
}

// shareKey is the key of the executions a principal's subscription may share: the document, the
// operation, the variables, and what the principal sees.
func shareKey(p *access.Principal, req ws.Request) (string, bool) {
	vars, err := json.Marshal(req.Variables) // map keys sorted: equal variables, equal bytes
	if err != nil {
		return "", false
	}
	scopes := slices.Clone(p.Scopes)
	slices.Sort(scopes)
	h := sha256.New()
	for _, part := range []string{req.Query, req.OperationName, string(vars), p.OrgID, p.Mode, strings.Join(scopes, " "),
		map[bool]string{true: "platform"}[p.Platform]} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return string(h.Sum(nil)), true
}

// classPrincipal is the principal a shared execution runs under: what the members have in
// common, none of their credentials.
func classPrincipal(p *access.Principal) *access.Principal {
	return &access.Principal{OrgID: p.OrgID, Mode: p.Mode, Scopes: slices.Clone(p.Scopes), Platform: p.Platform}
}

// join adds a member to the execution of key, starting it with start when there is none, and
// returns the member (its results) and the function that makes it leave (idempotent). The
// member is closed when the execution ends or the member is dropped. start runs under the lock,
// so that two first members do not start two executions; it is the subscription's set-up (its
// resolver's checks), once per group.
func (m *multiplexer) join(key string, p *access.Principal, start func(ctx context.Context) (<-chan any, *access.Recorder, error)) (*member, func(), error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.groups[key]
	if g == nil {
		ctx, cancel := context.WithCancel(access.With(context.Background(), classPrincipal(p)))
		src, rec, err := start(ctx)
		if err != nil {
			cancel()
			return nil, nil, err
		}
		g = &subGroup{cancel: cancel, members: map[*member]struct{}{}}
		m.groups[key] = g
		m.executions.Inc()
		go m.pump(key, g, src, rec)
	}
	mb := newMember()
	g.members[mb] = struct{}{}
	m.members.Inc()
	var once sync.Once
	leave := func() { once.Do(func() { m.leave(key, g, mb) }) }
	return mb, leave, nil
}

// leave removes a member; the last one ends the execution.
func (m *multiplexer) leave(key string, g *subGroup, mb *member) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := g.members[mb]; !ok {
		return // dropped, or the execution ended
	}
	m.remove(g, mb)
	if len(g.members) == 0 {
		m.end(key, g)
	}
}

// end stops g's execution and forgets it; the caller holds mu. The pump drains what it still
// yields and closes the members left.
func (m *multiplexer) end(key string, g *subGroup) {
	if m.groups[key] == g {
		delete(m.groups, key)
	}
	g.cancel()
}

// pump hands each result of src to every member. A result that is an error alone (the
// subscription refused as it started) ends the group for later joiners, who start afresh.
func (m *multiplexer) pump(key string, g *subGroup, src <-chan any, rec *access.Recorder) {
	for item := range src {
		res, ok := item.(*ws.Response)
		if !ok {
			continue
		}
		r := sharedResult{res: res}
		if rec != nil {
			r.patients = rec.PatientIDs()
			r.resources = others(rec.ResourceIDs(), r.patients)
			rec.Reset()
		}
		m.mu.Lock()
		refused := len(res.Data) == 0 && len(res.Errors) > 0
		if refused && m.groups[key] == g {
			delete(m.groups, key)
		}
		for mb := range g.members {
			switch {
			case refused:
				// Done: out of the count before the error can reach its client (who may look at
				// the count once it reads the error), then the error and the end, now rather than
				// when the execution's channel closes, so no refused subscription counts as running.
				m.remove(g, mb)
				mb.push(r)
				mb.close()
			case !mb.push(r): // behind by a full queue: dropped, not waited for
				m.remove(g, mb)
				mb.close()
			}
		}
		if len(g.members) == 0 {
			m.end(key, g)
		}
		m.mu.Unlock()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for mb := range g.members {
		m.remove(g, mb)
		mb.close()
	}
	m.end(key, g)
	m.executions.Dec()
}

// remove takes a member out of g; the caller holds mu.
func (m *multiplexer) remove(g *subGroup, mb *member) {
	delete(g.members, mb)
	m.members.Dec()
}

// others returns the ids of all that are not in patients.
func others(all, patients []string) []string {
	var out []string
	for _, id := range all {
		if !slices.Contains(patients, id) {
			out = append(out, id)
		}
	}
	return out
}

// subscribeShared runs a subscription as a member of the shared execution of its key: the
// member's results are audited on its own context, those waiting together in one record of the
// ids they touched.
func (e *wsExecutor) subscribeShared(ctx context.Context, p *access.Principal, d readDoc, req ws.Request, key string) (ws.Results, error) {
	results, leave, err := e.h.subs.join(key, p, func(gctx context.Context) (<-chan any, *access.Recorder, error) {
		gctx = withLoaders(gctx, newLoaders(e.h.s))
		gctx, rec := access.WithRecorder(gctx)
		src, err := d.schema.Subscribe(gctx, req.Query, req.OperationName, req.Variables)
		if err != nil {
			return nil, nil, err
		}
		out := make(chan any)
		go func() { // finished once for every member
			defer close(out)
			for item := range src {
				if res, ok := item.(*gql.Response); ok {
					out <- e.h.finishWS(gctx, d.doc, req.OperationName, res)
				}
			}
		}()
		return out, rec, nil
	})
	if err != nil {
		return nil, err
	}
	return &memberResults{e: e, p: p, op: d.operation(req.OperationName), start: time.Now(), mb: results, leave: leave}, nil
}

// memberResults are a member's results as its operation takes them (ws.Results), and say when
// one is there (ws.Notifier): a shared subscription holds no goroutine while it waits for its
// next event.
type memberResults struct {
	e     *wsExecutor
	p     *access.Principal
	op    string
	start time.Time
	mb    *member
	leave func()
	// ready are results audited and not yet taken.
	ready []*ws.Response
}

// Next implements ws.Results. The results waiting when it finds none ready are taken together:
// charged to the organization's fan-out rate, then audited in one record.
func (m *memberResults) Next(ctx context.Context) (*ws.Response, bool) {
	if len(m.ready) == 0 {
		batch, ok := m.mb.nextBatch(ctx, maxAuditBatch)
		if !ok {
			return nil, false
		}
		// Each member's message is charged to its organization's fan-out rate: past it the
		// member waits, falls behind and is dropped, while other organizations' members are
		// sent at once.
		size := 0
		for _, r := range batch {
			size += len(r.res.Data)
		}
		if m.e.h.fanOut.wait(ctx, m.p.OrgID, int64(size)) != nil {
			return nil, false
		}
		// The results waiting are audited together: one record names the patients of them
		// all, acknowledged before any is sent, rather than a broker round trip each (a
		// stream of predictions names a patient in every message).
		actx, _ := access.WithRecorder(ctx)
		for _, r := range batch {
			for _, id := range r.patients {
				access.Touch(actx, access.KindPatient, id)
			}
			for _, id := range r.resources {
				access.Touch(actx, "resource", id)
			}
		}
		denied := m.e.audit(actx, m.op, m.start, batch[0].res)
		for _, r := range batch {
			res := r.res
			if denied != batch[0].res {
				res = denied
			}
			m.ready = append(m.ready, res)
		}
	}
	r := m.ready[0]
	m.ready[0] = nil
	m.ready = m.ready[1:]
	if len(m.ready) == 0 {
		m.ready = nil
	}
	return r, true
}

// Ready implements ws.Notifier.
func (m *memberResults) Ready() bool { return len(m.ready) > 0 || m.mb.hasNext() }

// Notify implements ws.Notifier.
func (m *memberResults) Notify(f func()) {
	if len(m.ready) > 0 {
		f()
		return
	}
	m.mb.onNext(f)
}

// Close implements ws.Results: the member leaves its execution (the last one ends it).
func (m *memberResults) Close(time.Duration) bool {
	m.leave()
	m.ready = nil
	return true
}

// maxAuditBatch bounds the results of a member audited in one record.
const maxAuditBatch = 256
