package rest

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"carehub/api/envelope"
	"carehub/kernel/events"
	"carehub/kernel/phi"
	"carehub/processors/agents"
	"carehub/processors/deployments"
	"carehub/processors/marketplace"
	"carehub/processors/orgs"
	"carehub/processors/webhooks"
	"carehub/processors/workflows"
)

// REST representations. Field names are the GraphQL ones (DECISIONS §1); times are UTC.

// Organization is the spec's REST Organization, plus slug and memberCount.
type Organization struct {
	ID             string    `json:"id"`
	Name           string    `json:"name"`
	Slug           string    `json:"slug"`
	Type           string    `json:"type"`
	FHIRBase       *string   `json:"fhirBase"`
	HIPAACompliant bool      `json:"hipaaCompliant"`
	Plan           string    `json:"plan"`
	MemberCount    int       `json:"memberCount"`
	CreatedAt      time.Time `json:"createdAt"`
}

func organizationOf(o *orgs.Organization) Organization {
	return Organization{ID: o.ID, Name: o.Name, Slug: o.Slug, Type: o.Type, FHIRBase: o.FHIRBase,
		HIPAACompliant: o.HIPAACompliant, Plan: o.Plan, MemberCount: o.MemberCount, CreatedAt: o.CreatedAt.UTC()}
}

// Project is a project.
type Project struct {
	ID             string    `json:"id"`
	OrganizationID string    `json:"organizationId"`
	Name           string    `json:"name"`
	CreatedAt      time.Time `json:"createdAt"`
}

// Asset is a marketplace asset: the GraphQL MarketplaceAsset's fields.
type Asset struct {
	ID              string          `json:"id"`
	Name            string          `json:"name"`
	Description     string          `json:"description"`
	Type            string          `json:"type"`
	Category        string          `json:"category"`
	Version         string          `json:"version"`
	Publisher       *Publisher      `json:"publisher"`
	Pricing         Pricing         `json:"pricing"`
	FHIRResources   []string        `json:"fhirResources"`
	ComplianceScore ComplianceScore `json:"complianceScore"`
	Badges          []string        `json:"badges"`
	Rating          *float64        `json:"rating"`
	Downloads       int             `json:"downloads"`
	Status          string          `json:"status"`
	CreatedAt       time.Time       `json:"createdAt"`
	UpdatedAt       time.Time       `json:"updatedAt"`
}

// Publisher is an asset's publisher; organizationId stands for the GraphQL organization object.
type Publisher struct {
	ID             string  `json:"id"`
	Name           string  `json:"name"`
	Email          string  `json:"email"`
	OrganizationID *string `json:"organizationId"`
	Verified       bool    `json:"verified"`
	TotalApps      int     `json:"totalApps"`
}

// Pricing is an asset's pricing.
type Pricing struct {
	Type           string   `json:"type"`
	CostPerRequest *float64 `json:"costPerRequest"`
	MonthlyFee     *float64 `json:"monthlyFee"`
	AnnualFee      *float64 `json:"annualFee"`
	FreeTierLimit  *int32   `json:"freeTierLimit"`
}

// ComplianceScore is an asset's compliance score.
type ComplianceScore struct {
	Overall        int  `json:"overall"`
	Security       int  `json:"security"`
	Privacy        int  `json:"privacy"`
	ClinicalSafety int  `json:"clinicalSafety"`
	HIPAACompliant bool `json:"hipaaCompliant"`
	FDACleared     bool `json:"fdaCleared"`
}

func assetOf(a *marketplace.Asset, p *marketplace.Publisher) Asset {
	out := Asset{ID: a.ID, Name: a.Name, Description: a.Description, Type: a.Type, Category: a.Category, Version: a.Version,
		Pricing:       Pricing{Type: a.PricingType, CostPerRequest: a.CostPerRequest, MonthlyFee: a.MonthlyFee, AnnualFee: a.AnnualFee, FreeTierLimit: a.FreeTierLimit},
		FHIRResources: nonNil(a.FHIRResources),
		ComplianceScore: ComplianceScore{Overall: a.ScoreOverall, Security: a.ScoreSecurity, Privacy: a.ScorePrivacy,
			ClinicalSafety: a.ScoreClinical, HIPAACompliant: a.HIPAACompliant, FDACleared: a.FDACleared},
		Badges: nonNil(a.Badges), Rating: a.Rating, Downloads: a.Downloads, Status: a.Status,
		CreatedAt: a.CreatedAt.UTC(), UpdatedAt: a.UpdatedAt.UTC()}
	if p != nil {
		out.Publisher = &Publisher{ID: p.ID, Name: p.Name, Email: p.Email, OrganizationID: p.OrgID, Verified: p.Verified, TotalApps: p.TotalApps}
	}
	return out
}

