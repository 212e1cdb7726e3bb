package graphql

import (
	"context"
	"encoding/json"
	"fmt"

	gql "github.com/graph-gophers/graphql-go"

	"carehub/kernel/phi"
	"carehub/processors/agents"
	"carehub/processors/deployments"
	"carehub/processors/marketplace"
	"carehub/processors/orgs"
	"carehub/processors/webhooks"
	"carehub/processors/workflows"
)

// Object resolvers. Each wraps a domain value and the request's loaders; nested objects resolve
// through the loaders, so a list of N items costs one statement per nested level, not N.

// missing reports a nested object that a non-null field must have but the loader did not return:
// a broken reference, never a tenancy question (both ends belong to the same organization).
func missing(what, id string) error { return fmt.Errorf("%s %s referenced but not found", what, id) }

type orgResolver struct {
	o *orgs.Organization
	l *loaders
}

func (r *orgResolver) ID() gql.ID          { return gql.ID(r.o.ID) }
func (r *orgResolver) Name() string        { return r.o.Name }
func (r *orgResolver) Slug() string        { return r.o.Slug }
func (r *orgResolver) Plan() string        { return r.o.Plan }
func (r *orgResolver) MemberCount() int32  { return int32(r.o.MemberCount) }
func (r *orgResolver) CreatedAt() DateTime { return dateTime(r.o.CreatedAt) }
func (r *orgResolver) Projects(ctx context.Context) ([]*projectResolver, error) {
	ps, err := r.l.projectsByOrg.Load(ctx, r.o.ID)
	if err != nil {
		return nil, err
	}
	return r.l.projects(ps), nil
}

func (l *loaders) orgs(os []orgs.Organization) []*orgResolver {
	l.hintOrgs(os)
	out := make([]*orgResolver, len(os))
	for i := range os {
		out[i] = &orgResolver{&os[i], l}
	}
	return out
}

type projectResolver struct {
	p *orgs.Project
	l *loaders
}

func (l *loaders) projects(ps []orgs.Project) []*projectResolver {
	out := make([]*projectResolver, len(ps))
	for i := range ps {
		out[i] = &projectResolver{&ps[i], l}
	}
	return out
}

func (r *projectResolver) ID() gql.ID          { return gql.ID(r.p.ID) }
func (r *projectResolver) Name() string        { return r.p.Name }
func (r *projectResolver) CreatedAt() DateTime { return dateTime(r.p.CreatedAt) }
func (r *projectResolver) Organization(ctx context.Context) (*orgResolver, error) {
	o, err := r.l.orgByID.Load(ctx, r.p.OrgID)
	if err != nil {
		return nil, err
	}
	if o == nil {
		return nil, missing("organization", r.p.OrgID)
	}
	return &orgResolver{o, r.l}, nil
}
func (r *projectResolver) Assets(ctx context.Context) ([]*installationResolver, error) {
	ins, err := r.l.installationsByProject.Load(ctx, r.p.ID)
	if err != nil {
		return nil, err
	}
	return r.l.installations(ins), nil
}
func (r *projectResolver) Deployments(ctx context.Context) ([]*deploymentResolver, error) {
	ds, err := r.l.deploymentsByProject.Load(ctx, r.p.ID)
	if err != nil {
		return nil, err
	}
	return r.l.deployments(ds), nil
}
func (r *projectResolver) Workflows(ctx context.Context) ([]*workflowResolver, error) {
	ws, err := r.l.workflowsByProject.Load(ctx, r.p.ID)
	if err != nil {
		return nil, err
	}
	return r.l.workflows(ws), nil
}

// project resolves a non-null Project field by id.
func (l *loaders) project(ctx context.Context, id string) (*projectResolver, error) {
	p, err := l.projectByID.Load(ctx, id)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, missing("project", id)
	}
	return &projectResolver{p, l}, nil
}

type assetResolver struct {
	a *marketplace.Asset
	l *loaders
}

func (l *loaders) assets(as []marketplace.Asset) []*assetResolver {
	l.hintAssets(as)
	out := make([]*assetResolver, len(as))
	for i := range as {
		out[i] = &assetResolver{&as[i], l}
	}
	return out
}

