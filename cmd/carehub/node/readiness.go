package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"carehub/api/server"
	"carehub/processors/audit"
	"carehub/processors/deployments"
	"carehub/processors/eventlog"
	"carehub/processors/fhirsubs"
	obswriter "carehub/processors/observations"
	"carehub/processors/webhooks"
	"carehub/processors/workflows"
	"carehub/storage/kafka"
	"carehub/storage/postgres"
)

const (
	// checkTimeout bounds one dependency's check: /readyz answers within it whatever is down.
	checkTimeout = 2 * time.Second
	// checkFor is how long a round of checks answers every probe: a load balancer polling
	// /readyz costs the dependencies one round a second at most, and a store that stops is
	// reported within checkFor + checkTimeout.
	checkFor = time.Second
)

// What each dependency's failure degrades, as /readyz names it.
var degrades = map[string]string{
	"server":     "the node is starting or draining: send it no traffic",
	"postgres":   "every API call, authentication, observation storage and the outbox",
	"migrations": "the schema is older than this binary: calls that touch the new tables fail",
	"kafka":      "publishing, observation ingest, subscriptions, webhooks and workflows; mutations wait in the outbox",
	"clickhouse": "event history, statistics, exports and audit queries answer 503 UNAVAILABLE; the event and audit log writers retry and catch up",
	"disk":       "the data dir's disk is full: publishing, observation ingest and every write answer 503 UNAVAILABLE until space is freed; reads are served",
	"consumers":  "observation ingest refuses with 503 while its writers hold no partitions; events reach the log, webhooks and workflows late",
}

// consumerGroups names the consumer group and topic of each component that runs one, so the
// consumers check covers what the node's roles started (the table says which).
var consumerGroups = map[string]func(s *Node) (group, topic string){
	"eventlog-writer": func(s *Node) (string, string) { return s.ns.Name(eventlog.DefaultGroup), s.topics.Events },
	"audit-writer":    func(s *Node) (string, string) { return s.ns.Name(audit.DefaultGroup), s.topics.Audit },
	"observation-writer": func(s *Node) (string, string) {
		return s.ns.Name(obswriter.DefaultGroup), s.topics.Observations
	},
	"workflow-runner": func(s *Node) (string, string) {
		return s.ns.Name(workflows.DefaultRunnerGroup), s.topics.WorkflowRuns
	},
	"workflow-triggers": func(s *Node) (string, string) {
		return s.ns.Name(workflows.DefaultTriggersGroup), s.topics.Events
	},
	"deployment-scorer": func(s *Node) (string, string) {
		return s.ns.Name(deployments.DefaultScorerGroup), s.topics.Events
	},
	"webhook-dispatcher": func(s *Node) (string, string) { return s.ns.Name(webhooks.DefaultGroup), s.topics.Events },
	"fhir-subscription-notifier": func(s *Node) (string, string) {
		return s.ns.Name(fhirsubs.DefaultGroup), s.topics.Events
	},
}

// readiness holds the last round of checks and whether the consumer groups have been seen
// assigned.
type readiness struct {
	mu     sync.Mutex // held through a round: concurrent probes wait for it, not run their own
	at     time.Time
	checks map[string]string
	lags   []server.ConsumerLag
	// assigned latches once every group held all its partitions: the consumers check gates
	// start-up, and a later rebalance (a processors node joining) must not take the node out
	// of service.
	assigned bool
}

// AwaitReady waits until /readyz would answer 200, or for at most timeout; the error names
// the checks that are not ok then.
func (s *Node) AwaitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		r := s.readiness(ctx, false)
		var failing []string
		for name, v := range r.Checks {
			if v != "ok" {
				failing = append(failing, name+": "+v)
			}
		}
		if len(failing) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			slices.Sort(failing)
			return fmt.Errorf("not ready after %s: %s", timeout, strings.Join(failing, "; "))
		case <-time.After(checkFor):
		}
	}
}

