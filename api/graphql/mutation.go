package graphql

import (
	"context"

	gql "github.com/graph-gophers/graphql-go"

	"carehub/processors/agents"
	"carehub/processors/deployments"
	"carehub/processors/marketplace"
	"carehub/processors/webhooks"
	"carehub/processors/workflows"
)

// mutationResolver implements Mutation. Scopes, tenancy and validation are the services'; this
// layer only converts arguments and results.
type mutationResolver struct{ s *Services }

func (m *mutationResolver) l(ctx context.Context) *loaders { return loadersFrom(ctx, m.s) }

type submitAssetInput struct {
	Name             string
	Description      string
	Version          string
	Type             string
	Category         string
	FhirResources    *[]string
	PricingType      string
	MonthlyFee       *float64
	DocumentationURL *string
	SupportEmail     string
}

func (m *mutationResolver) SubmitAsset(ctx context.Context, args struct{ Input submitAssetInput }) (*submissionResolver, error) {
	in := args.Input
	sub := marketplace.Submission{Name: in.Name, Description: in.Description, Version: in.Version, Type: in.Type,
		Category: in.Category, PricingType: in.PricingType, MonthlyFee: in.MonthlyFee,
		DocumentationURL: str(in.DocumentationURL), SupportEmail: in.SupportEmail}
	if in.FhirResources != nil {
		sub.FHIRResources = *in.FhirResources
	}
	res, err := m.s.Marketplace.Submit(ctx, sub)
	if err != nil {
		return nil, err
	}
	return &submissionResolver{res}, nil
}

func (m *mutationResolver) InstallAsset(ctx context.Context, args struct {
	AssetID, ProjectID gql.ID
	Config             *JSON
}) (*installationResolver, error) {
	in, err := m.s.Marketplace.Install(ctx, string(args.AssetID), string(args.ProjectID), args.Config.Raw())
	if err != nil {
		return nil, err
	}
	return &installationResolver{in, m.l(ctx)}, nil
}

func (m *mutationResolver) ReviewAsset(ctx context.Context, args struct {
	AssetID  gql.ID
	Decision string
	Notes    *string
}) (*assetResolver, error) {
	a, err := m.s.Marketplace.Review(ctx, string(args.AssetID), args.Decision, str(args.Notes))
	if err != nil {
		return nil, err
	}
	return &assetResolver{a, m.l(ctx)}, nil
}

func (m *mutationResolver) DeprecateAsset(ctx context.Context, args struct{ AssetID gql.ID }) (*assetResolver, error) {
	a, err := m.s.Marketplace.Deprecate(ctx, string(args.AssetID))
	if err != nil {
		return nil, err
	}
	return &assetResolver{a, m.l(ctx)}, nil
}

func (m *mutationResolver) CreateDeployment(ctx context.Context, args struct {
	InstallationID gql.ID
	Environment    string
	Replicas       *int32
	HipaaMode      *bool
	Backend        *struct {
		Protocol, URL, Model   string
		Version, Authorization *string
		Baa                    *bool
	}
	ScoreStream *bool
}) (*deploymentResolver, error) {
	var replicas *int
	if args.Replicas != nil {
		n := int(*args.Replicas)
		replicas = &n
	}
	var backend *deployments.BackendInput
	if b := args.Backend; b != nil {
		backend = &deployments.BackendInput{Backend: deployments.Backend{Protocol: b.Protocol, URL: b.URL, Model: b.Model, Version: deref(b.Version),
			BAA: b.Baa != nil && *b.Baa}, Authorization: deref(b.Authorization)}
	}
	d, err := m.s.Deployments.Create(ctx, string(args.InstallationID), deployments.Spec{Environment: args.Environment, Replicas: replicas,
		HIPAAMode: args.HipaaMode != nil && *args.HipaaMode, Backend: backend, ScoreStream: args.ScoreStream != nil && *args.ScoreStream})
	if err != nil {
		return nil, err
	}
	return &deploymentResolver{d, m.l(ctx)}, nil
}

func (m *mutationResolver) StopDeployment(ctx context.Context, args struct{ ID gql.ID }) (*deploymentResolver, error) {
	d, err := m.s.Deployments.Stop(ctx, string(args.ID))
	if err != nil {
		return nil, err
	}
	return &deploymentResolver{d, m.l(ctx)}, nil
}

func (m *mutationResolver) CreateAgent(ctx context.Context, args struct {
	Name         string
	ProjectID    gql.ID
	RunMode      *string
	Description  *string
	AssetID      *gql.ID
	Skill        *string
	DeploymentID *gql.ID
	Instructions *string
}) (*agentResolver, error) {
	in := agents.NewAgent{Name: args.Name, ProjectID: string(args.ProjectID), RunMode: str(args.RunMode),
		Description: str(args.Description), Skill: str(args.Skill), Instructions: str(args.Instructions)}
	if args.AssetID != nil {
		in.AssetID = string(*args.AssetID)
	}
	if args.DeploymentID != nil {
		in.DeploymentID = string(*args.DeploymentID)
	}
	a, err := m.s.Agents.Create(ctx, in)
	if err != nil {
		return nil, err
	}
	return &agentResolver{a, m.l(ctx)}, nil
}

func (m *mutationResolver) RunAgent(ctx context.Context, args struct {
	AgentID   gql.ID
	PatientID string
	Input     *JSON
}) (*sessionResolver, error) {
	s, err := m.s.Agents.Run(ctx, string(args.AgentID), args.PatientID, args.Input.Raw())
	if err != nil {
		return nil, err
	}
	return &sessionResolver{s, m.l(ctx)}, nil
}