func (r *assetResolver) ID() gql.ID                { return gql.ID(r.a.ID) }
func (r *assetResolver) Name() string              { return r.a.Name }
func (r *assetResolver) Description() string       { return r.a.Description }
func (r *assetResolver) Type() string              { return r.a.Type }
func (r *assetResolver) Category() string          { return r.a.Category }
func (r *assetResolver) Version() string           { return r.a.Version }
func (r *assetResolver) FhirResources() []string   { return nonNil(r.a.FHIRResources) }
func (r *assetResolver) Badges() []string          { return nonNil(r.a.Badges) }
func (r *assetResolver) Rating() *float64          { return r.a.Rating }
func (r *assetResolver) Downloads() int32          { return int32(r.a.Downloads) }
func (r *assetResolver) Status() string            { return r.a.Status }
func (r *assetResolver) CreatedAt() DateTime       { return dateTime(r.a.CreatedAt) }
func (r *assetResolver) UpdatedAt() DateTime       { return dateTime(r.a.UpdatedAt) }
func (r *assetResolver) Pricing() *pricingResolver { return &pricingResolver{r.a} }
func (r *assetResolver) ComplianceScore() *complianceResolver {
	return &complianceResolver{r.a}
}
func (r *assetResolver) Model(ctx context.Context) (*modelArtifactResolver, error) {
	if r.a.Runtime == nil || *r.a.Runtime != marketplace.RuntimeONNX {
		return nil, nil // only an asset that carries a model has one: no query for the others
	}
	m, err := r.l.modelByAsset.Load(ctx, r.a.ID)
	if err != nil || m == nil {
		return nil, err
	}
	return &modelArtifactResolver{m}, nil
}

type modelArtifactResolver struct{ m *marketplace.ModelArtifact }

func (r *modelArtifactResolver) Sha256() string       { return r.m.SHA256 }
func (r *modelArtifactResolver) Format() string       { return r.m.Format }
func (r *modelArtifactResolver) SizeBytes() int32     { return int32(r.m.SizeBytes) }
func (r *modelArtifactResolver) Version() string      { return r.m.Version }
func (r *modelArtifactResolver) AttachedAt() DateTime { return dateTime(r.m.AttachedAt) }
func (r *modelArtifactResolver) Inputs() []*tensorSpecResolver {
	return tensorSpecs(r.m.Signature.Inputs)
}
func (r *modelArtifactResolver) Outputs() []*tensorSpecResolver {
	return tensorSpecs(r.m.Signature.Outputs)
}
func (r *modelArtifactResolver) Metadata() (*JSON, error) {
	if len(r.m.Signature.Metadata) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(r.m.Signature.Metadata)
	if err != nil {
		return nil, err
	}
	return &JSON{raw: b}, nil
}

type tensorSpecResolver struct{ t marketplace.TensorSpec }

func tensorSpecs(ts []marketplace.TensorSpec) []*tensorSpecResolver {
	out := make([]*tensorSpecResolver, len(ts))
	for i, t := range ts {
		out[i] = &tensorSpecResolver{t}
	}
	return out
}

func (r *tensorSpecResolver) Name() string     { return r.t.Name }
func (r *tensorSpecResolver) Datatype() string { return r.t.Datatype }
func (r *tensorSpecResolver) Shape() []int32 {
	out := make([]int32, len(r.t.Shape))
	for i, d := range r.t.Shape {
		out[i] = int32(d)
	}
	return out
}

func (r *assetResolver) Publisher(ctx context.Context) (*publisherResolver, error) {
	p, err := r.l.publisherByID.Load(ctx, r.a.PublisherID)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, missing("publisher", r.a.PublisherID)
	}
	return &publisherResolver{p, r.l}, nil
}

type pricingResolver struct{ a *marketplace.Asset }

func (r *pricingResolver) Type() string             { return r.a.PricingType }
func (r *pricingResolver) CostPerRequest() *float64 { return r.a.CostPerRequest }
func (r *pricingResolver) MonthlyFee() *float64     { return r.a.MonthlyFee }
func (r *pricingResolver) AnnualFee() *float64      { return r.a.AnnualFee }
func (r *pricingResolver) FreeTierLimit() *int32    { return r.a.FreeTierLimit }

