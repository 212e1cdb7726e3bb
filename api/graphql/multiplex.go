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

// memberBuffer is how many results a member may have waiting: a member that lets more pile up
// is dropped (its operation completes) rather than slowing the others. Its socket's own send
// queue, behind it, is the bound that usually acts first (4008).
const memberBuffer = 64

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

// subGroup is one shared execution and its members. Members are sent to and closed only under
// the multiplexer's lock, by the group's pump.
type subGroup struct {
	cancel  context.CancelFunc
	members map[chan sharedResult]struct{}
}

// sharedResult is one result of a shared execution, with the ids it touched.
type sharedResult struct {
	res       *ws.Response
	patients  []string
	resources []string // not patients
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
// returns the member's results and the function that makes it leave (idempotent). The results
// channel is closed when the execution ends or the member is dropped. start runs under the lock,
// so that two first members do not start two executions; it is the subscription's set-up (its
// resolver's checks), once per group.
func (m *multiplexer) join(key string, p *access.Principal, start func(ctx context.Context) (<-chan any, *access.Recorder, error)) (<-chan sharedResult, func(), error) {
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
		g = &subGroup{cancel: cancel, members: map[chan sharedResult]struct{}{}}
		m.groups[key] = g
		m.executions.Inc()
		go m.pump(key, g, src, rec)
	}
	ch := make(chan sharedResult, memberBuffer)
	g.members[ch] = struct{}{}
	m.members.Inc()
	var once sync.Once
	leave := func() { once.Do(func() { m.leave(key, g, ch) }) }
	return ch, leave, nil
}

// leave removes a member; the last one ends the execution.
func (m *multiplexer) leave(key string, g *subGroup, ch chan sharedResult) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := g.members[ch]; !ok {
		return // dropped, or the execution ended
	}
	m.remove(g, ch)
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
		for ch := range g.members {
			select {
			case ch <- r:
			default: // behind by memberBuffer results: dropped, not waited for
				m.remove(g, ch)
				close(ch)
			}
		}
		if len(res.Data) == 0 && len(res.Errors) > 0 {
			if m.groups[key] == g {
				delete(m.groups, key)
			}
		}
		if len(g.members) == 0 {
			m.end(key, g)
		}
		m.mu.Unlock()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for ch := range g.members {
		m.remove(g, ch)
		close(ch)
	}
	m.end(key, g)
	m.executions.Dec()
}

// remove takes a member out of g; the caller holds mu.
func (m *multiplexer) remove(g *subGroup, ch chan sharedResult) {
	delete(g.members, ch)
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
// member's results are audited on its own context, with the ids each result touched recorded
// on its own recorder.
func (e *wsExecutor) subscribeShared(ctx context.Context, p *access.Principal, d readDoc, req ws.Request, key string) (<-chan *ws.Response, error) {
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
	ctx, _ = access.WithRecorder(ctx)
	start, op := time.Now(), d.operation(req.OperationName)
	mapped := make(chan any)
	go func() {
		defer close(mapped)
		defer leave()
		for {
			var r sharedResult
			select {
			case <-ctx.Done():
				return
			case got, ok := <-results:
				if !ok {
					return
				}
				r = got
			}
			// Each member's message is charged to its organization's fan-out rate: past it the
			// member waits, falls behind and is dropped, while other organizations' members are
			// sent at once.
			if e.h.fanOut.wait(ctx, p.OrgID, int64(len(r.res.Data))) != nil {
				return
			}
			for _, id := range r.patients {
				access.Touch(ctx, access.KindPatient, id)
			}
			for _, id := range r.resources {
				access.Touch(ctx, "resource", id)
			}
			select {
			case mapped <- e.audit(ctx, op, start, r.res):
			case <-ctx.Done():
				return
			}
		}
	}()
	return ws.ResponsesFrom(ctx, mapped), nil
}