// Event is the spec's REST Event, plus redacted: true when its payload's patient data was removed
// for the caller (kernel/phi).
type Event struct {
	ID        string          `json:"id"`
	Type      string          `json:"type"`
	ProjectID string          `json:"projectId"`
	Source    string          `json:"source"`
	Payload   json.RawMessage `json:"payload"`
	Severity  string          `json:"severity"`
	CreatedAt time.Time       `json:"createdAt"`
	Redacted  bool            `json:"redacted,omitempty"`
}

func eventOf(e phi.Event) Event {
	return Event{ID: e.ID, Type: e.Type, ProjectID: e.ProjectID, Source: e.Source, Payload: e.Payload,
		Severity: e.Severity, CreatedAt: e.CreatedAt.UTC(), Redacted: e.Redacted}
}

// Webhook is the spec's REST Webhook, plus projectId and the delivery settings (ordered,
// maxInFlight, batchSize, rateLimit); the secret is masked.
type Webhook struct {
	ID              string     `json:"id"`
	ProjectID       string     `json:"projectId"`
	URL             string     `json:"url"`
	Events          []string   `json:"events"`
	Status          string     `json:"status"`
	Secret          string     `json:"secret"`
	FailureCount    int        `json:"failureCount"`
	LastDeliveredAt *time.Time `json:"lastDeliveredAt"`
	CreatedAt       time.Time  `json:"createdAt"`
	Ordered         bool       `json:"ordered"`
	MaxInFlight     int        `json:"maxInFlight"`
	BatchSize       int        `json:"batchSize"`
	RateLimit       int        `json:"rateLimit"`
}

func webhookOf(w *webhooks.Subscription) Webhook {
	out := Webhook{ID: w.ID, ProjectID: w.ProjectID, URL: w.URL, Events: nonNil(w.Events), Status: w.Status,
		Secret: maskSecret(w.Secret), FailureCount: w.FailureCount, CreatedAt: w.CreatedAt.UTC(),
		Ordered: w.Ordered, MaxInFlight: w.MaxInFlight, BatchSize: w.BatchSize, RateLimit: w.RateLimit}
	if w.LastDeliveredAt != nil {
		t := w.LastDeliveredAt.UTC()
		out.LastDeliveredAt = &t
	}
	return out
}

// maskSecret keeps a listing's secret masked even if a full one reached it: the whsec_ prefix and
// the last four characters at most.
func maskSecret(s string) string {
	if s == "" || strings.Contains(s, "*") || strings.Contains(s, "…") {
		return s
	}
	if len(s) <= 10 {
		return "whsec_****"
	}
	return "whsec_****" + s[len(s)-4:]
}

// Agent is an agent.
type Agent struct {
	ID          string    `json:"id"`
	ProjectID   string    `json:"projectId"`
	Name        string    `json:"name"`
	Description string    `json:"description"`
	RunMode     string    `json:"runMode"`
	Status      string    `json:"status"`
	Skill       string    `json:"skill"`
	CreatedAt   time.Time `json:"createdAt"`
	// DeploymentID and Instructions are an llm agent's (Skill "llm").
	DeploymentID *string `json:"deploymentId,omitempty"`
	Instructions string  `json:"instructions,omitempty"`
}

// Workflow is a workflow.
type Workflow struct {
	ID          string    `json:"id"`
	ProjectID   string    `json:"projectId"`
	Name        string    `json:"name"`
	Description string    `json:"description"`
	Status      string    `json:"status"`
	Nodes       int       `json:"nodes"`
	Steps       []string  `json:"steps"`
	Triggers    []string  `json:"triggers"`
	CreatedAt   time.Time `json:"createdAt"`
}

// WorkflowRun is a workflow run; input and output are patient data when they name a patient.
type WorkflowRun struct {
	ID          string          `json:"id"`
	WorkflowID  string          `json:"workflowId"`
	Status      string          `json:"status"`
	Trigger     string          `json:"trigger"`
	Input       json.RawMessage `json:"input"`
	Output      json.RawMessage `json:"output"`
	DurationMs  *int32          `json:"durationMs"`
	StartedAt   time.Time       `json:"startedAt"`
	CompletedAt *time.Time      `json:"completedAt"`
	// Redacted is true when input and output were removed for the caller (kernel/phi).
	Redacted bool `json:"redacted,omitempty"`
}

func runOf(r *workflows.Run) WorkflowRun {
	out := WorkflowRun{ID: r.ID, WorkflowID: r.WorkflowID, Status: r.Status, Trigger: r.Trigger, Input: nullJSON(r.Input),
		Output: nullJSON(r.Output), DurationMs: r.DurationMs, StartedAt: r.StartedAt.UTC(), Redacted: r.Redacted}
	if r.CompletedAt != nil {
		t := r.CompletedAt.UTC()
		out.CompletedAt = &t
	}
	return out
}

