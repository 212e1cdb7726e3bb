package graphql

import (
	"context"

	gql "github.com/graph-gophers/graphql-go"

	"carehub/kernel/access"
	"carehub/kernel/events"
	"carehub/kernel/fault"
	"carehub/processors/agents"
	"carehub/processors/deployments"
	"carehub/processors/workflows"
)

// EventSource delivers the platform events this node sees (the fan-out of carehub.events.v1).
type EventSource interface {
	// Subscribe returns a channel of the events from now on that f selects, of every
	// organization, and a function that ends the subscription; the caller calls it when done
	// (the resolvers do when their context ends). The channel is closed when the subscription
	// ends: by the function, or because the subscriber fell behind and was dropped. The function
	// is idempotent. f only spares work (processors/fanout indexes subscriptions by project and
	// exact type, and never wakes a subscriber for an event f does not select); filtering by
	// tenant stays the caller's job.
	Subscribe(ctx context.Context, f EventFilter) (<-chan events.Event, func())
}

// EventFilter selects events at the source. The zero EventFilter selects every event.
type EventFilter struct {
	// ProjectID, when not empty, selects the events of that project.
	ProjectID string
	// Types, when not nil, selects the events whose type matches one of these patterns (exact,
	// prefix.* or *, as events.MatchAny).
	Types []string
}

// EventSourceFunc adapts a function to EventSource.
type EventSourceFunc func(ctx context.Context, f EventFilter) (<-chan events.Event, func())

// Subscribe calls fn.
func (fn EventSourceFunc) Subscribe(ctx context.Context, f EventFilter) (<-chan events.Event, func()) {
	return fn(ctx, f)
}

// subscriptionResolver implements Subscription. Each field checks scope and tenancy when the
// subscription starts (an error then ends it before any event) and again for every event it
// forwards; every item it pushes is reloaded through the services with fresh loaders, so it
// shows the state after the event and nothing cached from an earlier one.
type subscriptionResolver struct{ s *Services }

// maxTracked bounds the per-subscription memory of what was last pushed per session or run.
const maxTracked = 1024

func (r *subscriptionResolver) source() (EventSource, error) {
	if r.s.Events == nil {
		return nil, fault.Unavailable("subscriptions are not available on this node")
	}
	return r.s.Events, nil
}