type complianceResolver struct{ a *marketplace.Asset }

func (r *complianceResolver) Overall() int32        { return int32(r.a.ScoreOverall) }
func (r *complianceResolver) Security() int32       { return int32(r.a.ScoreSecurity) }
func (r *complianceResolver) Privacy() int32        { return int32(r.a.ScorePrivacy) }
func (r *complianceResolver) ClinicalSafety() int32 { return int32(r.a.ScoreClinical) }
func (r *complianceResolver) HipaaCompliant() bool  { return r.a.HIPAACompliant }
func (r *complianceResolver) FdaCleared() bool      { return r.a.FDACleared }

type publisherResolver struct {
	p *marketplace.Publisher
	l *loaders
}

func (r *publisherResolver) ID() gql.ID       { return gql.ID(r.p.ID) }
func (r *publisherResolver) Name() string     { return r.p.Name }
func (r *publisherResolver) Email() string    { return r.p.Email }
func (r *publisherResolver) Verified() bool   { return r.p.Verified }
func (r *publisherResolver) TotalApps() int32 { return int32(r.p.TotalApps) }

// Organization is the publisher's organization when the caller may see it; another tenant's
// organization is null (the field is nullable), as for a publisher without one.
func (r *publisherResolver) Organization(ctx context.Context) (*orgResolver, error) {
	if r.p.OrgID == nil {
		return nil, nil
	}
	o, err := r.l.orgByID.Load(ctx, *r.p.OrgID)
	if err != nil || o == nil {
		return nil, err
	}
	return &orgResolver{o, r.l}, nil
}

type installationResolver struct {
	in *marketplace.Installation
	l  *loaders
}

func (l *loaders) installations(ins []marketplace.Installation) []*installationResolver {
	l.hintInstallations(ins)
	out := make([]*installationResolver, len(ins))
	for i := range ins {
		out[i] = &installationResolver{&ins[i], l}
	}
	return out
}

func (r *installationResolver) ID() gql.ID            { return gql.ID(r.in.ID) }
func (r *installationResolver) Status() string        { return r.in.Status }
func (r *installationResolver) InstalledAt() DateTime { return dateTime(r.in.InstalledAt) }
func (r *installationResolver) Config(ctx context.Context) (*JSON, error) {
	return chargedJSON(ctx, r.in.Config)
}
func (r *installationResolver) Project(ctx context.Context) (*projectResolver, error) {
	return r.l.project(ctx, r.in.ProjectID)
}
func (r *installationResolver) Asset(ctx context.Context) (*assetResolver, error) {
	a, err := r.l.assetByID.Load(ctx, r.in.AssetID)
	if err != nil {
		return nil, err
	}
	if a == nil {
		return nil, missing("asset", r.in.AssetID)
	}
	return &assetResolver{a, r.l}, nil
}

type deploymentResolver struct {
	d *deployments.Deployment
	l *loaders
}

func (l *loaders) deployments(ds []deployments.Deployment) []*deploymentResolver {
	l.hintDeployments(ds)
	out := make([]*deploymentResolver, len(ds))
	for i := range ds {
		out[i] = &deploymentResolver{&ds[i], l}
	}
	return out
}

func (r *deploymentResolver) ID() gql.ID            { return gql.ID(r.d.ID) }
func (r *deploymentResolver) Environment() string   { return r.d.Environment }
func (r *deploymentResolver) Status() string        { return r.d.Status }
func (r *deploymentResolver) Replicas() int32       { return int32(r.d.Replicas) }
func (r *deploymentResolver) Endpoint() *string     { return r.d.Endpoint }
func (r *deploymentResolver) HipaaMode() bool       { return r.d.HIPAAMode }
func (r *deploymentResolver) DeployedAt() DateTime  { return dateTime(r.d.DeployedAt) }
func (r *deploymentResolver) StatusReason() *string { return r.d.StatusReason }

func (r *deploymentResolver) ScoreStream() bool { return r.d.ScoreStream }

func (r *deploymentResolver) Backend() *inferenceBackendResolver {
	if r.d.Backend == nil {
		return nil
	}
	return &inferenceBackendResolver{r.d.Backend}
}

