package graphql

import (
	"context"

	gql "github.com/graph-gophers/graphql-go"

	"carehub/processors/feed"
	"carehub/processors/marketplace"
	"carehub/processors/orgs"
	"carehub/processors/patients"
)

// SchemaVersion is the label of the GraphQL schema (Query.apiVersion).
const SchemaVersion = "2.0"

// root is the schema's root resolver; Query, Mutation and Subscription return it, each
// operation type using its own methods.
type root struct{ s *Services }

func (r *root) Query() *queryResolver               { return &queryResolver{r.s} }
func (r *root) Mutation() *mutationResolver         { return &mutationResolver{r.s} }
func (r *root) Subscription() *subscriptionResolver { return &subscriptionResolver{r.s} }

type queryResolver struct{ s *Services }

func (q *queryResolver) l(ctx context.Context) *loaders { return loadersFrom(ctx, q.s) }

func (q *queryResolver) APIVersion() string { return SchemaVersion }

func (q *queryResolver) Organization(ctx context.Context, args struct{ ID gql.ID }) (*orgResolver, error) {
	o, err := q.s.Orgs.Organization(ctx, string(args.ID))
	if err != nil {
		return nil, err
	}
	return &orgResolver{o, q.l(ctx)}, nil
}

func (q *queryResolver) Organizations(ctx context.Context, args struct{ Limit, Offset *int32 }) ([]*orgResolver, error) {
	limit, offset, err := pageArgs(args.Limit, args.Offset)
	if err != nil {
		return nil, err
	}
	os, err := q.s.Orgs.Organizations(ctx, limit, offset)
	if err != nil {
		return nil, err
	}
	return q.l(ctx).orgs(os), nil
}

func (q *queryResolver) Project(ctx context.Context, args struct{ ID gql.ID }) (*projectResolver, error) {
	p, err := q.s.Orgs.Project(ctx, string(args.ID))
	if err != nil {
		return nil, err
	}
	l := q.l(ctx)
	l.hintProjects([]orgs.Project{*p})
	return &projectResolver{p, l}, nil
}

func (q *queryResolver) Projects(ctx context.Context, args struct {
	OrganizationID gql.ID
	Limit, Offset  *int32
}) ([]*projectResolver, error) {
	limit, offset, err := pageArgs(args.Limit, args.Offset)
	if err != nil {
		return nil, err
	}
	ps, err := q.s.Orgs.Projects(ctx, string(args.OrganizationID), limit, offset)
	if err != nil {
		return nil, err
	}
	l := q.l(ctx)
	l.hintProjects(ps)
	return l.projects(ps), nil
}

func (q *queryResolver) Asset(ctx context.Context, args struct{ ID gql.ID }) (*assetResolver, error) {
	a, err := q.s.Marketplace.Asset(ctx, string(args.ID))
	if err != nil {
		return nil, err
	}
	return &assetResolver{a, q.l(ctx)}, nil
}

type assetsArgs struct {
	Type          *string
	Category      *string
	Status        *string
	MinRating     *float64
	Badges        *[]string
	FhirResources *[]string
	Limit, Offset *int32
}

func (q *queryResolver) Assets(ctx context.Context, args assetsArgs) ([]*assetResolver, error) {
	limit, offset, err := pageArgs(args.Limit, args.Offset)
	if err != nil {
		return nil, err
	}
	f := marketplace.Filter{Type: str(args.Type), Category: str(args.Category), Status: str(args.Status),
		MinRating: args.MinRating, Limit: limit, Offset: offset}
	if args.Badges != nil {
		f.Badges = *args.Badges
	}
	if args.FhirResources != nil {
		f.FHIRResources = *args.FhirResources
	}
	as, err := q.s.Marketplace.Assets(ctx, f)
	if err != nil {
		return nil, err
	}
	return q.l(ctx).assets(as), nil
}

func (q *queryResolver) Publishers(ctx context.Context, args struct {
	Verified *bool
	Limit    *int32
}) ([]*publisherResolver, error) {
	limit, err := limitArg(args.Limit, DefaultLimit, MaxLimit)
	if err != nil {
		return nil, err
	}
	ps, err := q.s.Marketplace.Publishers(ctx, args.Verified, limit)
	if err != nil {
		return nil, err
	}
	l := q.l(ctx)
	l.hintPublishers(ps)
	out := make([]*publisherResolver, len(ps))
	for i := range ps {
		out[i] = &publisherResolver{&ps[i], l}
	}
	return out, nil
}

func (q *queryResolver) Agent(ctx context.Context, args struct{ ID gql.ID }) (*agentResolver, error) {
	a, err := q.s.Agents.Agent(ctx, string(args.ID))
	if err != nil {
		return nil, err
	}
	return &agentResolver{a, q.l(ctx)}, nil
}

func (q *queryResolver) Agents(ctx context.Context, args struct {
	ProjectID gql.ID
	Limit     *int32
}) ([]*agentResolver, error) {
	limit, err := limitArg(args.Limit, DefaultLimit, MaxLimit)
	if err != nil {
		return nil, err
	}
	as, err := q.s.Agents.Agents(ctx, string(args.ProjectID), limit)
	if err != nil {
		return nil, err
	}
	return q.l(ctx).agents(as), nil
}

