package deployments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"carehub/kernel/access"
	"carehub/kernel/clinical"
	"carehub/kernel/config"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/kernel/phi"
	"carehub/kernel/telemetry"
	"carehub/processors/agents"
	"carehub/processors/marketplace"
	"carehub/storage/postgres"
)

// Defaults of InvokerConfig.
const (
	DefaultQueueWait     = 2 * time.Second
	DefaultQueuePerSlot  = 8
	DefaultCacheTTL      = time.Second
	DefaultFlushInterval = 2 * time.Second
	// DefaultBackendTimeout bounds one call to an external inference server.
	DefaultBackendTimeout = 10 * time.Second
)

// InvokerConfig configures an Invoker. The zero value is usable.
type InvokerConfig struct {
	// BackendTimeout bounds one call to a deployment's external inference server. Default
	// DefaultBackendTimeout.
	BackendTimeout time.Duration
	// ChatTimeout bounds one chat completion of an LLM agent. Default DefaultChatTimeout.
	ChatTimeout time.Duration
	// QueueWait is the longest a request waits for a free replica. Default DefaultQueueWait.
	QueueWait time.Duration
	// QueuePerReplica bounds the waiting requests per replica: beyond replicas × it a request is
	// refused at once. Default DefaultQueuePerSlot.
	QueuePerReplica int
	// CacheTTL is how long a node trusts its copy of a deployment (status, replicas): a stop
	// takes effect on every node within it. Default DefaultCacheTTL.
	CacheTTL time.Duration
	// FlushInterval is how often invocation counts are written for the Controller. Default
	// DefaultFlushInterval.
	FlushInterval time.Duration
	Logger        *slog.Logger
	Registerer    prometheus.Registerer
}

func (c *InvokerConfig) defaults() {
	config.Default(&c.QueueWait, DefaultQueueWait)
	config.Default(&c.QueuePerReplica, DefaultQueuePerSlot)
	config.Default(&c.CacheTTL, DefaultCacheTTL)
	config.Default(&c.FlushInterval, DefaultFlushInterval)
	config.Default(&c.BackendTimeout, DefaultBackendTimeout)
	config.Default(&c.ChatTimeout, DefaultChatTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// ErrOverloaded is the cause of the Unavailable fault a request gets when every replica is busy
// and the queue is full or the wait ran out; the transport answers 503 with Retry-After.
var ErrOverloaded = errors.New("deployment overloaded")

// Invoker serves the invoke endpoint of deployments on one node: a bounded pool of `replicas`
// execution slots per deployment, with a bounded wait queue in front. Run flushes its
// invocation counts, which the Controller reads to decide DEGRADED.
type Invoker struct {
	s      *Service
	guard  *phi.Guard
	cfg    InvokerConfig
	log    *slog.Logger
	nodeID string

	mu      sync.Mutex
	deps    map[string]*served
	stats   map[string]*counts
	models  models
	remotes *remotes

	invocations *prometheus.CounterVec
	latency     *prometheus.HistogramVec // by deployment: replica taken → answer
	queued      *prometheus.GaugeVec     // by deployment: requests waiting for a replica on this node
}

// served is a node's copy of a deployment it serves, with its replica pool.
type served struct {
	id, orgID, status string
	runtime           *string
	modelSHA          *string // the model of the asset's version, when it carries one
	backend           *Backend
	credential        string // the backend's, opened
	hipaaMode         bool
	replicas          int
	expires           time.Time
	pool              *replicaPool
}

type counts struct{ ok, failed atomic.Int64 }

// Invoker returns an invoker of the service's deployments; Run flushes its counts.
func (s *Service) Invoker(cfg InvokerConfig) *Invoker {
	cfg.defaults()
	inv := &Invoker{s: s, guard: phi.NewGuard(postgres.SyntheticPatients{Pool: s.pool}), cfg: cfg, log: cfg.Logger.With("component", "deployment_invoker"), nodeID: ids.New("node_"),
		deps: map[string]*served{}, stats: map[string]*counts{}, remotes: newRemotes(s.allowPrivate),
		invocations: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "deployments",
			Name: "invocations_total", Help: "Deployment invocations on this node, by runtime and outcome (ok, client_error, failed, overloaded)."},
			[]string{"runtime", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "carehub", Subsystem: "deployments",
			Name: "invocation_seconds", Help: "Time from taking a replica to the answer of a successful invocation, by deployment and runtime.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}},
			[]string{"deployment", "runtime"}),
		queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "carehub", Subsystem: "deployments",
			Name: "queue_depth", Help: "Invocations waiting for a free replica of the deployment on this node."},
			[]string{"deployment"})}
	if cfg.Registerer != nil {
		inv.invocations = telemetry.Shared(cfg.Registerer, inv.invocations)
		inv.latency = telemetry.Shared(cfg.Registerer, inv.latency)
		inv.queued = telemetry.Shared(cfg.Registerer, inv.queued)
	}
	return inv
}