type inferenceBackendResolver struct{ b *deployments.Backend }

func (r *inferenceBackendResolver) Protocol() string { return r.b.Protocol }
func (r *inferenceBackendResolver) URL() string      { return r.b.URL }
func (r *inferenceBackendResolver) Model() string    { return r.b.Model }
func (r *inferenceBackendResolver) Baa() bool        { return r.b.BAA }
func (r *inferenceBackendResolver) Version() *string {
	if r.b.Version == "" {
		return nil
	}
	return &r.b.Version
}
func (r *deploymentResolver) Project(ctx context.Context) (*projectResolver, error) {
	return r.l.project(ctx, r.d.ProjectID)
}
func (r *deploymentResolver) Installation(ctx context.Context) (*installationResolver, error) {
	in, err := r.l.installationByID.Load(ctx, r.d.InstallationID)
	if err != nil {
		return nil, err
	}
	if in == nil {
		return nil, missing("installation", r.d.InstallationID)
	}
	return &installationResolver{in, r.l}, nil
}

type agentResolver struct {
	a *agents.Agent
	l *loaders
}

func (l *loaders) agents(as []agents.Agent) []*agentResolver {
	l.hintAgents(as)
	out := make([]*agentResolver, len(as))
	for i := range as {
		out[i] = &agentResolver{&as[i], l}
	}
	return out
}

func (r *agentResolver) ID() gql.ID           { return gql.ID(r.a.ID) }
func (r *agentResolver) Name() string         { return r.a.Name }
func (r *agentResolver) Description() string  { return r.a.Description }
func (r *agentResolver) RunMode() string      { return r.a.RunMode }
func (r *agentResolver) Status() string       { return r.a.Status }
func (r *agentResolver) Skill() string        { return r.a.Skill }
func (r *agentResolver) Instructions() string { return r.a.Instructions }
func (r *agentResolver) DeploymentID() *gql.ID {
	if r.a.DeploymentID == nil {
		return nil
	}
	id := gql.ID(*r.a.DeploymentID)
	return &id
}
func (r *agentResolver) CreatedAt() DateTime { return dateTime(r.a.CreatedAt) }
func (r *agentResolver) Project(ctx context.Context) (*projectResolver, error) {
	return r.l.project(ctx, r.a.ProjectID)
}
func (r *agentResolver) Sessions(ctx context.Context) ([]*sessionResolver, error) {
	ss, err := r.l.sessionsByAgent.Load(ctx, r.a.ID)
	if err != nil {
		return nil, err
	}
	return r.l.sessions(ss), nil
}

type sessionResolver struct {
	s *agents.Session
	l *loaders
}

func (l *loaders) sessions(ss []agents.Session) []*sessionResolver {
	l.hintSessions(ss)
	out := make([]*sessionResolver, len(ss))
	for i := range ss {
		out[i] = &sessionResolver{&ss[i], l}
	}
	return out
}

func (r *sessionResolver) ID() gql.ID             { return gql.ID(r.s.ID) }
func (r *sessionResolver) PatientID() string      { return r.s.PatientID }
func (r *sessionResolver) Status() string         { return r.s.Status }
func (r *sessionResolver) LatencyMs() *int32      { return r.s.LatencyMs }
func (r *sessionResolver) TokensUsed() *int32     { return r.s.TokensUsed }
func (r *sessionResolver) StartedAt() DateTime    { return dateTime(r.s.StartedAt) }
func (r *sessionResolver) CompletedAt() *DateTime { return optDateTime(r.s.CompletedAt) }
func (r *sessionResolver) Error() *string         { return r.s.Error }
func (r *sessionResolver) Redacted() bool         { return r.s.Redacted }
func (r *sessionResolver) Input(ctx context.Context) (*JSON, error) {
	return chargedJSON(ctx, r.s.Input)
}
func (r *sessionResolver) Output(ctx context.Context) (*JSON, error) {
	return chargedJSON(ctx, r.s.Output)
}
func (r *sessionResolver) Agent(ctx context.Context) (*agentResolver, error) {
	a, err := r.l.agentByID.Load(ctx, r.s.AgentID)
	if err != nil {
		return nil, err
	}
	if a == nil {
		return nil, missing("agent", r.s.AgentID)
	}
	return &agentResolver{a, r.l}, nil
}

