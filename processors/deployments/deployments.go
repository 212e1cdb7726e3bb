// Package deployments serves deployments of installed assets: an environment, a replica count, an
// optional HIPAA mode and, for assets with a built-in runtime, a live endpoint.
//
// # States (DECISIONS §6)
//
//	PENDING  → RUNNING   the Controller started it (endpoint set when the asset has a runtime)
//	PENDING  → FAILED    it cannot run: its runtime is unknown to this build (or, for a model,
//	                     the embedded ONNX Runtime is not installed), or hipaaMode's
//	                     conditions no longer hold (the organization lost its BAA)
//	RUNNING  → DEGRADED  invocations failed (5xx: errors, capacity refusals) at or above
//	                     DegradeRatio over the last Window, with at least MinInvocations
//	DEGRADED → RUNNING   the failure ratio over the Window fell below RecoverRatio
//	PENDING, RUNNING, DEGRADED → STOPPED   stopDeployment; the endpoint is released
//
// Every transition is written with a deployment.status_changed event (deploymentId,
// installationId, from, to, reason) in one transaction.
//
// An asset without a built-in runtime (a connector, a dataset, a model hosted elsewhere) still
// deploys: it goes RUNNING with endpoint null and statusReason saying so, because the deployment
// records the installation's configuration in an environment, which is meaningful without code
// that carehub runs. FAILED is kept for deployments that should serve and cannot.
//
// # Serving
//
// Deployments of assets with a built-in runtime (news2, qsofa, vitals_trend), and of MODEL
// assets whose version carries a model (runtime onnx: marketplace.AttachModel; model.go), serve
// POST {base_url}/v1/deployments/{id}/invoke (Invoker, invoke.go) on every api node, with
// `replicas` concurrent executions per node; requests beyond them wait up to QueueWait in a
// bounded queue and are then refused 503 with Retry-After. A model runs on the embedded ONNX
// Runtime (processors/inference/onnx), one session per replica, loaded once per node from the
// content-addressed artifact; it scores vitals given by name or a patient's latest stored ones
// when its metadata names its features (FeaturesKey), or tensors given as inputs.
//
// The Controller (controller.go) runs in the processors role of any number of nodes: each pass
// claims rows with FOR UPDATE SKIP LOCKED, so two controllers never move one deployment twice.
package deployments

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
	"carehub/kernel/config"
	"carehub/kernel/events"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/kernel/sealing"
	"carehub/processors/internal/scoped"
	"carehub/storage/idempotency"
	"carehub/storage/kafka"
	"carehub/storage/outbox"
)

// Statuses of a deployment.
const (
	StatusPending  = "PENDING"
	StatusRunning  = "RUNNING"
	StatusDegraded = "DEGRADED"
	StatusStopped  = "STOPPED"
	StatusFailed   = "FAILED"
)

// Replica bounds (the deployments table's check).
const (
	MinReplicas = 1
	MaxReplicas = 16
)

// Deployment is a deployment of an installation.
type Deployment struct {
	ID             string    `db:"id"`
	OrgID          string    `db:"org_id"`
	ProjectID      string    `db:"project_id"`
	InstallationID string    `db:"installation_id"`
	Environment    string    `db:"environment"`
	Status         string    `db:"status"`
	StatusReason   *string   `db:"status_reason"`
	Replicas       int       `db:"replicas"`
	Endpoint       *string   `db:"endpoint"`
	HIPAAMode      bool      `db:"hipaa_mode"`
	Backend        *Backend  `db:"backend"`      // the external inference server it sends invocations to, if any
	ScoreStream    bool      `db:"score_stream"` // its model scores the organization's observations as they arrive
	DeployedAt     time.Time `db:"deployed_at"`
	UpdatedAt      time.Time `db:"updated_at"`
}

// Service manages deployments. It is safe for concurrent use.
type Service struct {
	pool         *pgxpool.Pool
	eventsTopic  string
	credentials  credentialBox
	allowPrivate bool
}