// readiness answers /readyz: every dependency checked at once, each under checkTimeout, the
// round kept for checkFor.
func (s *Node) readiness(ctx context.Context, verbose bool) server.Ready {
	r := &s.readyState
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.at) >= checkFor || (verbose && r.lags == nil && len(s.consumerGroups()) > 0) {
		r.checks, r.lags = s.check(ctx, verbose || !r.assigned)
		r.at = time.Now()
	}
	out := server.Ready{Checks: maps.Clone(r.checks)}
	// Not cached: a draining node says so at once.
	out.Checks["server"] = "ok"
	if !s.ready.Load() {
		out.Checks["server"] = "starting or shutting down"
	}
	for name, v := range out.Checks {
		if v != "ok" {
			if out.Degrades == nil {
				out.Degrades = map[string]string{}
			}
			out.Degrades[name] = degrades[name]
		}
	}
	if verbose {
		out.Roles = slices.Clone(s.cfg.Roles)
		out.Consumers = slices.Clone(r.lags)
		out.RecentErrors = s.errs.recent()
	}
	return out
}

// check runs one round. With lags it measures every consumer group (the consumers check before
// they were first seen assigned, and `carehub status`); without, the latched consumers check is
// reported as it stands. Called with s.readyState.mu held.
func (s *Node) check(ctx context.Context, lags bool) (map[string]string, []server.ConsumerLag) {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	checks := map[string]func(context.Context) string{
		"postgres": func(ctx context.Context) string { return okOrDown(s.pool.Ping(ctx)) },
		"migrations": func(ctx context.Context) string {
			pending, err := postgres.Pending(ctx, s.pool)
			switch {
			case err != nil:
				return "unknown: " + reason(err)
			case len(pending) > 0:
				return fmt.Sprintf("%d pending", len(pending))
			}
			return "ok"
		},
		"kafka": func(ctx context.Context) string { return okOrDown(kafka.Ping(ctx, s.kcl)) },
	}
	if s.broker != nil || s.local != nil {
		checks["disk"] = func(context.Context) string { return okOrDown(s.diskFull()) }
	}
	if p, ok := s.eventLog.(interface{ Ping(context.Context) error }); ok && s.cfg.ClickHouseURL != "" {
		checks["clickhouse"] = func(ctx context.Context) string { return okOrDown(p.Ping(ctx)) }
	}
	var measured []server.ConsumerLag
	if groups := s.consumerGroups(); len(groups) > 0 {
		checks["consumers"] = func(ctx context.Context) string {
			if !lags {
				return "ok" // latched
			}
			measured = s.consumerLags(ctx, groups)
			if w := waiting(measured); w != "" && !s.readyState.assigned {
				return w
			}
			s.readyState.assigned = true
			return "ok"
		}
	}
	out := make(map[string]string, len(checks))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, fn := range checks {
		wg.Go(func() {
			v := fn(ctx)
			mu.Lock()
			out[name] = v
			mu.Unlock()
		})
	}
	wg.Wait()
	return out, measured
}

type consumerGroup struct{ name, group, topic string }

// consumerGroups are the groups of the consumers this node started, in start order.
func (s *Node) consumerGroups() []consumerGroup {
	var out []consumerGroup
	for _, name := range s.started {
		if f, ok := consumerGroups[name]; ok {
			g, t := f(s)
			out = append(out, consumerGroup{name: name, group: g, topic: t})
		}
	}
	return out
}

// consumerLags measures each group: its lag and how many partitions of its topic a member holds.
func (s *Node) consumerLags(ctx context.Context, groups []consumerGroup) []server.ConsumerLag {
	adm := kadm.NewClient(s.kcl) // not closed: that would close the node's client
	out := make([]server.ConsumerLag, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Go(func() {
			c := server.ConsumerLag{Name: g.name, Group: g.group, Topic: g.topic}
			lags, err := kafka.Lag(ctx, adm, g.group, g.topic)
			if err != nil {
				c.Err = reason(err)
			}
			for _, p := range lags {
				c.Partitions++
				c.Lag += p.Lag
				if p.MemberID != "" {
					c.Assigned++
				}
			}
			out[i] = c
		})
	}
	wg.Wait()
	return out
}