// stream runs one subscription: for every event from src that f selects and keep passes, it
// calls load and sends the result, until ctx ends or src closes. out is closed at the end.
func stream[T any](ctx context.Context, src EventSource, f EventFilter, keep func(*access.Principal, events.Event) bool,
	load func(context.Context, events.Event) (T, bool)) <-chan T {
	evs, stop := src.Subscribe(ctx, f)
	out := make(chan T)
	go func() {
		defer close(out)
		defer stop()
		for {
			var ev events.Event
			select {
			case <-ctx.Done():
				return
			case e, ok := <-evs:
				if !ok {
					return
				}
				ev = e
			}
			p := access.From(ctx)
			if p == nil || !p.SeesOrg(ev.OrgID) || !keep(p, ev) {
				continue
			}
			item, ok := load(ctx, ev)
			if !ok {
				continue
			}
			select {
			case out <- item:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

func (r *subscriptionResolver) EventStream(ctx context.Context, args struct {
	ProjectID gql.ID
	Types     *[]string
}) (<-chan *eventResolver, error) {
	if _, err := r.s.Orgs.Project(ctx, string(args.ProjectID)); err != nil {
		return nil, err
	}
	var types []string
	if args.Types != nil {
		types = *args.Types
		for _, t := range types {
			if !events.ValidPattern(t) {
				return nil, fault.Invalid("types: %q is not an event type or pattern (exact, prefix.* or *)", t)
			}
		}
	}
	src, err := r.source()
	if err != nil {
		return nil, err
	}
	projectID := string(args.ProjectID)
	return stream(ctx, src, EventFilter{ProjectID: projectID, Types: types}, func(p *access.Principal, ev events.Event) bool {
		return ev.ProjectID == projectID && (types == nil || events.MatchAny(types, ev.Type))
	}, func(ctx context.Context, ev events.Event) (*eventResolver, bool) {
		served := r.s.Feed.Serve(ctx, ev)
		return &eventResolver{&served}, true
	}), nil
}

// lastPushed remembers the status last pushed per session or run, so the several events of one
// change (agent.session.updated and agent.run_completed, say) push it once.
type lastPushed map[string]string

func (m lastPushed) changed(id, status string) bool {
	if m[id] == status {
		return false
	}
	if len(m) >= maxTracked {
		clear(m)
	}
	m[id] = status
	return true
}

func (r *subscriptionResolver) AgentSessionUpdated(ctx context.Context, args struct{ AgentID gql.ID }) (<-chan *sessionResolver, error) {
	if _, err := access.Require(ctx, access.ExecAgents); err != nil {
		return nil, err
	}
	a, err := r.s.Agents.Agent(ctx, string(args.AgentID))
	if err != nil {
		return nil, err
	}
	src, err := r.source()
	if err != nil {
		return nil, err
	}
	agentID := string(args.AgentID)
	pushed := lastPushed{}
	sessionEvents := []string{events.TypeAgentSessionUpdated, events.TypeAgentRunCompleted, events.TypeAgentRunFailed}
	return stream(ctx, src, EventFilter{ProjectID: a.ProjectID, Types: sessionEvents}, func(p *access.Principal, ev events.Event) bool {
		st, ok := events.SessionStateOf(ev.Type, ev.Payload)
		return ok && p.Has(access.ExecAgents) && st.AgentID == agentID
	}, func(ctx context.Context, ev events.Event) (*sessionResolver, bool) {
		st, _ := events.SessionStateOf(ev.Type, ev.Payload)
		s, err := r.s.Agents.Session(ctx, st.SessionID)
		if err != nil || s.AgentID != agentID {
			return nil, false
		}
		s = sessionAsOf(s, st.Status)
		if !pushed.changed(s.ID, s.Status) {
			return nil, false
		}
		return &sessionResolver{s, newLoaders(r.s)}, true
	}), nil
}

func (r *subscriptionResolver) WorkflowRunUpdated(ctx context.Context, args struct{ WorkflowID gql.ID }) (<-chan *runResolver, error) {
	if _, err := access.Require(ctx, access.ExecWorkflows); err != nil {
		return nil, err
	}
	wf, err := r.s.Workflows.Workflow(ctx, string(args.WorkflowID))
	if err != nil {
		return nil, err
	}
	src, err := r.source()
	if err != nil {
		return nil, err
	}
	workflowID := string(args.WorkflowID)
	pushed := lastPushed{}
	runEvents := []string{events.TypeWorkflowRunUpdated, events.TypeWorkflowCompleted, events.TypeWorkflowRunCompleted}
	return stream(ctx, src, EventFilter{ProjectID: wf.ProjectID, Types: runEvents}, func(p *access.Principal, ev events.Event) bool {
		st, ok := events.RunStateOf(ev.Type, ev.Payload)
		return ok && p.Has(access.ExecWorkflows) && st.WorkflowID == workflowID
	}, func(ctx context.Context, ev events.Event) (*runResolver, bool) {
		st, _ := events.RunStateOf(ev.Type, ev.Payload)
		run, err := r.s.Workflows.Run(ctx, st.RunID)
		if err != nil || run.WorkflowID != workflowID {
			return nil, false
		}
		run = runAsOf(run, st.Status)
		if !pushed.changed(run.ID, run.Status) {
			return nil, false
		}
		return &runResolver{run, newLoaders(r.s)}, true
	}), nil
}

func (r *subscriptionResolver) DeploymentStatusChanged(ctx context.Context, args struct{ DeploymentID gql.ID }) (<-chan *deploymentResolver, error) {
	dep, err := r.s.Deployments.Deployment(ctx, string(args.DeploymentID))
	if err != nil {
		return nil, err
	}
	src, err := r.source()
	if err != nil {
		return nil, err
	}
	deploymentID := string(args.DeploymentID)
	pushed := lastPushed{}
	return stream(ctx, src, EventFilter{ProjectID: dep.ProjectID, Types: []string{events.TypeDeploymentStatusChanged}}, func(p *access.Principal, ev events.Event) bool {
		t, ok := transition(ev)
		return ok && t.DeploymentID == deploymentID
	}, func(ctx context.Context, ev events.Event) (*deploymentResolver, bool) {
		d, err := r.s.Deployments.Deployment(ctx, deploymentID)
		if err != nil {
			return nil, false
		}
		t, _ := transition(ev)
		d = deploymentAsOf(d, t)
		if !pushed.changed(d.ID, d.Status) {
			return nil, false
		}
		return &deploymentResolver{d, newLoaders(r.s)}, true
	}), nil
}

// The subscriptions push the state an event announces, not the entity's current row: events
// reach a node tens of milliseconds after their change, and an entity may have moved on by then
// (an async agent run goes QUEUED → RUNNING → COMPLETED within milliseconds). Pushing the row
// would skip the states in between and push the last one several times. The row supplies what
// the event does not carry; fields that only a later state has are cleared.

// sessionAsOf returns s as a session-state event describes it (the status it announces).
func sessionAsOf(s *agents.Session, status string) *agents.Session {
	if status == "" || status == s.Status {
		return s
	}
	c := *s
	c.Status = status
	if status == agents.StatusQueued || status == agents.StatusRunning {
		c.Output, c.Error, c.LatencyMs, c.TokensUsed, c.CompletedAt = nil, nil, nil, nil, nil
	}
	return &c
}

// runAsOf returns run as a run-state event describes it (the status it announces).
func runAsOf(run *workflows.Run, status string) *workflows.Run {
	if status == "" || status == run.Status {
		return run
	}
	c := *run
	c.Status = status
	if status == workflows.RunQueued || status == workflows.RunRunning {
		c.Output, c.Error, c.DurationMs, c.CompletedAt = nil, nil, nil, nil
	}
	return &c
}

// transition decodes a deployment.status_changed event.
func transition(ev events.Event) (events.DeploymentStatusChanged, bool) {
	if ev.Type != events.TypeDeploymentStatusChanged {
		return events.DeploymentStatusChanged{}, false
	}
	return events.PayloadOf[events.DeploymentStatusChanged](ev.Payload)
}

// deploymentAsOf returns d as transition t describes it (its to and reason). Only a live
// deployment has an endpoint.
func deploymentAsOf(d *deployments.Deployment, t events.DeploymentStatusChanged) *deployments.Deployment {
	to := t.To
	if to == "" || to == d.Status {
		return d
	}
	c := *d
	c.Status = to
	if reason := t.Reason; reason != "" {
		c.StatusReason = &reason
	}
	if to != deployments.StatusRunning && to != deployments.StatusDegraded {
		c.Endpoint = nil
	}
	return &c
}