// InvokeRequest is the body of POST /v1/deployments/{id}/invoke: exactly one of PatientID (score
// the patient's stored observations) and Vitals (score the values given, stored nowhere).
type InvokeRequest struct {
	PatientID string `json:"patientId,omitempty"`
	// Vitals maps a vital sign, by name (respiratory_rate, spo2, systolic_bp, diastolic_bp,
	// heart_rate, temperature, oxygen_flow, gcs) or LOINC code, to a number in its canonical
	// unit or to {value, unit}.
	Vitals map[string]json.RawMessage `json:"vitals,omitempty"`
	// Input carries skill options: spo2Scale, onOxygen, consciousness, window.
	Input json.RawMessage `json:"input,omitempty"`
	// Inputs are tensors for a model deployment (Open Inference Protocol v2's shape), instead of
	// patientId or vitals.
	Inputs []ModelTensor `json:"inputs,omitempty"`
}

// InvokeResult is the answer of an invocation.
type InvokeResult struct {
	DeploymentID string           `json:"deploymentId"`
	Runtime      string           `json:"runtime"`
	PatientID    string           `json:"patientId,omitempty"`
	Output       *clinical.Output `json:"output"` // a built-in skill's; null for a model
	// Prediction is a model deployment's answer (runtime onnx).
	Prediction *Prediction `json:"prediction,omitempty"`
	LatencyMs  int64       `json:"latencyMs"`  // from taking a replica to the output
	TokensUsed int         `json:"tokensUsed"` // clinical.Tokens of context and output, as for agents
	// Redacted is true when patientId and output were removed: scores of a stored patient are
	// patient data (phi.InvokeResult), served only to a caller that may read it.
	Redacted bool `json:"redacted,omitempty"`
	// Backend is how long an external inference server took to answer (its round trip, a retry
	// included); zero for the embedded runtimes. The REST route reports it as Server-Timing, so
	// a client can tell carehub's time from the server's.
	Backend time.Duration `json:"-"`
}

