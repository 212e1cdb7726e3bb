package graphql

import (
	"context"
	"encoding/json"

	gql "github.com/graph-gophers/graphql-go"

	"carehub/processors/access"
	"carehub/processors/events"
	"carehub/processors/fault"
	"carehub/storage"
)

// EventSource delivers the platform events this node sees (the fan-out of carehub.events.v1).
type EventSource interface {
	// Subscribe returns a channel of every event from now on, of every organization, and a
	// function that ends the subscription; the caller calls it when done (the resolvers do when
	// their context ends). The channel is closed when the subscription ends: by the function, or
	// because the subscriber fell behind and was dropped. The function is idempotent. Filtering
	// by tenant and type is the caller's job.
	Subscribe(ctx context.Context) (<-chan storage.Event, func())
}

// EventSourceFunc adapts a function to EventSource.
type EventSourceFunc func(ctx context.Context) (<-chan storage.Event, func())

// Subscribe calls f.
func (f EventSourceFunc) Subscribe(ctx context.Context) (<-chan storage.Event, func()) { return f(ctx) }

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

// stream runs one subscription: for every event from src that passes keep, it calls load and
// sends the result, until ctx ends or src closes. out is closed at the end.
func stream[T any](ctx context.Context, src EventSource, keep func(*access.Principal, storage.Event) bool,
	load func(context.Context, storage.Event) (T, bool)) <-chan T {
	events, stop := src.Subscribe(ctx)
	out := make(chan T)
	go func() {
		defer close(out)
		defer stop()
		for {
			var ev storage.Event
			select {
			case <-ctx.Done():
				return
			case e, ok := <-events:
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
	return stream(ctx, src, func(p *access.Principal, ev storage.Event) bool {
		return ev.ProjectID == projectID && (types == nil || events.MatchAny(types, ev.Type))
	}, func(ctx context.Context, ev storage.Event) (*eventResolver, bool) {
		return &eventResolver{&ev}, true
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
	if _, err := r.s.Agents.Agent(ctx, string(args.AgentID)); err != nil {
		return nil, err
	}
	src, err := r.source()
	if err != nil {
		return nil, err
	}
	agentID := string(args.AgentID)
	pushed := lastPushed{}
	return stream(ctx, src, func(p *access.Principal, ev storage.Event) bool {
		switch ev.Type {
		case "agent.session.updated", "agent.run_completed", "agent.run.failed":
			return p.Has(access.ExecAgents) && payloadString(ev, "agentId") == agentID
		}
		return false
	}, func(ctx context.Context, ev storage.Event) (*sessionResolver, bool) {
		s, err := r.s.Agents.Session(ctx, payloadString(ev, "sessionId"))
		if err != nil || s.AgentID != agentID || !pushed.changed(s.ID, s.Status) {
			return nil, false
		}
		return &sessionResolver{s, newLoaders(r.s)}, true
	}), nil
}

func (r *subscriptionResolver) WorkflowRunUpdated(ctx context.Context, args struct{ WorkflowID gql.ID }) (<-chan *runResolver, error) {
	if _, err := access.Require(ctx, access.ExecWorkflows); err != nil {
		return nil, err
	}
	if _, err := r.s.Workflows.Workflow(ctx, string(args.WorkflowID)); err != nil {
		return nil, err
	}
	src, err := r.source()
	if err != nil {
		return nil, err
	}
	workflowID := string(args.WorkflowID)
	pushed := lastPushed{}
	runID := func(ev storage.Event) string {
		if id := payloadString(ev, "runId"); id != "" {
			return id
		}
		return payloadString(ev, "run_id")
	}
	return stream(ctx, src, func(p *access.Principal, ev storage.Event) bool {
		if !p.Has(access.ExecWorkflows) {
			return false
		}
		switch ev.Type {
		case "workflow.run.updated", "workflow.completed":
			return payloadString(ev, "workflowId") == workflowID
		case "workflow.run.completed":
			return payloadString(ev, "workflow_id") == workflowID
		}
		return false
	}, func(ctx context.Context, ev storage.Event) (*runResolver, bool) {
		run, err := r.s.Workflows.Run(ctx, runID(ev))
		if err != nil || run.WorkflowID != workflowID || !pushed.changed(run.ID, run.Status) {
			return nil, false
		}
		return &runResolver{run, newLoaders(r.s)}, true
	}), nil
}

func (r *subscriptionResolver) DeploymentStatusChanged(ctx context.Context, args struct{ DeploymentID gql.ID }) (<-chan *deploymentResolver, error) {
	if _, err := r.s.Deployments.Deployment(ctx, string(args.DeploymentID)); err != nil {
		return nil, err
	}
	src, err := r.source()
	if err != nil {
		return nil, err
	}
	deploymentID := string(args.DeploymentID)
	return stream(ctx, src, func(p *access.Principal, ev storage.Event) bool {
		return ev.Type == "deployment.status_changed" && payloadString(ev, "deploymentId") == deploymentID
	}, func(ctx context.Context, ev storage.Event) (*deploymentResolver, bool) {
		d, err := r.s.Deployments.Deployment(ctx, deploymentID)
		if err != nil {
			return nil, false
		}
		return &deploymentResolver{d, newLoaders(r.s)}, true
	}), nil
}

// payloadString returns the string field key of the event's payload, or "".
func payloadString(ev storage.Event, key string) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(ev.Payload, &m) != nil {
		return ""
	}
	var s string
	if json.Unmarshal(m[key], &s) != nil {
		return ""
	}
	return s
}