// Config configures a Service. Zero fields take their defaults.
type Config struct {
	// EventsTopic is the topic events are written to. Default kafka.DefaultTopics().Events.
	EventsTopic string
	// Key seals backend credentials; every node must have the same. Default: a random key of
	// this Service's own, for tests.
	Key *sealing.Key
	// AllowPrivate lets a backend's URL name loopback and private addresses (an on-premises
	// inference server, tests); otherwise carehub connects to public addresses only.
	AllowPrivate bool
}

func (c *Config) defaults() { config.Default(&c.EventsTopic, kafka.DefaultTopics().Events) }

// New returns the service on pool.
func New(pool *pgxpool.Pool, cfg Config) *Service {
	cfg.defaults()
	return &Service{pool: pool, eventsTopic: cfg.EventsTopic, credentials: newCredentialBox(cfg.Key), allowPrivate: cfg.AllowPrivate}
}

const columns = `id, org_id, project_id, installation_id, environment, status, status_reason, replicas, endpoint,
hipaa_mode, backend, score_stream, deployed_at, updated_at`

var environmentName = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// Spec is what createDeployment asks for.
type Spec struct {
	Environment string // a lowercase name such as production or staging
	Replicas    *int   // default 1, 1..16
	HIPAAMode   bool
	// Backend, when set, is the external inference server the deployment sends invocations to.
	Backend *BackendInput
	// ScoreStream: the deployment's model scores its organization's observations as they
	// arrive, emitting deployment.prediction events (Scorer).
	ScoreStream bool
}

// Create deploys an installation of the caller's organization: PENDING, with replicas (default 1,
// 1..16) in environment (a lowercase name such as production or staging). HIPAA mode needs an
// asset whose compliance score says HIPAA compliant and an organization with a BAA on file.
// With backend, the deployment sends its invocations to that external inference server (its
// credential sealed) instead of running the asset's runtime. Requires admin:org.
func (s *Service) Create(ctx context.Context, installationID string, spec Spec) (*Deployment, error) {
	environment, replicas, hipaaMode, backend := spec.Environment, spec.Replicas, spec.HIPAAMode, spec.Backend
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	n := 1
	if replicas != nil {
		n = *replicas
	}
	bad := map[string]string{}
	if !environmentName.MatchString(environment) {
		bad["environment"] = "must be a lowercase name of up to 32 letters, digits and dashes, such as production or staging"
	}
	if n < MinReplicas || n > MaxReplicas {
		bad["replicas"] = fmt.Sprintf("must be %d to %d", MinReplicas, MaxReplicas)
	}
	if backend != nil {
		maps.Copy(bad, backend.check(s.allowPrivate))
	}
	if len(bad) > 0 {
		return nil, fault.Validation("invalid deployment", bad)
	}
	var out *Deployment
	err = idempotency.Tx(ctx, s.pool, &out, func(tx pgx.Tx) error {
		var orgID, projectID, assetName string
		var assetHIPAA, orgHIPAA bool
		err := tx.QueryRow(ctx, `select i.org_id, i.project_id, a.name, a.hipaa_compliant, o.hipaa_compliant
from installations i join assets a on a.id = i.asset_id join organizations o on o.id = i.org_id
where i.id = $1 and ($2 = '' or i.org_id = $2)`, installationID, p.OrgFilter()).Scan(&orgID, &projectID, &assetName, &assetHIPAA, &orgHIPAA)
		if errors.Is(err, pgx.ErrNoRows) {
			return fault.NotFound("installation", installationID)
		}
		if err != nil {
			return fmt.Errorf("installation %s: %w", installationID, err)
		}
		if hipaaMode && !assetHIPAA {
			return fault.Validation("hipaaMode needs a HIPAA-compliant asset", map[string]string{
				"hipaaMode": fmt.Sprintf("asset %q is not HIPAA compliant", assetName)})
		}
		if hipaaMode && !orgHIPAA {
			return fault.Validation("hipaaMode needs an organization with a signed BAA", map[string]string{
				"hipaaMode": "the organization has no business associate agreement on file"})
		}
		id := ids.New(ids.Deployment)
		var b *Backend
		var credential []byte
		if backend != nil {
			b, credential = &backend.Backend, s.credentials.seal(id, backend.Authorization)
		}
		rows, _ := tx.Query(ctx, `insert into deployments (id, org_id, project_id, installation_id, environment, status,
status_reason, replicas, hipaa_mode, backend, backend_credential, score_stream)
values ($1, $2, $3, $4, $5, 'PENDING', 'created', $6, $7, $8, $9, $10)
returning `+columns, id, orgID, projectID, installationID, environment, n, hipaaMode, b, credential, spec.ScoreStream)
		if out, err = pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Deployment]); err != nil {
			return fmt.Errorf("insert deployment: %w", err)
		}
		return s.statusChanged(ctx, tx, out, "", "created")
	})
	if err != nil {
		return nil, fault.Context(err, "create deployment")
	}
	return out, nil
}

