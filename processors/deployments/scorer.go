package deployments

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/config"
	"carehub/kernel/events"
	"carehub/kernel/ids"
	"carehub/kernel/telemetry"
	"carehub/processors/inference/onnx"
	"carehub/storage/kafka"
	"carehub/storage/kafka/consume"
	"carehub/storage/kafka/publish"
	"carehub/storage/outbox"
)

// Defaults of ScorerConfig.
const (
	DefaultScorerGroup = "carehub-deployment-scorer"
	scorerBatch        = 2000
)

// ScorerConfig configures a Scorer.
type ScorerConfig struct {
	Brokers     []string          // required
	Credentials kafka.Credentials // authenticate to brokers that require SASL
	Group       string            // default DefaultScorerGroup
	ClientOpts  []kgo.Opt
	Logger      *slog.Logger
	Registerer  prometheus.Registerer
}

// Scorer is one member of the scoring consumer group: it reads carehub.events.v1 and, for every
// device.observation_received event of an organization with a RUNNING deployment that scores
// the stream (createDeployment scoreStream), runs the deployment's model on the patient's latest
// stored vitals and emits a deployment.prediction event, which webhooks, subscriptions and
// workflow triggers act on as on any other.
//
// A batch's events are scored together: one query for the latest vitals of its patients and one
// run of each model over all of them. A prediction's event id is derived from the deployment and
// the observation's event, so a batch delivered again (a crash before its offsets were
// committed) emits the same ids, which the event log and the other consumers take once:
// exactly once in effect. Offsets are committed after the predictions are acknowledged.
type Scorer struct {
	s   *Service
	cfg ScorerConfig
	cl  *kgo.Client
	r   *consume.Runner
	pub *publish.Acked
	log *slog.Logger

	models   models
	loadedAt time.Time
	scoring  []scoringDeployment

	predictions prometheus.Counter
	lag         prometheus.Gauge // observation event created → prediction emitted, of the last batch's newest
	closeOnce   sync.Once
}

// scoringDeployment is a RUNNING deployment that scores its organization's observations.
type scoringDeployment struct {
	id, orgID, sha string
	replicas       int
}

// Scorer returns the scoring consumer of the service's deployments; Run joins the group.
func (s *Service) Scorer(cfg ScorerConfig) (*Scorer, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("deployment scorer: no brokers")
	}
	config.Default(&cfg.Group, DefaultScorerGroup)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	kcfg := kafka.ClientConfig{Brokers: cfg.Brokers, Credentials: cfg.Credentials, ClientID: cfg.Group,
		Registerer: cfg.Registerer, Logger: cfg.Logger}
	opts := append(consume.GroupOpts(cfg.Group, s.eventsTopic),
		consume.StartRecent(kcfg, cfg.Group, s.eventsTopic, time.Minute, cfg.ClientOpts...))
	cl, err := kafka.NewClient(kcfg, append(opts, cfg.ClientOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("deployment scorer: %w", err)
	}
	log := cfg.Logger.With("component", "deployment_scorer")
	r, err := consume.New(cl, consume.Config{Name: "deployment_scorer", MaxRecords: scorerBatch, Logger: log, Registerer: cfg.Registerer})
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("deployment scorer: %w", err)
	}
	sc := &Scorer{s: s, cfg: cfg, cl: cl, r: r, pub: publish.NewAcked(cl), log: log,
		predictions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "deployments",
			Name: "stream_predictions_total", Help: "deployment.prediction events emitted by models scoring the observation stream."}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "carehub", Subsystem: "deployments",
			Name: "stream_scoring_lag_seconds", Help: "From an observation's event to its predictions, for the newest observation of the last scored batch."})}
	if cfg.Registerer != nil {
		sc.predictions = telemetry.Shared(cfg.Registerer, sc.predictions)
		sc.lag = telemetry.Shared(cfg.Registerer, sc.lag)
	}
	return sc, nil
}

// Close leaves the group and closes the Kafka client. Run calls it on return; it is idempotent.
func (sc *Scorer) Close() {
	sc.closeOnce.Do(func() {
		sc.cl.Close()
		sc.models.close()
	})
}

// Run scores observations until ctx ends and returns nil. A failed batch (the database, the
// broker) is rewound and scored again.
func (sc *Scorer) Run(ctx context.Context) error {
	defer sc.Close()
	return sc.r.Run(ctx, consume.Select(sc.observations, consume.Decode(sc.r.Skip, events.Decode, sc.handle)), consume.Commit(sc.cl, sc.log))
}

// observations reloads the scoring deployments unless the copy is newer than the batch's newest
// record (plus a second for clock skew), and keeps the observation events of their
// organizations, read by their head.
func (sc *Scorer) observations(ctx context.Context, recs []*kgo.Record) ([]*kgo.Record, error) {
	if consume.Stale(sc.loadedAt, recs) {
		if err := sc.reload(ctx); err != nil {
			return nil, err
		}
	}
	kept := recs[:0:0]
	for _, r := range recs {
		h, ok := events.PeekHead(r.Value)
		if !ok || h.Type == events.TypeDeviceObservationReceived && slices.ContainsFunc(sc.scoring, func(d scoringDeployment) bool { return d.orgID == h.OrgID }) {
			kept = append(kept, r)
		}
	}
	return kept, nil
}