type workflowResolver struct {
	w *workflows.Workflow
	l *loaders
}

func (l *loaders) workflows(ws []workflows.Workflow) []*workflowResolver {
	l.hintWorkflows(ws)
	out := make([]*workflowResolver, len(ws))
	for i := range ws {
		out[i] = &workflowResolver{&ws[i], l}
	}
	return out
}

func (r *workflowResolver) ID() gql.ID          { return gql.ID(r.w.ID) }
func (r *workflowResolver) Name() string        { return r.w.Name }
func (r *workflowResolver) Description() string { return r.w.Description }
func (r *workflowResolver) Status() string      { return r.w.Status }
func (r *workflowResolver) Nodes() int32        { return int32(len(r.w.Steps)) }
func (r *workflowResolver) Steps() []string     { return nonNil(r.w.Steps) }
func (r *workflowResolver) Triggers() []string  { return nonNil(r.w.Triggers) }
func (r *workflowResolver) CreatedAt() DateTime { return dateTime(r.w.CreatedAt) }
func (r *workflowResolver) Project(ctx context.Context) (*projectResolver, error) {
	return r.l.project(ctx, r.w.ProjectID)
}
func (r *workflowResolver) Runs(ctx context.Context) ([]*runResolver, error) {
	rs, err := r.l.runsByWorkflow.Load(ctx, r.w.ID)
	if err != nil {
		return nil, err
	}
	return r.l.runs(rs), nil
}

type runResolver struct {
	r *workflows.Run
	l *loaders
}

func (l *loaders) runs(rs []workflows.Run) []*runResolver {
	l.hintRuns(rs)
	out := make([]*runResolver, len(rs))
	for i := range rs {
		out[i] = &runResolver{&rs[i], l}
	}
	return out
}

func (r *runResolver) ID() gql.ID             { return gql.ID(r.r.ID) }
func (r *runResolver) Status() string         { return r.r.Status }
func (r *runResolver) DurationMs() *int32     { return r.r.DurationMs }
func (r *runResolver) StartedAt() DateTime    { return dateTime(r.r.StartedAt) }
func (r *runResolver) CompletedAt() *DateTime { return optDateTime(r.r.CompletedAt) }
func (r *runResolver) Redacted() bool         { return r.r.Redacted }
func (r *runResolver) Input(ctx context.Context) (*JSON, error) {
	return chargedJSON(ctx, r.r.Input)
}
func (r *runResolver) Output(ctx context.Context) (*JSON, error) {
	return chargedJSON(ctx, r.r.Output)
}
func (r *runResolver) Workflow(ctx context.Context) (*workflowResolver, error) {
	w, err := r.l.workflowByID.Load(ctx, r.r.WorkflowID)
	if err != nil {
		return nil, err
	}
	if w == nil {
		return nil, missing("workflow", r.r.WorkflowID)
	}
	return &workflowResolver{w, r.l}, nil
}

type webhookResolver struct {
	w *webhooks.Subscription
	l *loaders
}

func (l *loaders) webhooks(ws []webhooks.Subscription) []*webhookResolver {
	l.hintWebhooks(ws)
	out := make([]*webhookResolver, len(ws))
	for i := range ws {
		out[i] = &webhookResolver{&ws[i], l}
	}
	return out
}

func (r *webhookResolver) ID() gql.ID                 { return gql.ID(r.w.ID) }
func (r *webhookResolver) URL() string                { return r.w.URL }
func (r *webhookResolver) Events() []string           { return nonNil(r.w.Events) }
func (r *webhookResolver) Status() string             { return r.w.Status }
func (r *webhookResolver) CreatedAt() DateTime        { return dateTime(r.w.CreatedAt) }
func (r *webhookResolver) FailureCount() int32        { return int32(r.w.FailureCount) }
func (r *webhookResolver) LastDeliveredAt() *DateTime { return optDateTime(r.w.LastDeliveredAt) }
func (r *webhookResolver) Ordered() bool              { return r.w.Ordered }
func (r *webhookResolver) MaxInFlight() int32         { return int32(r.w.MaxInFlight) }
func (r *webhookResolver) BatchSize() int32           { return int32(r.w.BatchSize) }
func (r *webhookResolver) RateLimit() int32           { return int32(r.w.RateLimit) }
func (r *webhookResolver) Secret() *string {
	if r.w.Secret == "" {
		return nil
	}
	return &r.w.Secret
}
func (r *webhookResolver) Project(ctx context.Context) (*projectResolver, error) {
	return r.l.project(ctx, r.w.ProjectID)
}