func (q *queryResolver) Workflow(ctx context.Context, args struct{ ID gql.ID }) (*workflowResolver, error) {
	w, err := q.s.Workflows.Workflow(ctx, string(args.ID))
	if err != nil {
		return nil, err
	}
	return &workflowResolver{w, q.l(ctx)}, nil
}

func (q *queryResolver) Workflows(ctx context.Context, args struct {
	ProjectID gql.ID
	Status    *string
	Limit     *int32
}) ([]*workflowResolver, error) {
	limit, err := limitArg(args.Limit, DefaultLimit, MaxLimit)
	if err != nil {
		return nil, err
	}
	ws, err := q.s.Workflows.Workflows(ctx, string(args.ProjectID), str(args.Status), limit)
	if err != nil {
		return nil, err
	}
	return q.l(ctx).workflows(ws), nil
}

func (q *queryResolver) WorkflowRun(ctx context.Context, args struct{ ID gql.ID }) (*runResolver, error) {
	r, err := q.s.Workflows.Run(ctx, string(args.ID))
	if err != nil {
		return nil, err
	}
	return &runResolver{r, q.l(ctx)}, nil
}

func (q *queryResolver) Deployment(ctx context.Context, args struct{ ID gql.ID }) (*deploymentResolver, error) {
	d, err := q.s.Deployments.Deployment(ctx, string(args.ID))
	if err != nil {
		return nil, err
	}
	return &deploymentResolver{d, q.l(ctx)}, nil
}

func (q *queryResolver) Deployments(ctx context.Context, args struct {
	ProjectID gql.ID
	Limit     *int32
}) ([]*deploymentResolver, error) {
	limit, err := limitArg(args.Limit, DefaultLimit, MaxLimit)
	if err != nil {
		return nil, err
	}
	ds, err := q.s.Deployments.Deployments(ctx, string(args.ProjectID), limit)
	if err != nil {
		return nil, err
	}
	return q.l(ctx).deployments(ds), nil
}

func (q *queryResolver) Installations(ctx context.Context, args struct{ ProjectID gql.ID }) ([]*installationResolver, error) {
	ins, err := q.s.Marketplace.Installations(ctx, string(args.ProjectID))
	if err != nil {
		return nil, err
	}
	return q.l(ctx).installations(ins), nil
}

func (q *queryResolver) Patient(ctx context.Context, args struct{ ID gql.ID }) (*patientResolver, error) {
	p, err := q.s.Patients.Patient(ctx, string(args.ID))
	if err != nil {
		return nil, err
	}
	return &patientResolver{p, q.l(ctx)}, nil
}

func (q *queryResolver) Patients(ctx context.Context, args struct {
	RiskLevel, Program *string
	Limit, Offset      *int32
}) ([]*patientResolver, error) {
	limit, offset, err := pageArgs(args.Limit, args.Offset)
	if err != nil {
		return nil, err
	}
	ps, err := q.s.Patients.Patients(ctx, patients.Filter{RiskLevel: str(args.RiskLevel), Program: str(args.Program),
		Limit: limit, Offset: offset})
	if err != nil {
		return nil, err
	}
	return q.l(ctx).patients(ps), nil
}

func (q *queryResolver) Webhooks(ctx context.Context, args struct{ ProjectID gql.ID }) ([]*webhookResolver, error) {
	ws, err := q.s.Webhooks.List(ctx, string(args.ProjectID))
	if err != nil {
		return nil, err
	}
	return q.l(ctx).webhooks(ws), nil
}

func (q *queryResolver) WebhookDeliveries(ctx context.Context, args struct {
	WebhookID     gql.ID
	Status        *string
	Limit, Offset *int32
}) ([]*deliveryResolver, error) {
	limit, offset, err := pageArgs(args.Limit, args.Offset)
	if err != nil {
		return nil, err
	}
	ds, err := q.s.Webhooks.Deliveries(ctx, string(args.WebhookID), str(args.Status), limit, offset)
	if err != nil {
		return nil, err
	}
	return q.l(ctx).deliveries(ds), nil
}

func (q *queryResolver) Events(ctx context.Context, args struct {
	ProjectID gql.ID
	Type      *string
	Limit     *int32
	Since     *DateTime
	From, To  *DateTime
}) ([]*eventResolver, error) {
	limit, err := limitArg(args.Limit, DefaultLimit, MaxLimit)
	if err != nil {
		return nil, err
	}
	from, err := fromArg(args.From, args.Since)
	if err != nil {
		return nil, err
	}
	page, err := q.eventPage(ctx, feed.Query{ProjectID: string(args.ProjectID), Type: str(args.Type),
		Since: from, To: timeArg(args.To), Limit: limit}, "payload")
	if err != nil {
		return nil, err
	}
	out := make([]*eventResolver, len(page.Events))
	for i := range page.Events {
		out[i] = &eventResolver{&page.Events[i]}
	}
	return out, nil
}
