package deployments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/clinical"
	"carehub/kernel/config"
	"carehub/kernel/tick"
	"carehub/processors/inference/onnx"
	"carehub/processors/marketplace"
)

// Defaults of ControllerConfig.
const (
	DefaultInterval       = 500 * time.Millisecond
	DefaultWindow         = time.Minute
	DefaultMinInvocations = 20
	DefaultDegradeRatio   = 0.5
	DefaultRecoverRatio   = 0.1
	DefaultRetention      = time.Hour
)

// ControllerConfig configures a Controller.
type ControllerConfig struct {
	// BaseURL returns {base_url}, the address clients reach the API at, e.g.
	// https://api.example.org. Endpoints are BaseURL() + "/v1/deployments/{id}/invoke". It is
	// called on every pass, so it may become known after the controller starts; while it returns
	// no absolute URL, deployments stay PENDING. Required.
	BaseURL func() string
	// Interval is the time between two passes. Default DefaultInterval.
	Interval time.Duration
	// Window is how far back invocation outcomes count. Default DefaultWindow.
	Window time.Duration
	// MinInvocations is the fewest invocations in the window that can make a deployment
	// DEGRADED. Default DefaultMinInvocations.
	MinInvocations int
	// DegradeRatio: failed/total at or above it makes RUNNING DEGRADED. Default
	// DefaultDegradeRatio.
	DegradeRatio float64
	// RecoverRatio: failed/total below it (or no invocations) makes DEGRADED RUNNING again.
	// Default DefaultRecoverRatio.
	RecoverRatio float64
	// Retention is how long invocation counts are kept. Default DefaultRetention.
	Retention time.Duration
	Logger    *slog.Logger
}

func (c *ControllerConfig) defaults() {
	config.Default(&c.Interval, DefaultInterval)
	config.Default(&c.Window, DefaultWindow)
	config.Default(&c.MinInvocations, DefaultMinInvocations)
	config.Default(&c.DegradeRatio, DefaultDegradeRatio)
	config.Default(&c.RecoverRatio, DefaultRecoverRatio)
	config.Default(&c.Retention, DefaultRetention)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Controller moves deployments between states: it starts PENDING ones and watches the health of
// serving ones. Run it in the processors role; several controllers may run at once.
type Controller struct {
	s       *Service
	cfg     ControllerConfig
	log     *slog.Logger
	cleaned time.Time
}

// Controller returns a controller of the service's deployments.
func (s *Service) Controller(cfg ControllerConfig) (*Controller, error) {
	if cfg.BaseURL == nil {
		return nil, errors.New("deployment controller: no base URL")
	}
	cfg.defaults()
	return &Controller{s: s, cfg: cfg, log: cfg.Logger.With("component", "deployment_controller")}, nil
}

// Run reconciles every Interval until ctx ends, then returns nil. Errors are logged and the pass
// is retried on the next tick.
func (c *Controller) Run(ctx context.Context) error {
	tick.NowAndEvery(ctx, c.cfg.Interval, func(ctx context.Context) {
		if _, err := c.Reconcile(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("deployment reconcile failed", "error", err)
		}
	})
	return nil
}

// Reconcile makes one pass: start PENDING deployments, then move serving ones between RUNNING
// and DEGRADED by their invocation outcomes. It returns how many transitions it made.
func (c *Controller) Reconcile(ctx context.Context) (int, error) {
	n, err := c.startPending(ctx)
	if err != nil {
		return n, err
	}
	m, err := c.checkHealth(ctx)
	n += m
	if err != nil {
		return n, err
	}
	if time.Since(c.cleaned) > time.Minute {
		if _, err := c.s.pool.Exec(ctx, `delete from deployment_invocations where bucket < now() - make_interval(secs => $1)`,
			c.cfg.Retention.Seconds()); err != nil {
			return n, fmt.Errorf("delete old invocation counts: %w", err)
		}
		c.cleaned = time.Now()
	}
	return n, nil
}

// baseURL returns the configured base URL without a trailing slash, or "" while it is not an
// absolute URL.
func (c *Controller) baseURL() string {
	raw := c.cfg.BaseURL()
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return ""
	}
	for len(raw) > 0 && raw[len(raw)-1] == '/' {
		raw = raw[:len(raw)-1]
	}
	return raw
}

// Endpoint is the invocation endpoint of deployment id under base.
func Endpoint(base, id string) string { return base + "/v1/deployments/" + id + "/invoke" }

