package graphql

import (
	"context"
	"sync"

	"carehub/processors/agents"
	"carehub/processors/deployments"
	"carehub/processors/marketplace"
	"carehub/processors/orgs"
	"carehub/processors/patients"
	"carehub/processors/webhooks"
	"carehub/processors/workflows"
)

// Nested lists that the schema gives no limit argument are bounded here.
const (
	nestedSessions = 100 // Agent.sessions, newest first
	nestedRuns     = 100 // Workflow.runs, newest first
)

// loaders are the batched lookups of one request (or of one subscription event). Every loader
// fetches through a service, so scopes and tenancy apply to nested fields as to root fields.
// The hint* methods announce the keys the items of a freshly loaded list will ask for (see
// loader).
type loaders struct {
	s *Services

	orgByID                *loader[string, *orgs.Organization]
	projectsByOrg          *loader[string, []orgs.Project]
	projectByID            *loader[string, *orgs.Project]
	assetByID              *loader[string, *marketplace.Asset]
	publisherByID          *loader[string, *marketplace.Publisher]
	modelByAsset           *loader[string, *marketplace.ModelArtifact]
	installationsByProject *loader[string, []marketplace.Installation]
	installationByID       *loader[string, *marketplace.Installation]
	deploymentsByProject   *loader[string, []deployments.Deployment]
	workflowsByProject     *loader[string, []workflows.Workflow]
	workflowByID           *loader[string, *workflows.Workflow]
	runsByWorkflow         *loader[string, []workflows.Run]
	agentByID              *loader[string, *agents.Agent]
	sessionsByAgent        *loader[string, []agents.Session]
	webhookByID            *loader[string, *webhooks.Subscription]
	attemptsByDelivery     *loader[string, []webhooks.Attempt]

	// Patient sublists take arguments: one loader per distinct argument set, created on first
	// use and pre-hinted with every patient listed so far.
	mu            sync.Mutex
	patientHints  []string
	observationsL map[patients.ObservationFilter]*loader[string, []patients.Observation]
	encountersL   map[int]*loader[string, []patients.Encounter]
}

func newLoaders(s *Services) *loaders {
	l := &loaders{s: s, observationsL: map[patients.ObservationFilter]*loader[string, []patients.Observation]{},
		encountersL: map[int]*loader[string, []patients.Encounter]{}}
	l.orgByID = newLoader(func(ctx context.Context, ids []string) (map[string]*orgs.Organization, error) {
		m, err := s.Orgs.OrganizationsByID(ctx, ids)
		for _, o := range m {
			l.projectsByOrg.Hint(o.ID)
		}
		return m, err
	})
	l.projectsByOrg = newLoader(func(ctx context.Context, ids []string) (map[string][]orgs.Project, error) {
		m, err := s.Orgs.ProjectsByOrg(ctx, ids)
		for _, ps := range m {
			l.hintProjects(ps)
		}
		return m, err
	})
	l.projectByID = newLoader(func(ctx context.Context, ids []string) (map[string]*orgs.Project, error) {
		m, err := s.Orgs.ProjectsByID(ctx, ids)
		for _, p := range m {
			l.hintProjects([]orgs.Project{*p})
		}
		return m, err
	})
	l.assetByID = newLoader(func(ctx context.Context, ids []string) (map[string]*marketplace.Asset, error) {
		m, err := s.Marketplace.AssetsByID(ctx, ids)
		for _, a := range m {
			l.publisherByID.Hint(a.PublisherID)
		}
		return m, err
	})
	l.modelByAsset = newLoader(func(ctx context.Context, ids []string) (map[string]*marketplace.ModelArtifact, error) {
		return s.Marketplace.ModelsByAsset(ctx, ids)
	})
	l.publisherByID = newLoader(func(ctx context.Context, ids []string) (map[string]*marketplace.Publisher, error) {
		m, err := s.Marketplace.PublishersByID(ctx, ids)
		for _, p := range m {
			if p.OrgID != nil {
				l.orgByID.Hint(*p.OrgID)
			}
		}
		return m, err
	})
	l.installationsByProject = newLoader(func(ctx context.Context, ids []string) (map[string][]marketplace.Installation, error) {
		m, err := s.Marketplace.InstallationsByProject(ctx, ids)
		for _, ins := range m {
			l.hintInstallations(ins)
		}
		return m, err
	})
	l.installationByID = newLoader(func(ctx context.Context, ids []string) (map[string]*marketplace.Installation, error) {
		m, err := s.Marketplace.InstallationsByID(ctx, ids)
		for _, in := range m {
			l.hintInstallations([]marketplace.Installation{*in})
		}
		return m, err
	})
	l.deploymentsByProject = newLoader(func(ctx context.Context, ids []string) (map[string][]deployments.Deployment, error) {
		m, err := s.Deployments.ByProject(ctx, ids)
		for _, ds := range m {
			l.hintDeployments(ds)
		}
		return m, err
	})
	l.workflowsByProject = newLoader(func(ctx context.Context, ids []string) (map[string][]workflows.Workflow, error) {
		m, err := s.Workflows.ByProject(ctx, ids)
		for _, ws := range m {
			l.hintWorkflows(ws)
		}
		return m, err
	})
	l.workflowByID = newLoader(func(ctx context.Context, ids []string) (map[string]*workflows.Workflow, error) {
		m, err := s.Workflows.ByID(ctx, ids)
		for _, w := range m {
			l.hintWorkflows([]workflows.Workflow{*w})
		}
		return m, err
	})
	l.runsByWorkflow = newLoader(func(ctx context.Context, ids []string) (map[string][]workflows.Run, error) {
		m, err := s.Workflows.RunsByWorkflow(ctx, ids, nestedRuns)
		for _, rs := range m {
			l.hintRuns(rs)
		}
		return m, err
	})
	l.agentByID = newLoader(func(ctx context.Context, ids []string) (map[string]*agents.Agent, error) {
		m, err := s.Agents.AgentsByID(ctx, ids)
		for _, a := range m {
			l.hintAgents([]agents.Agent{*a})
		}
		return m, err
	})
	l.sessionsByAgent = newLoader(func(ctx context.Context, ids []string) (map[string][]agents.Session, error) {
		m, err := s.Agents.SessionsByAgent(ctx, ids, nestedSessions)
		for _, ss := range m {
			l.hintSessions(ss)
		}
		return m, err
	})
	l.webhookByID = newLoader(func(ctx context.Context, ids []string) (map[string]*webhooks.Subscription, error) {
		m, err := s.Webhooks.ByIDs(ctx, ids)
		for _, w := range m {
			l.projectByID.Hint(w.ProjectID)
		}
		return m, err
	})
	l.attemptsByDelivery = newLoader(func(ctx context.Context, ids []string) (map[string][]webhooks.Attempt, error) {
		return s.Webhooks.Attempts(ctx, ids)
	})
	return l
}