// Deployment is a deployment.
type Deployment struct {
	ID             string  `json:"id"`
	ProjectID      string  `json:"projectId"`
	InstallationID string  `json:"installationId"`
	Environment    string  `json:"environment"`
	Status         string  `json:"status"`
	StatusReason   *string `json:"statusReason"`
	Replicas       int     `json:"replicas"`
	Endpoint       *string `json:"endpoint"`
	HIPAAMode      bool    `json:"hipaaMode"`
	// Backend is the external inference server the deployment sends its invocations to; absent
	// when carehub runs the model itself.
	Backend *deployments.Backend `json:"backend,omitempty"`
	// ScoreStream: the deployment's model scores the organization's observations as they arrive.
	ScoreStream bool      `json:"scoreStream"`
	DeployedAt  time.Time `json:"deployedAt"`
}

func (h *handlers) organizations(w http.ResponseWriter, r *http.Request) {
	q := envelope.NewQuery(r)
	limit := q.Int("limit", 20, 1, 100)
	cursor := q.Str("cursor")
	if err := q.Err(); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	page, err := h.s.Orgs.OrganizationsAfter(r.Context(), limit, cursor)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	data := make([]Organization, len(page.Organizations))
	for i := range page.Organizations {
		data[i] = organizationOf(&page.Organizations[i])
	}
	envelope.WriteJSON(w, http.StatusOK, envelope.List[Organization]{Data: data, Meta: envelope.CursorMeta{Total: page.Total, Cursor: optString(page.NextCursor)}})
}