// Invoke runs deployment id's runtime for the caller. A deployment of another organization is
// NotFound; PENDING is Unavailable (retry); STOPPED, FAILED, or serving no endpoint is a Conflict.
// Inputs the runtime cannot score (a missing vital sign) are a Validation fault. When the
// deployment's replicas on this node are busy the request waits up to QueueWait; then, or when
// the queue is full, it is Unavailable wrapping ErrOverloaded. Requires exec:agents.
func (inv *Invoker) Invoke(ctx context.Context, id string, req InvokeRequest) (*InvokeResult, error) {
	p, err := access.Require(ctx, access.ExecAgents)
	if err != nil {
		return nil, err
	}
	d, err := inv.deployment(ctx, id)
	if err != nil {
		return nil, err
	}
	if d == nil || !p.SeesOrg(d.orgID) {
		return nil, fault.NotFound("deployment", id)
	}
	switch d.status {
	case StatusPending:
		return nil, fault.Unavailable("deployment %s is PENDING: it serves once RUNNING; retry shortly", id)
	case StatusStopped, StatusFailed:
		return nil, fault.Conflict("deployment %s is %s and serves no requests", id, d.status)
	}
	if d.backend != nil && d.backend.Protocol == ProtocolChat {
		return nil, fault.Conflict("deployment %s serves LLM agents: create an agent with its deploymentId and run the agent", id)
	}
	if d.backend != nil {
		return inv.invokeOnReplica(ctx, d, req, func(res *InvokeResult) error { return inv.invokeBackend(ctx, p, d, req, res) })
	}
	if d.runtime == nil {
		return nil, fault.Conflict("deployment %s serves no endpoint: its asset has no built-in runtime", id)
	}
	if *d.runtime == marketplace.RuntimeONNX {
		return inv.invokeOnReplica(ctx, d, req, func(res *InvokeResult) error { return inv.invokeModel(ctx, p, d, req, res) })
	}
	skill, ok := clinical.Lookup(*d.runtime)
	if !ok {
		return nil, fault.Conflict("deployment %s runs %q, which this node cannot serve", id, *d.runtime)
	}
	var opts clinical.Options
	bad := map[string]string{}
	if t := strings.TrimSpace(string(req.Input)); t != "" && t != "null" {
		if !strings.HasPrefix(t, "{") {
			bad["input"] = "must be a JSON object of skill options"
		} else if err := json.Unmarshal(req.Input, &opts); err != nil {
			bad["input"] = err.Error()
		}
	}
	switch {
	case req.PatientID == "" && len(req.Vitals) == 0:
		bad["patientId"] = "give patientId (score stored observations) or vitals (score the values given)"
	case req.PatientID != "" && len(req.Vitals) > 0:
		bad["vitals"] = "give either patientId or vitals, not both"
	case len(req.Vitals) > 0 && skill.Name() == clinical.SkillVitalsTrend:
		bad["vitals"] = "a trend needs a series: give patientId"
	}
	var obs []clinical.Observation
	if len(req.Vitals) > 0 && len(bad) == 0 {
		obs = vitalsObservations(req.Vitals, bad)
	}
	if len(bad) > 0 {
		return nil, fault.Validation("invalid invocation", bad)
	}

	return inv.invokeOnReplica(ctx, d, req, func(res *InvokeResult) error {
		res.Runtime = skill.Name()
		var as agents.Assessment
		if req.PatientID != "" {
			if err := inv.patientVisible(ctx, p, d, req.PatientID); err != nil {
				return err
			}
			var err error
			if as, err = agents.Assess(ctx, inv.s.pool, skill, req.PatientID, opts); err != nil {
				return fmt.Errorf("invoke %s: %w", id, err)
			}
		} else {
			as = assessVitals(skill, obs, opts)
		}
		if as.Output == nil {
			return fault.Validation("the runtime could not score this input", map[string]string{"vitals": as.Failure})
		}
		res.Output, res.TokensUsed = as.Output, as.Tokens
		return nil
	})
}

// patientVisible checks that patientID is a patient of d's organization that the caller may
// see (a test key: synthetic ones only), NotFound otherwise, and records the access.
func (inv *Invoker) patientVisible(ctx context.Context, p *access.Principal, d *served, patientID string) error {
	var found bool
	err := inv.s.pool.QueryRow(ctx, `select exists(select 1 from patients where id = $1 and org_id = $2 and ($3 or synthetic))`,
		patientID, d.orgID, p.SeesRealPatients()).Scan(&found)
	switch {
	case err != nil:
		return fmt.Errorf("invoke %s: %w", d.id, err)
	case !found:
		return fault.NotFound("patient", patientID)
	}
	access.Touch(ctx, access.KindPatient, patientID)
	return nil
}

// invokeOnReplica runs one invocation of d on a replica of this node, counts its outcome, and
// redacts a stored patient's result for a caller who may not read it.
func (inv *Invoker) invokeOnReplica(ctx context.Context, d *served, req InvokeRequest, run func(*InvokeResult) error) (*InvokeResult, error) {
	queued := inv.queued.WithLabelValues(d.id)
	release, err := d.pool.acquire(ctx, inv.cfg.QueueWait, queued)
	if err != nil {
		if errors.Is(err, ErrOverloaded) {
			inv.count(d, "overloaded")
		}
		return nil, err
	}
	defer release()
	start := time.Now()
	res := &InvokeResult{DeploymentID: d.id, PatientID: req.PatientID}
	if err := run(res); err != nil {
		switch fault.KindOf(err) {
		case fault.KindValidation, fault.KindNotFound, fault.KindConflict:
			inv.count(d, "client_error")
		default:
			inv.count(d, "failed")
		}
		return nil, err
	}
	took := time.Since(start)
	res.LatencyMs = took.Milliseconds()
	inv.latency.WithLabelValues(d.id, res.Runtime).Observe(took.Seconds())
	inv.count(d, "ok")
	return inv.redact(ctx, d, res)
}