type deliveryResolver struct {
	d *webhooks.Delivery
	l *loaders
}

func (l *loaders) deliveries(ds []webhooks.Delivery) []*deliveryResolver {
	l.hintDeliveries(ds)
	out := make([]*deliveryResolver, len(ds))
	for i := range ds {
		out[i] = &deliveryResolver{&ds[i], l}
	}
	return out
}

func (r *deliveryResolver) ID() gql.ID               { return gql.ID(r.d.ID) }
func (r *deliveryResolver) EventID() gql.ID          { return gql.ID(r.d.EventID) }
func (r *deliveryResolver) EventType() string        { return r.d.EventType }
func (r *deliveryResolver) Status() string           { return r.d.Status }
func (r *deliveryResolver) AttemptCount() int32      { return int32(r.d.AttemptCount) }
func (r *deliveryResolver) NextAttemptAt() *DateTime { return optDateTime(r.d.NextAttemptAt) }
func (r *deliveryResolver) CreatedAt() DateTime      { return dateTime(r.d.CreatedAt) }
func (r *deliveryResolver) LastAttemptAt() *DateTime { return optDateTime(r.d.LastAttemptAt) }
func (r *deliveryResolver) Webhook(ctx context.Context) (*webhookResolver, error) {
	w, err := r.l.webhookByID.Load(ctx, r.d.WebhookID)
	if err != nil {
		return nil, err
	}
	if w == nil {
		return nil, missing("webhook", r.d.WebhookID)
	}
	return &webhookResolver{w, r.l}, nil
}
func (r *deliveryResolver) Attempts(ctx context.Context) ([]*attemptResolver, error) {
	as, err := r.l.attemptsByDelivery.Load(ctx, r.d.ID)
	if err != nil {
		return nil, err
	}
	out := make([]*attemptResolver, len(as))
	for i := range as {
		out[i] = &attemptResolver{&as[i]}
	}
	return out, nil
}

type attemptResolver struct{ a *webhooks.Attempt }

func (r *attemptResolver) ID() gql.ID            { return gql.ID(r.a.ID) }
func (r *attemptResolver) StatusCode() *int32    { return optInt32(r.a.StatusCode) }
func (r *attemptResolver) LatencyMs() int32      { return int32(r.a.LatencyMs) }
func (r *attemptResolver) Error() *string        { return r.a.Error }
func (r *attemptResolver) ResponseBody() *string { return r.a.ResponseBody }
func (r *attemptResolver) AttemptedAt() DateTime { return dateTime(r.a.AttemptedAt) }

// eventResolver is an event as the caller may see it (kernel/phi).
type eventResolver struct{ e *phi.Event }

func (r *eventResolver) ID() gql.ID          { return gql.ID(r.e.ID) }
func (r *eventResolver) Type() string        { return r.e.Type }
func (r *eventResolver) Payload() JSON       { return JSON{raw: r.e.Payload} }
func (r *eventResolver) Source() string      { return r.e.Source }
func (r *eventResolver) Timestamp() DateTime { return dateTime(r.e.CreatedAt) }
func (r *eventResolver) ProjectID() gql.ID   { return gql.ID(r.e.ProjectID) }
func (r *eventResolver) Severity() string    { return r.e.Severity }
func (r *eventResolver) Redacted() bool      { return r.e.Redacted }

type submissionResolver struct{ r *marketplace.SubmissionResult }

func (r *submissionResolver) ID() gql.ID      { return gql.ID(r.r.ID) }
func (r *submissionResolver) Status() string  { return r.r.Status }
func (r *submissionResolver) Message() string { return r.r.Message }

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func optInt32(p *int) *int32 {
	if p == nil {
		return nil
	}
	v := int32(*p)
	return &v
}