// Stop moves a PENDING, RUNNING or DEGRADED deployment to STOPPED and releases its endpoint; a
// STOPPED or FAILED one is a Conflict. Nodes stop serving it within InvokerConfig.CacheTTL.
// Requires admin:org.
func (s *Service) Stop(ctx context.Context, id string) (*Deployment, error) {
	p, err := access.Require(ctx, access.AdminOrg)
	if err != nil {
		return nil, err
	}
	var out *Deployment
	err = idempotency.Tx(ctx, s.pool, &out, func(tx pgx.Tx) error {
		var from string
		err := tx.QueryRow(ctx, `select status from deployments where id = $1 and ($2 = '' or org_id = $2) for update`,
			id, p.OrgFilter()).Scan(&from)
		if errors.Is(err, pgx.ErrNoRows) {
			return fault.NotFound("deployment", id)
		}
		if err != nil {
			return fmt.Errorf("deployment %s: %w", id, err)
		}
		if from == StatusStopped || from == StatusFailed {
			return fault.Conflict("deployment %s is already %s", id, from)
		}
		rows, _ := tx.Query(ctx, `update deployments set status = 'STOPPED', status_reason = 'stopped by request',
endpoint = null, updated_at = now() where id = $1 returning `+columns, id)
		if out, err = pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Deployment]); err != nil {
			return fmt.Errorf("stop deployment: %w", err)
		}
		return s.statusChanged(ctx, tx, out, from, "stopped by request")
	})
	if err != nil {
		return nil, fault.Context(err, "stop deployment")
	}
	return out, nil
}

// statusChanged writes d's deployment.status_changed event (d holds the new state) in tx.
func (s *Service) statusChanged(ctx context.Context, tx pgx.Tx, d *Deployment, from, reason string) error {
	severity := events.SeverityInfo
	switch d.Status {
	case StatusDegraded:
		severity = events.SeverityWarning
	case StatusFailed:
		severity = events.SeverityError
	}
	ev, err := events.New(events.TypeDeploymentStatusChanged, d.OrgID, d.ProjectID, events.SourceDeployment, severity,
		map[string]any{"deploymentId": d.ID, "installationId": d.InstallationID, "from": from, "to": d.Status, "reason": reason})
	if err != nil {
		return err
	}
	return outbox.AppendEvents(ctx, tx, s.eventsTopic, ev)
}

// Deployment returns one deployment of the caller's organization.
func (s *Service) Deployment(ctx context.Context, id string) (*Deployment, error) {
	return scoped.One[Deployment](ctx, s.pool, "deployment", columns, "deployments", id)
}

// Deployments returns up to limit deployments of a project, newest first. A project the caller
// cannot see is NotFound.
func (s *Service) Deployments(ctx context.Context, projectID string, limit int) ([]Deployment, error) {
	return scoped.InProject[Deployment](ctx, s.pool, columns, "deployments", projectID, `order by deployed_at desc, id desc limit $3`, limit)
}

// ByProject returns the deployments of each project among projectIDs, newest first (a batched
// loader).
func (s *Service) ByProject(ctx context.Context, projectIDs []string) (map[string][]Deployment, error) {
	return scoped.Grouped(ctx, s.pool, columns, "deployments", "project_id", "project", projectIDs, "deployed_at desc, id desc",
		func(d *Deployment) string { return d.ProjectID })
}

// ByID returns the caller's deployments among ids (a batched loader).
func (s *Service) ByID(ctx context.Context, ids []string) (map[string]*Deployment, error) {
	return scoped.ByID(ctx, s.pool, columns, "deployments", ids, func(v *Deployment) string { return v.ID })
}