// redact removes a stored patient's result from res when the caller may not read it.
func (inv *Invoker) redact(ctx context.Context, d *served, res *InvokeResult) (*InvokeResult, error) {
	if res.PatientID == "" {
		return res, nil
	}
	ok, err := inv.guard.Serve(ctx, []phi.Subject{{OrgID: d.orgID, Patients: []string{res.PatientID}, Need: phi.InvokeResult.Need}})
	if err != nil {
		return nil, fmt.Errorf("invoke %s: %w", d.id, err)
	}
	if !ok[0] {
		res.PatientID, res.Output, res.Prediction, res.Redacted = "", nil, nil, true
	}
	return res, nil
}

// vitalsObservations turns an invocation's vitals into observations, recording problems in bad.
func vitalsObservations(vitals map[string]json.RawMessage, bad map[string]string) []clinical.Observation {
	now := time.Now().UTC()
	var out []clinical.Observation
	for key, raw := range vitals {
		vs, ok := clinical.VitalByCode(key)
		if !ok {
			for _, v := range clinical.VitalSigns() {
				if v.Name == key {
					vs, ok = v, true
				}
			}
		}
		if !ok {
			bad["vitals."+key] = "not a vital sign: use a name (respiratory_rate, spo2, systolic_bp, diastolic_bp, heart_rate, temperature, oxygen_flow, gcs) or its LOINC code"
			continue
		}
		var q struct {
			Value *float64 `json:"value"`
			Unit  string   `json:"unit"`
		}
		var x float64
		if err := json.Unmarshal(raw, &x); err == nil {
			q.Value, q.Unit = &x, vs.Unit
		} else if err := json.Unmarshal(raw, &q); err != nil || q.Value == nil {
			bad["vitals."+key] = "must be a number (in " + vs.Unit + ") or {value, unit}"
			continue
		}
		if q.Unit == "" {
			q.Unit = vs.Unit
		}
		out = append(out, clinical.Observation{Code: vs.Code, Value: *q.Value, Unit: q.Unit, EffectiveAt: now})
	}
	return out
}

// assessVitals runs skill over given values, accounted as agents.Assess accounts stored ones.
func assessVitals(skill clinical.Skill, obs []clinical.Observation, opts clinical.Options) agents.Assessment {
	var as agents.Assessment
	ctxJSON, _ := json.Marshal(struct {
		Skill        string                 `json:"skill"`
		Options      clinical.Options       `json:"options"`
		Observations []clinical.Observation `json:"observations"`
	}{skill.Name(), opts, obs})
	as.Tokens = clinical.Tokens(string(ctxJSON))
	out, err := skill.Run(clinical.NewInput(obs, opts))
	if ie, ok := errors.AsType[*clinical.InputError](err); ok {
		as.Failure = ie.Error()
		return as
	}
	if err != nil {
		as.Failure = err.Error()
		return as
	}
	b, _ := json.Marshal(out)
	as.Tokens += clinical.Tokens(string(b))
	as.Output = &out
	return as
}

// deployment returns this node's copy of deployment id, reloading it after CacheTTL; nil when it
// does not exist.
func (inv *Invoker) deployment(ctx context.Context, id string) (*served, error) {
	inv.mu.Lock()
	d := inv.deps[id]
	inv.mu.Unlock()
	if d != nil && time.Now().Before(d.expires) {
		return d, nil
	}
	var nd served
	var sealed []byte
	err := inv.s.pool.QueryRow(ctx, `select d.id, d.org_id, d.status, d.replicas, a.runtime, m.sha256, d.backend, d.backend_credential, d.hipaa_mode
from deployments d join installations i on i.id = d.installation_id join assets a on a.id = i.asset_id
left join asset_models m on m.asset_id = a.id and m.version = a.version where d.id = $1`, id).Scan(
		&nd.id, &nd.orgID, &nd.status, &nd.replicas, &nd.runtime, &nd.modelSHA, &nd.backend, &sealed, &nd.hipaaMode)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err == nil {
		nd.credential, err = inv.s.credentials.open(id, sealed)
	}
	if err != nil {
		return nil, fmt.Errorf("deployment %s: %w", id, err)
	}
	nd.expires = time.Now().Add(inv.cfg.CacheTTL)
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if cur := inv.deps[id]; cur != nil && cur.replicas == nd.replicas {
		nd.pool = cur.pool // keep the slots in use
	} else {
		nd.pool = newReplicaPool(nd.replicas, nd.replicas*inv.cfg.QueuePerReplica)
	}
	if nd.status == StatusStopped || nd.status == StatusFailed {
		delete(inv.deps, id) // nothing to serve; a later request reloads
		return &nd, nil
	}
	inv.deps[id] = &nd
	return &nd, nil
}