func (m *mutationResolver) CreateWorkflow(ctx context.Context, args struct {
	Name        string
	ProjectID   gql.ID
	Steps       []string
	Description *string
	Triggers    *[]string
}) (*workflowResolver, error) {
	in := workflows.NewWorkflow{Name: args.Name, ProjectID: string(args.ProjectID), Steps: args.Steps,
		Description: str(args.Description)}
	if args.Triggers != nil {
		in.Triggers = *args.Triggers
	}
	w, err := m.s.Workflows.Create(ctx, in)
	if err != nil {
		return nil, err
	}
	return &workflowResolver{w, m.l(ctx)}, nil
}

func (m *mutationResolver) RunWorkflow(ctx context.Context, args struct {
	WorkflowID gql.ID
	Input      *JSON
}) (*runResolver, error) {
	r, err := m.s.Workflows.Start(ctx, string(args.WorkflowID), args.Input.Raw(), workflows.RunOptions{})
	if err != nil {
		return nil, err
	}
	return &runResolver{r, m.l(ctx)}, nil
}

func (m *mutationResolver) setWorkflowStatus(ctx context.Context, id gql.ID, to string) (*workflowResolver, error) {
	w, err := m.s.Workflows.SetStatus(ctx, string(id), to)
	if err != nil {
		return nil, err
	}
	return &workflowResolver{w, m.l(ctx)}, nil
}

func (m *mutationResolver) PauseWorkflow(ctx context.Context, args struct{ ID gql.ID }) (*workflowResolver, error) {
	return m.setWorkflowStatus(ctx, args.ID, workflows.StatusPaused)
}

func (m *mutationResolver) ResumeWorkflow(ctx context.Context, args struct{ ID gql.ID }) (*workflowResolver, error) {
	return m.setWorkflowStatus(ctx, args.ID, workflows.StatusActive)
}

func (m *mutationResolver) ArchiveWorkflow(ctx context.Context, args struct{ ID gql.ID }) (*workflowResolver, error) {
	return m.setWorkflowStatus(ctx, args.ID, workflows.StatusArchived)
}

func (m *mutationResolver) CancelWorkflowRun(ctx context.Context, args struct{ RunID gql.ID }) (*runResolver, error) {
	r, err := m.s.Workflows.Cancel(ctx, string(args.RunID))
	if err != nil {
		return nil, err
	}
	return &runResolver{r, m.l(ctx)}, nil
}

func (m *mutationResolver) PublishEvent(ctx context.Context, args struct {
	Type      string
	Payload   JSON
	ProjectID gql.ID
}) (*eventResolver, error) {
	ev, err := m.s.Feed.Publish(ctx, args.Type, args.Payload.raw, string(args.ProjectID))
	if err != nil {
		return nil, err
	}
	return &eventResolver{ev}, nil
}

// webhookSettingsArgs are the optional delivery settings of createWebhook and updateWebhook
// (issue 55): omitted ones take their default on create and keep their value on update.
type webhookSettingsArgs struct {
	Ordered                           *bool
	MaxInFlight, BatchSize, RateLimit *int32
}

func (a webhookSettingsArgs) options() webhooks.Options {
	return webhooks.Options{Ordered: a.Ordered, MaxInFlight: optInt(a.MaxInFlight), BatchSize: optInt(a.BatchSize),
		RateLimit: optInt(a.RateLimit)}
}

// optInt is *p as an int, or nil for nil.
func optInt(p *int32) *int {
	if p == nil {
		return nil
	}
	n := int(*p)
	return &n
}

func (m *mutationResolver) CreateWebhook(ctx context.Context, args struct {
	ProjectID gql.ID
	URL       string
	Events    []string
	webhookSettingsArgs
}) (*webhookResolver, error) {
	w, err := m.s.Webhooks.Create(ctx, string(args.ProjectID), args.URL, args.Events, args.options())
	if err != nil {
		return nil, err
	}
	return &webhookResolver{w, m.l(ctx)}, nil
}

func (m *mutationResolver) UpdateWebhook(ctx context.Context, args struct {
	ID     gql.ID
	URL    *string
	Events *[]string
	Status *string
	webhookSettingsArgs
}) (*webhookResolver, error) {
	u := webhooks.Update{URL: args.URL, Status: args.Status, Options: args.options()}
	if args.Events != nil {
		u.Events = *args.Events
	}
	w, err := m.s.Webhooks.Update(ctx, string(args.ID), u)
	if err != nil {
		return nil, err
	}
	return &webhookResolver{w, m.l(ctx)}, nil
}

func (m *mutationResolver) RotateWebhookSecret(ctx context.Context, args struct{ ID gql.ID }) (*webhookResolver, error) {
	w, err := m.s.Webhooks.RotateSecret(ctx, string(args.ID))
	if err != nil {
		return nil, err
	}
	return &webhookResolver{w, m.l(ctx)}, nil
}

func (m *mutationResolver) DeleteWebhook(ctx context.Context, args struct{ ID gql.ID }) (bool, error) {
	if err := m.s.Webhooks.Delete(ctx, string(args.ID)); err != nil {
		return false, err
	}
	return true, nil
}

func (m *mutationResolver) RedeliverWebhookDelivery(ctx context.Context, args struct{ DeliveryID gql.ID }) (*deliveryResolver, error) {
	d, err := m.s.Webhooks.Redeliver(ctx, string(args.DeliveryID))
	if err != nil {
		return nil, err
	}
	return &deliveryResolver{d, m.l(ctx)}, nil
}

func (m *mutationResolver) RecoverWebhookDeliveries(ctx context.Context, args struct {
	WebhookID gql.ID
	Since     DateTime
	All       *bool
}) (int32, error) {
	n, err := m.s.Webhooks.Recover(ctx, string(args.WebhookID), args.Since.Time, args.All != nil && *args.All)
	return int32(n), err
}

// deref is *s, or "" for nil.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