func (c *Controller) startPending(ctx context.Context) (int, error) {
	base := c.baseURL()
	if base == "" {
		return 0, nil
	}
	n := 0
	err := pgx.BeginFunc(ctx, c.s.pool, func(tx pgx.Tx) error {
		type pending struct {
			Deployment
			runtime, model     *string
			assetName          string
			assetHIPAA, orgBAA bool
		}
		rows, _ := tx.Query(ctx, `select `+prefixed("d.", columns)+`, a.runtime, m.sha256, a.name, a.hipaa_compliant, o.hipaa_compliant
from deployments d join installations i on i.id = d.installation_id join assets a on a.id = i.asset_id
join organizations o on o.id = d.org_id left join asset_models m on m.asset_id = a.id and m.version = a.version
where d.status = 'PENDING' order by d.deployed_at, d.id limit 50 for update of d skip locked`)
		var list []pending
		var p pending
		d := &p.Deployment
		if _, err := pgx.ForEachRow(rows, []any{&d.ID, &d.OrgID, &d.ProjectID, &d.InstallationID, &d.Environment, &d.Status,
			&d.StatusReason, &d.Replicas, &d.Endpoint, &d.HIPAAMode, &d.Backend, &d.ScoreStream, &d.DeployedAt, &d.UpdatedAt,
			&p.runtime, &p.model, &p.assetName, &p.assetHIPAA, &p.orgBAA}, func() error {
			list = append(list, p)
			return nil
		}); err != nil {
			return fmt.Errorf("pending deployments: %w", err)
		}
		for _, p := range list {
			to, reason := StatusRunning, ""
			var endpoint *string
			switch {
			case p.HIPAAMode && !p.assetHIPAA:
				to, reason = StatusFailed, fmt.Sprintf("hipaaMode: asset %q is no longer HIPAA compliant", p.assetName)
			case p.HIPAAMode && !p.orgBAA:
				to, reason = StatusFailed, "hipaaMode: the organization has no business associate agreement on file"
			case p.Backend != nil:
				e := Endpoint(base, p.ID)
				endpoint = &e
				reason = fmt.Sprintf("serving model %q of %s (%s) with %d replica(s) per node", p.Backend.Model, p.Backend.URL, p.Backend.Protocol, p.Replicas)
			case p.runtime == nil:
				reason = "running without an endpoint: the asset has no built-in runtime carehub serves"
			default:
				if why := unservable(*p.runtime, p.model); why != "" {
					to, reason = StatusFailed, why
					break
				}
				e := Endpoint(base, p.ID)
				endpoint = &e
				reason = fmt.Sprintf("serving %s with %d replica(s) per node", *p.runtime, p.Replicas)
			}
			if err := c.move(ctx, tx, &p.Deployment, to, reason, endpoint); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, err
}

// unservable says why a deployment of an asset with runtime (and, for a model, the model of its
// version) cannot be served, or "" when it can.
func unservable(runtime string, model *string) string {
	if runtime != marketplace.RuntimeONNX {
		if _, ok := clinical.Lookup(runtime); !ok {
			return fmt.Sprintf("runtime %q is not available in this version of carehub", runtime)
		}
		return ""
	}
	if model == nil {
		return "the asset's version carries no model"
	}
	if err := onnx.Init(""); err != nil {
		return "the embedded ONNX Runtime is not available: " + err.Error()
	}
	return ""
}

// move writes a transition of d (locked by the caller) with its event.
func (c *Controller) move(ctx context.Context, tx pgx.Tx, d *Deployment, to, reason string, endpoint *string) error {
	from := d.Status
	rows, _ := tx.Query(ctx, `update deployments set status = $2, status_reason = $3, endpoint = $4, updated_at = now()
where id = $1 returning `+columns, d.ID, to, reason, endpoint)
	nd, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Deployment])
	if err != nil {
		return fmt.Errorf("move deployment %s to %s: %w", d.ID, to, err)
	}
	*d = *nd
	c.log.Info("deployment status changed", "deployment_id", d.ID, "from", from, "to", to, "reason", reason)
	return c.s.statusChanged(ctx, tx, d, from, reason)
}

// checkHealth moves serving deployments between RUNNING and DEGRADED by the invocation outcomes
// of the last Window.
func (c *Controller) checkHealth(ctx context.Context) (int, error) {
	rows, _ := c.s.pool.Query(ctx, `select d.id, d.status, coalesce(sum(s.succeeded), 0)::bigint, coalesce(sum(s.failed), 0)::bigint
from deployments d left join deployment_invocations s on s.deployment_id = d.id and s.bucket >= now() - make_interval(secs => $1)
where d.status in ('RUNNING', 'DEGRADED') and d.endpoint is not null group by d.id, d.status`, c.cfg.Window.Seconds())
	type health struct {
		id, status string
		ok, failed int64
	}
	var moves []health
	var h health
	if _, err := pgx.ForEachRow(rows, []any{&h.id, &h.status, &h.ok, &h.failed}, func() error {
		total := h.ok + h.failed
		ratio := 0.0
		if total > 0 {
			ratio = float64(h.failed) / float64(total)
		}
		switch {
		case h.status == StatusRunning && total >= int64(c.cfg.MinInvocations) && ratio >= c.cfg.DegradeRatio:
			moves = append(moves, h)
		case h.status == StatusDegraded && ratio < c.cfg.RecoverRatio:
			moves = append(moves, h)
		}
		return nil
	}); err != nil {
		return 0, fmt.Errorf("deployment health: %w", err)
	}
	n := 0
	for _, h := range moves {
		to := StatusDegraded
		reason := fmt.Sprintf("%d of %d invocations failed in the last %s", h.failed, h.ok+h.failed, c.cfg.Window)
		if h.status == StatusDegraded {
			to = StatusRunning
			reason = fmt.Sprintf("recovered: %d of %d invocations failed in the last %s", h.failed, h.ok+h.failed, c.cfg.Window)
		}
		err := pgx.BeginFunc(ctx, c.s.pool, func(tx pgx.Tx) error {
			rows, _ := tx.Query(ctx, `select `+columns+` from deployments where id = $1 and status = $2 for update skip locked`, h.id, h.status)
			d, err := pgx.CollectOneRow(rows, pgx.RowToAddrOfStructByName[Deployment])
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // moved meanwhile (stopped, or by another controller)
			}
			if err != nil {
				return err
			}
			n++
			return c.move(ctx, tx, d, to, reason, d.Endpoint)
		})
		if err != nil {
			return n, fmt.Errorf("deployment %s: %w", h.id, err)
		}
	}
	return n, nil
}

// prefixed qualifies every column of a comma-separated list with prefix.
func prefixed(prefix, list string) string {
	parts := strings.Split(list, ",")
	for i, c := range parts {
		parts[i] = prefix + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}