func (h *handlers) organization(w http.ResponseWriter, r *http.Request) {
	o, err := h.s.Orgs.Organization(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	envelope.WriteJSON(w, http.StatusOK, organizationOf(o))
}

func (h *handlers) project(w http.ResponseWriter, r *http.Request) {
	p, err := h.s.Orgs.Project(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	envelope.WriteJSON(w, http.StatusOK, projectOf(p))
}

func projectOf(p *orgs.Project) Project {
	return Project{ID: p.ID, OrganizationID: p.OrgID, Name: p.Name, CreatedAt: p.CreatedAt.UTC()}
}

// projects lists the projects the caller sees, those of one organization (id or slug) with
// ?organizationId.
func (h *handlers) projects(w http.ResponseWriter, r *http.Request) {
	q := envelope.NewQuery(r)
	orgRef := q.Str("organizationId")
	limit := q.Int("limit", 20, 1, 100)
	cursor := q.Str("cursor")
	if err := q.Err(); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	page, err := h.s.Orgs.ProjectsAfter(r.Context(), orgRef, limit, cursor)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	data := make([]Project, len(page.Projects))
	for i := range page.Projects {
		data[i] = projectOf(&page.Projects[i])
	}
	envelope.WriteJSON(w, http.StatusOK, envelope.List[Project]{Data: data, Meta: envelope.CursorMeta{Total: page.Total, Cursor: optString(page.NextCursor)}})
}

var assetStatuses = []string{marketplace.StatusDraft, marketplace.StatusUnderReview, marketplace.StatusApproved,
	marketplace.StatusRejected, marketplace.StatusDeprecated}

func (h *handlers) assets(w http.ResponseWriter, r *http.Request) {
	q := envelope.NewQuery(r)
	f := marketplace.Filter{Limit: q.Int("limit", 20, 1, 100), Category: q.Str("category"), MinRating: q.Float("minRating"),
		Badges: q.List("badges"), FHIRResources: q.List("fhirResources"),
		Type: q.Enum("type", marketplace.AssetTypes...), Status: q.Enum("status", assetStatuses...)}
	cursor := q.Str("cursor")
	if err := q.Err(); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	page, err := h.s.Marketplace.AssetsAfter(r.Context(), f, cursor)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	pubIDs := make([]string, 0, len(page.Assets))
	for _, a := range page.Assets {
		pubIDs = append(pubIDs, a.PublisherID)
	}
	pubs, err := h.s.Marketplace.PublishersByID(r.Context(), pubIDs)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	data := make([]Asset, len(page.Assets))
	for i := range page.Assets {
		data[i] = assetOf(&page.Assets[i], pubs[page.Assets[i].PublisherID])
	}
	envelope.WriteJSON(w, http.StatusOK, envelope.List[Asset]{Data: data, Meta: envelope.CursorMeta{Total: page.Total, Cursor: optString(page.NextCursor)}})
}

func (h *handlers) agent(w http.ResponseWriter, r *http.Request) {
	a, err := h.s.Agents.Agent(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	envelope.WriteJSON(w, http.StatusOK, agentOf(a))
}

func agentOf(a *agents.Agent) Agent {
	return Agent{ID: a.ID, ProjectID: a.ProjectID, Name: a.Name, Description: a.Description, RunMode: a.RunMode,
		Status: a.Status, Skill: a.Skill, CreatedAt: a.CreatedAt.UTC(), DeploymentID: a.DeploymentID, Instructions: a.Instructions}
}

func (h *handlers) workflow(w http.ResponseWriter, r *http.Request) {
	wf, err := h.s.Workflows.Workflow(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	envelope.WriteJSON(w, http.StatusOK, Workflow{ID: wf.ID, ProjectID: wf.ProjectID, Name: wf.Name, Description: wf.Description,
		Status: wf.Status, Nodes: len(wf.Steps), Steps: nonNil(wf.Steps), Triggers: nonNil(wf.Triggers), CreatedAt: wf.CreatedAt.UTC()})
}

func (h *handlers) workflowRun(w http.ResponseWriter, r *http.Request) {
	run, err := h.s.Workflows.Run(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	envelope.WriteJSON(w, http.StatusOK, runOf(run))
}

func (h *handlers) deployment(w http.ResponseWriter, r *http.Request) {
	d, err := h.s.Deployments.Deployment(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	envelope.WriteJSON(w, http.StatusOK, deploymentOf(d))
}

func deploymentOf(d *deployments.Deployment) Deployment {
	return Deployment{ID: d.ID, ProjectID: d.ProjectID, InstallationID: d.InstallationID, Environment: d.Environment,
		Status: d.Status, StatusReason: d.StatusReason, Replicas: d.Replicas, Endpoint: d.Endpoint, HIPAAMode: d.HIPAAMode,
		Backend: d.Backend, ScoreStream: d.ScoreStream, DeployedAt: d.DeployedAt.UTC()}
}

func (h *handlers) webhooks(w http.ResponseWriter, r *http.Request) {
	q := envelope.NewQuery(r)
	projectID := q.ProjectID()
	if err := q.Err(); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	subs, err := h.s.Webhooks.List(r.Context(), projectID)
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	data := make([]Webhook, len(subs))
	for i := range subs {
		data[i] = webhookOf(&subs[i])
	}
	envelope.WriteJSON(w, http.StatusOK, envelope.List[Webhook]{Data: data})
}

// StartRunRequest is the body of POST /api/v1/workflows/runs, in the spec's snake_case.
type StartRunRequest struct {
	WorkflowID string          `json:"workflow_id"`
	Trigger    string          `json:"trigger"`
	Input      json.RawMessage `json:"input"`
}

// runInput is the shape of the input the spec shows; the whole object is kept as the run input.
type runInput struct {
	ObservationID string `json:"observation_id"`
	PatientID     string `json:"patient_id"`
	DeviceType    string `json:"device_type"`
}

// startRun starts a run of an ACTIVE workflow from an event (an observation of a device) and
// answers 202 Accepted with the QUEUED run: the workflow runner executes it.
func (h *handlers) startRun(w http.ResponseWriter, r *http.Request) {
	var req StartRunRequest
	if err := envelope.DecodeJSON(r, &req); err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	bad := map[string]string{}
	if req.WorkflowID == "" {
		bad["workflow_id"] = "is required"
	}
	if req.Trigger == "" {
		req.Trigger = workflows.TriggerEvent
	}
	if req.Trigger != workflows.TriggerEvent && req.Trigger != workflows.TriggerManual {
		bad["trigger"] = "must be event (or manual)"
	}
	var in runInput
	if len(req.Input) > 0 && string(req.Input) != "null" {
		if err := json.Unmarshal(req.Input, &in); err != nil || !strings.HasPrefix(strings.TrimSpace(string(req.Input)), "{") {
			bad["input"] = "must be an object {observation_id, patient_id, device_type}"
		}
	}
	if len(bad) > 0 {
		envelope.WriteError(w, r, validation(bad))
		return
	}
	run, err := h.s.Workflows.Start(r.Context(), req.WorkflowID, req.Input, workflows.RunOptions{Trigger: req.Trigger, PatientID: in.PatientID})
	if err != nil {
		envelope.WriteError(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/workflow-runs/"+run.ID)
	envelope.WriteJSON(w, http.StatusAccepted, runOf(run))
}

// EventTypes is the body of GET /v1/event-types.
type EventTypes struct {
	Data []events.EventType `json:"data"`
}

func serveEventTypes(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "public, max-age=300")
	envelope.WriteJSON(w, http.StatusOK, EventTypes{Data: events.Catalogue})
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func nullJSON(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