// reload reads the RUNNING deployments that score the stream with a model of their own.
func (sc *Scorer) reload(ctx context.Context) error {
	at := time.Now()
	rows, _ := sc.s.pool.Query(ctx, `select d.id, d.org_id, m.sha256, d.replicas from deployments d
join installations i on i.id = d.installation_id join assets a on a.id = i.asset_id
join asset_models m on m.asset_id = a.id and m.version = a.version
where d.score_stream and d.status in ('RUNNING', 'DEGRADED') and d.backend is null`)
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (scoringDeployment, error) {
		var d scoringDeployment
		return d, row.Scan(&d.id, &d.orgID, &d.sha, &d.replicas)
	})
	if err != nil {
		return fmt.Errorf("scoring deployments: %w", err)
	}
	sc.scoring, sc.loadedAt = list, at
	return nil
}

// handle scores a batch of events with every scoring deployment of their organizations.
func (sc *Scorer) handle(ctx context.Context, evs []events.Event) error {
	// Each observation's payload is decoded once, whatever the number of deployments scoring it.
	var obsEvents []events.Event
	var observed []events.DeviceObservationReceived
	for _, ev := range evs {
		if ev.Type != events.TypeDeviceObservationReceived {
			continue
		}
		if p, ok := events.PayloadOf[events.DeviceObservationReceived](ev.Payload); ok && p.PatientID != "" {
			obsEvents, observed = append(obsEvents, ev), append(observed, p)
		}
	}
	var recs []*kgo.Record
	var newest time.Time
	for _, d := range sc.scoring {
		var mine []events.Event
		var theirs []events.DeviceObservationReceived
		for i, ev := range obsEvents {
			if ev.OrgID == d.orgID {
				mine, theirs = append(mine, ev), append(theirs, observed[i])
			}
		}
		if len(mine) == 0 {
			continue
		}
		lm, err := sc.models.get(ctx, sc.s.pool, d.sha, max(d.replicas, 1))
		if err != nil {
			return fmt.Errorf("scorer: deployment %s: %w", d.id, err)
		}
		if lm.features.names == nil {
			continue // a model that takes tensors only cannot score vitals
		}
		out, err := sc.score(ctx, d, lm, mine, theirs)
		if err != nil {
			return err
		}
		recs = append(recs, out...)
		if at := mine[len(mine)-1].CreatedAt; at.After(newest) {
			newest = at
		}
	}
	if len(recs) == 0 {
		return nil
	}
	if err := sc.pub.All(ctx, recs...); err != nil {
		return fmt.Errorf("scorer: emit predictions: %w", err)
	}
	sc.predictions.Add(float64(len(recs)))
	sc.lag.Set(time.Since(newest).Seconds())
	return nil
}

// score runs d's model once over the latest stored vitals of the patients of evs and returns
// one deployment.prediction record per event whose patient has every feature.
func (sc *Scorer) score(ctx context.Context, d scoringDeployment, lm *loadedModel, evs []events.Event, observed []events.DeviceObservationReceived) ([]*kgo.Record, error) {
	patients := make([]string, 0, len(observed))
	for _, p := range observed {
		if !slices.Contains(patients, p.PatientID) {
			patients = append(patients, p.PatientID)
		}
	}
	values, err := latestVitals(ctx, sc.s.pool, patients, lm.features.names)
	if err != nil {
		return nil, err
	}
	n := len(lm.features.names)
	row := map[string]int{} // patient → row of the batch
	var data []float32
	for _, pid := range patients {
		v, ok := values[pid]
		if !ok || len(v) < n {
			continue
		}
		row[pid] = len(row)
		for _, name := range lm.features.names {
			data = append(data, float32(v[name].value))
		}
	}
	if len(row) == 0 {
		return nil, nil
	}
	out, err := lm.model.Run(ctx, map[string]onnx.Tensor{lm.features.input: {Shape: []int64{int64(len(row)), int64(n)}, Data: data}})
	if err != nil {
		return nil, fmt.Errorf("scorer: deployment %s: %w", d.id, err)
	}
	first := lm.model.Signature().Outputs[0]
	result := out[first.Name]
	per := len(result.Data) / len(row)
	var recs []*kgo.Record
	for i, ev := range evs {
		r, ok := row[observed[i].PatientID]
		if !ok {
			continue
		}
		payload := events.DeploymentPrediction{DeploymentID: d.id, PatientID: observed[i].PatientID, ObservationID: observed[i].ObservationID, Model: lm.sha}
		if per == 1 && !math.IsNaN(float64(result.Data[r])) {
			p := float64(result.Data[r])
			payload.Probability = &p
		}
		pe, err := events.New(events.TypeDeploymentPrediction, ev.OrgID, ev.ProjectID, events.SourceDeployment, events.SeverityInfo, payload)
		if err != nil {
			return nil, fmt.Errorf("scorer: %w", err)
		}
		pe.ID = predictionID(d.id, ev)
		b, err := events.Encode(pe)
		if err != nil {
			return nil, fmt.Errorf("scorer: %w", err)
		}
		recs = append(recs, &kgo.Record{Topic: sc.s.eventsTopic, Key: []byte(ev.ProjectID), Value: b,
			Headers: []kgo.RecordHeader{{Key: outbox.HeaderEventID, Value: []byte(pe.ID)}}})
	}
	return recs, nil
}

// predictionID derives the id of deployment dep's prediction from the observation event ev: the
// same on every delivery of ev, ordered by ev's time.
func predictionID(dep string, ev events.Event) string {
	h := sha256.Sum256([]byte(dep + "\x00" + ev.ID))
	return ids.At(ids.Event, ev.CreatedAt, &seed{b: h[:]})
}

// seed reads the bytes of a hash as ids.At's randomness.
type seed struct{ b []byte }

func (s *seed) Read(p []byte) (int, error) {
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}