// waiting says which groups do not yet hold every partition of their topic, "" when all do.
func waiting(lags []server.ConsumerLag) string {
	var w []string
	for _, c := range lags {
		switch {
		case c.Err != "":
			w = append(w, c.Name+": "+c.Err)
		case c.Partitions == 0:
			w = append(w, c.Name+" has not joined its group")
		case c.Assigned < c.Partitions:
			w = append(w, fmt.Sprintf("%s holds %d of %d partitions", c.Name, c.Assigned, c.Partitions))
		}
	}
	if len(w) == 0 {
		return ""
	}
	return "waiting: " + strings.Join(w, "; ")
}

func okOrDown(err error) string {
	if err != nil {
		return "down: " + reason(err)
	}
	return "ok"
}

// reason is the root of err in a few words: the last part of its chain's message, which is
// where drivers put the cause ("connection refused", "i/o timeout"), with no addresses or
// credentials the outer parts name.
func reason(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("no answer within %s", checkTimeout)
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	if len(msg) > 100 {
		msg = msg[:100] + "…"
	}
	return msg
}

// errorRing keeps the node's last error-level log lines for `carehub status`.
type errorRing struct {
	mu    sync.Mutex
	lines []server.LoggedError // oldest first
}

// recentErrors is how many lines the ring keeps.
const recentErrors = 20

// loggedKeys are the attributes a kept line carries: the context the node logs with errors.
// Anything else (a request's route or query, a value) is left out.
var loggedKeys = map[string]bool{"component": true, "consumer": true, "worker": true, "group": true, "topic": true,
	"partition": true, "offset": true, "status": true, "request_id": true, "err": true, "error": true}

func (e *errorRing) add(l server.LoggedError) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.lines) == recentErrors {
		e.lines = append(e.lines[:0], e.lines[1:]...)
	}
	e.lines = append(e.lines, l)
}

func (e *errorRing) recent() []server.LoggedError {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.lines)
}

// ringHandler passes every record on to the node's handler and keeps the error-level ones.
type ringHandler struct {
	slog.Handler
	ring  *errorRing
	attrs map[string]string // from With, kept keys only
}

func (h ringHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelError || h.Handler.Enabled(ctx, l)
}

func (h ringHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		attrs := maps.Clone(h.attrs)
		r.Attrs(func(a slog.Attr) bool {
			attrs = keep(attrs, a)
			return true
		})
		h.ring.add(server.LoggedError{Time: r.Time, Message: r.Message, Attrs: attrs})
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h ringHandler) WithAttrs(as []slog.Attr) slog.Handler {
	attrs := maps.Clone(h.attrs)
	for _, a := range as {
		attrs = keep(attrs, a)
	}
	return ringHandler{Handler: h.Handler.WithAttrs(as), ring: h.ring, attrs: attrs}
}

func (h ringHandler) WithGroup(name string) slog.Handler {
	return ringHandler{Handler: h.Handler.WithGroup(name), ring: h.ring, attrs: h.attrs}
}

func keep(attrs map[string]string, a slog.Attr) map[string]string {
	if !loggedKeys[a.Key] {
		return attrs
	}
	if attrs == nil {
		attrs = map[string]string{}
	}
	attrs[a.Key] = a.Value.Resolve().String()
	return attrs
}

// diskFull is why the embedded stores refuse writes for want of disk space, nil when they do not.
func (s *Node) diskFull() error {
	if s.broker != nil {
		if err := s.broker.DiskFull(); err != nil {
			return err
		}
	}
	if s.local != nil {
		return s.local.DiskFull()
	}
	return nil
}