func (l *loaders) hintOrgs(os []orgs.Organization) {
	for _, o := range os {
		l.projectsByOrg.Hint(o.ID)
	}
}

func (l *loaders) hintProjects(ps []orgs.Project) {
	for _, p := range ps {
		l.orgByID.Hint(p.OrgID)
		l.installationsByProject.Hint(p.ID)
		l.deploymentsByProject.Hint(p.ID)
		l.workflowsByProject.Hint(p.ID)
	}
}

func (l *loaders) hintAssets(as []marketplace.Asset) {
	for _, a := range as {
		l.publisherByID.Hint(a.PublisherID)
		if a.Runtime != nil && *a.Runtime == marketplace.RuntimeONNX {
			l.modelByAsset.Hint(a.ID)
		}
	}
}

func (l *loaders) hintPublishers(ps []marketplace.Publisher) {
	for _, p := range ps {
		if p.OrgID != nil {
			l.orgByID.Hint(*p.OrgID)
		}
	}
}

func (l *loaders) hintInstallations(ins []marketplace.Installation) {
	for _, in := range ins {
		l.assetByID.Hint(in.AssetID)
		l.projectByID.Hint(in.ProjectID)
	}
}

func (l *loaders) hintDeployments(ds []deployments.Deployment) {
	for _, d := range ds {
		l.installationByID.Hint(d.InstallationID)
		l.projectByID.Hint(d.ProjectID)
	}
}

func (l *loaders) hintAgents(as []agents.Agent) {
	for _, a := range as {
		l.projectByID.Hint(a.ProjectID)
		l.sessionsByAgent.Hint(a.ID)
	}
}

func (l *loaders) hintSessions(ss []agents.Session) {
	for _, s := range ss {
		l.agentByID.Hint(s.AgentID)
	}
}

func (l *loaders) hintWorkflows(ws []workflows.Workflow) {
	for _, w := range ws {
		l.projectByID.Hint(w.ProjectID)
		l.runsByWorkflow.Hint(w.ID)
	}
}

func (l *loaders) hintRuns(rs []workflows.Run) {
	for _, r := range rs {
		l.workflowByID.Hint(r.WorkflowID)
	}
}

func (l *loaders) hintWebhooks(ws []webhooks.Subscription) {
	for _, w := range ws {
		l.projectByID.Hint(w.ProjectID)
	}
}

func (l *loaders) hintDeliveries(ds []webhooks.Delivery) {
	for _, d := range ds {
		l.webhookByID.Hint(d.WebhookID)
		l.attemptsByDelivery.Hint(d.ID)
	}
}

func (l *loaders) hintPatients(ps []patients.Patient) {
	ids := make([]string, len(ps))
	for i, p := range ps {
		ids[i] = p.ID
	}
	l.mu.Lock()
	l.patientHints = append(l.patientHints, ids...)
	obs := make([]*loader[string, []patients.Observation], 0, len(l.observationsL))
	for _, o := range l.observationsL {
		obs = append(obs, o)
	}
	encs := make([]*loader[string, []patients.Encounter], 0, len(l.encountersL))
	for _, e := range l.encountersL {
		encs = append(encs, e)
	}
	l.mu.Unlock()
	for _, o := range obs {
		o.Hint(ids...)
	}
	for _, e := range encs {
		e.Hint(ids...)
	}
}

func (l *loaders) observations(f patients.ObservationFilter) *loader[string, []patients.Observation] {
	l.mu.Lock()
	defer l.mu.Unlock()
	if o, ok := l.observationsL[f]; ok {
		return o
	}
	o := newLoader(func(ctx context.Context, ids []string) (map[string][]patients.Observation, error) {
		return l.s.Patients.ObservationsByPatient(ctx, ids, f)
	})
	o.Hint(l.patientHints...)
	l.observationsL[f] = o
	return o
}

func (l *loaders) encounters(limit int) *loader[string, []patients.Encounter] {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.encountersL[limit]; ok {
		return e
	}
	e := newLoader(func(ctx context.Context, ids []string) (map[string][]patients.Encounter, error) {
		return l.s.Patients.EncountersByPatient(ctx, ids, limit)
	})
	e.Hint(l.patientHints...)
	l.encountersL[limit] = e
	return e
}

type loadersKey struct{}

func withLoaders(ctx context.Context, l *loaders) context.Context {
	return context.WithValue(ctx, loadersKey{}, l)
}

func loadersFrom(ctx context.Context, s *Services) *loaders {
	if l, ok := ctx.Value(loadersKey{}).(*loaders); ok {
		return l
	}
	return newLoaders(s)
}