// count records one outcome: failed and overloaded count against the deployment's health.
func (inv *Invoker) count(d *served, outcome string) {
	runtime := ""
	if d.runtime != nil {
		runtime = *d.runtime
	}
	inv.invocations.WithLabelValues(runtime, outcome).Inc()
	inv.mu.Lock()
	c := inv.stats[d.id]
	if c == nil {
		c = &counts{}
		inv.stats[d.id] = c
	}
	inv.mu.Unlock()
	if outcome == "failed" || outcome == "overloaded" {
		c.failed.Add(1)
	} else {
		c.ok.Add(1)
	}
}

// Run writes invocation counts every FlushInterval until ctx ends, then once more, and returns
// nil.
func (inv *Invoker) Run(ctx context.Context) error {
	t := time.NewTicker(inv.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			defer inv.models.close()
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := inv.Flush(fctx); err != nil {
				inv.log.Warn("final flush of invocation counts failed", "error", err)
			}
			return nil
		case <-t.C:
			if err := inv.Flush(ctx); err != nil && ctx.Err() == nil {
				inv.log.Warn("flush of invocation counts failed; kept for the next", "error", err)
			}
		}
	}
}

// Flush adds the counts since the last flush to the current 10-second bucket of this node. On
// failure the counts are kept for the next flush.
func (inv *Invoker) Flush(ctx context.Context) error {
	inv.mu.Lock()
	taken := inv.stats
	inv.stats = map[string]*counts{}
	inv.mu.Unlock()
	var depIDs []string
	var oks, fails []int64
	for id, c := range taken {
		ok, failed := c.ok.Load(), c.failed.Load()
		if ok+failed == 0 {
			continue
		}
		depIDs, oks, fails = append(depIDs, id), append(oks, ok), append(fails, failed)
	}
	if len(depIDs) == 0 {
		return nil
	}
	_, err := inv.s.pool.Exec(ctx, `insert into deployment_invocations (deployment_id, bucket, node_id, succeeded, failed)
select d, to_timestamp(floor(extract(epoch from now()) / 10) * 10), $4, o, f from unnest($1::text[], $2::bigint[], $3::bigint[]) as t(d, o, f)
where exists (select 1 from deployments where id = d)
on conflict (deployment_id, bucket, node_id) do update
set succeeded = deployment_invocations.succeeded + excluded.succeeded, failed = deployment_invocations.failed + excluded.failed`,
		depIDs, oks, fails, inv.nodeID)
	if err != nil {
		inv.mu.Lock()
		for id, c := range taken {
			cur := inv.stats[id]
			if cur == nil {
				inv.stats[id] = c
				continue
			}
			cur.ok.Add(c.ok.Load())
			cur.failed.Add(c.failed.Load())
		}
		inv.mu.Unlock()
		return fmt.Errorf("flush invocation counts: %w", err)
	}
	return nil
}

// replicaPool bounds the concurrent executions of one deployment on one node (its replicas)
// and the requests waiting for one.
type replicaPool struct {
	slots      chan struct{}
	waiting    atomic.Int64
	maxWaiting int64
}

func newReplicaPool(replicas, maxWaiting int) *replicaPool {
	return &replicaPool{slots: make(chan struct{}, replicas), maxWaiting: int64(maxWaiting)}
}

// acquire takes a replica, waiting up to wait (counted in queued meanwhile); it returns the
// function that gives it back.
func (p *replicaPool) acquire(ctx context.Context, wait time.Duration, queued prometheus.Gauge) (func(), error) {
	release := func() { <-p.slots }
	select {
	case p.slots <- struct{}{}:
		return release, nil
	default:
	}
	if p.waiting.Add(1) > p.maxWaiting {
		p.waiting.Add(-1)
		return nil, fault.Wrap(fault.KindUnavailable, ErrOverloaded, "every replica is busy and the queue is full; retry shortly")
	}
	defer p.waiting.Add(-1)
	queued.Inc()
	defer queued.Dec()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case p.slots <- struct{}{}:
		return release, nil
	case <-t.C:
		return nil, fault.Wrap(fault.KindUnavailable, ErrOverloaded, "every replica stayed busy; retry shortly")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
