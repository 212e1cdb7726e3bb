package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/access"
	"carehub/kernel/config"
	"carehub/kernel/events"
	"carehub/kernel/telemetry"
	"carehub/storage"
	"carehub/storage/kafka"
	"carehub/storage/kafka/consume"
	"carehub/storage/postgres"
)

// Defaults of TriggersConfig.
const (
	DefaultTriggersGroup    = "carehub-workflow-triggers"
	DefaultTriggersClientID = "carehub-workflow-triggers"
	// MaxTriggerDepth bounds trigger chains: a run started by an event that a triggered run
	// caused (through its own events, its agent sessions or its reports) has depth + 1, and
	// no run deeper than this is started. A workflow is never started by its own runs' events.
	MaxTriggerDepth = 3
	// TriggerObservation is the event type whose runs get the spec's input {observation_id,
	// patient_id, device_type}, and which matches workflows of every project of its organization
	// (observations belong to the organization; their events are filed under its oldest project).
	TriggerObservation = events.TypeDeviceObservationReceived
	triggerBatch       = 500
)

// TriggersConfig configures Triggers.
type TriggersConfig struct {
	Brokers     []string          // required
	Credentials kafka.Credentials // authenticate to brokers that require SASL
	ClientID    string            // default DefaultTriggersClientID
	ClientOpts  []kgo.Opt
	Group       string // default DefaultTriggersGroup
	// DeadLetterTopic receives the events whose runs Postgres refuses (storage.ErrUnstorable:
	// a payload the run's jsonb input cannot hold); default kafka.DefaultTopics().EventsDLQ,
	// which the event log shares (the carehub-dlq-consumer header, "workflow_triggers", tells
	// them apart).
	DeadLetterTopic string
	// Service is the workflow service (its pool and topics). Required.
	Service    *Service
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Triggers is one member of the trigger consumer group: it reads carehub.events.v1 and starts a
// run (trigger "event") of every ACTIVE workflow whose trigger patterns match an event, once per
// workflow and event id however often the event is delivered.
//
// Matching is in memory against the ACTIVE workflows that have triggers, reloaded before a batch
// whenever the copy is older than the newest record in the batch (plus a second for clock skew),
// so a workflow created before an event was emitted sees it. Events are matched by their head
// first (events.PeekHead), and only those that start a run are decoded. Offsets are committed
// after a batch's runs are committed. A new group starts with the events of the minute before it
// first joined, not with the topic's whole history.
type Triggers struct {
	cfg TriggersConfig
	cl  *kgo.Client
	r   *consume.Runner
	log *slog.Logger

	loadedAt     time.Time
	workflows    []triggered
	started      prometheus.Counter
	deadLettered prometheus.Counter
	closeOnce    sync.Once
}

// triggered is an ACTIVE workflow with triggers.
type triggered struct {
	id, orgID, projectID string
	mode                 string // its creator's: its runs' (Create)
	patterns             []string
}

func (c *TriggersConfig) defaults() {
	config.Default(&c.ClientID, DefaultTriggersClientID)
	config.Default(&c.Group, DefaultTriggersGroup)
	config.Default(&c.DeadLetterTopic, kafka.DefaultTopics().EventsDLQ)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// NewTriggers builds the trigger consumer and its Kafka client; Run joins the group.
func NewTriggers(cfg TriggersConfig) (*Triggers, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("workflow triggers: no brokers")
	}
	if cfg.Service == nil {
		return nil, errors.New("workflow triggers: no workflow service")
	}
	cfg.defaults()
	kcfg := kafka.ClientConfig{Brokers: cfg.Brokers, Credentials: cfg.Credentials, ClientID: cfg.ClientID, Registerer: cfg.Registerer,
		Logger: cfg.Logger}
	opts := append(consume.GroupOpts(cfg.Group, cfg.Service.eventsTopic),
		consume.StartRecent(kcfg, cfg.Group, cfg.Service.eventsTopic, time.Minute, cfg.ClientOpts...))
	cl, err := kafka.NewClient(kcfg, append(opts, cfg.ClientOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("workflow triggers: %w", err)
	}
	log := cfg.Logger.With("component", "workflow_triggers")
	r, err := consume.New(cl, consume.Config{Name: "workflow_triggers", MaxRecords: triggerBatch, Logger: log, Registerer: cfg.Registerer})
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("workflow triggers: %w", err)
	}
	t := &Triggers{cfg: cfg, cl: cl, r: r, log: log,
		started: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "workflow_triggers",
			Name: "runs_started_total", Help: "Workflow runs started by events matching trigger patterns."}),
		deadLettered: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "carehub", Subsystem: "workflow_triggers",
			Name: "dead_lettered_total", Help: "Events whose runs Postgres refused, set aside on the dead-letter topic (alert on any)."})}
	if cfg.Registerer != nil {
		t.started = telemetry.Shared(cfg.Registerer, t.started)
		t.deadLettered = telemetry.Shared(cfg.Registerer, t.deadLettered)
	}
	return t, nil
}

// Close leaves the group and closes the Kafka client. Run calls it on return; it is idempotent.
func (t *Triggers) Close() { t.closeOnce.Do(t.cl.Close) }

// Run consumes events until ctx ends and returns nil. Database errors are retried with backoff
// (the batch is rewound and handled again; starts are idempotent: one run per workflow and
// event, so a replayed event starts none twice). An event whose run Postgres refuses as data
// would be refused on every retry and stop every trigger behind it: consume.DeadLetter handles
// the batch by halves and sets each event refused alone aside on the dead-letter topic.
func (t *Triggers) Run(ctx context.Context) error {
	defer t.Close()
	deadLetter := consume.DeadLetter(consume.DeadLetterConfig{
		Name: "workflow_triggers", Topic: t.cfg.DeadLetterTopic, Producer: t.cl, Logger: t.log,
		Permanent:    storage.IsUnstorable,
		Reason:       storage.Refusal,
		OnDeadLetter: func(*kgo.Record) { t.deadLettered.Inc() },
	})
	return t.r.Run(ctx, consume.Select(t.triggering, consume.Decode(t.r.Skip, events.Decode, t.handle)), consume.Commit(t.cl, t.log), deadLetter)
}

// triggering reloads the workflows unless the copy is newer than the batch's newest record
// (plus a second for clock skew) and returns the records of recs that may start a run, read by
// their head (events.PeekHead): most events start none, and are passed over without decoding
// them. A record whose head cannot be read is kept: decoding it tells.
//
// A record's timestamp is when it was produced, after its event was created, so a workflow
// active before an event was created is in a copy loaded after the record's timestamp.
func (t *Triggers) triggering(ctx context.Context, recs []*kgo.Record) ([]*kgo.Record, error) {
	if consume.Stale(t.loadedAt, recs) {
		if err := t.reload(ctx); err != nil {
			return nil, err
		}
	}
	kept := make([]*kgo.Record, 0, len(recs))
	for _, r := range recs {
		h, ok := events.PeekHead(r.Value)
		if !ok || slices.ContainsFunc(t.workflows, func(w triggered) bool { return w.startedBy(h) }) {
			kept = append(kept, r)
		}
	}
	return kept, nil
}

// startedBy reports whether an event with head h matches w's triggers: an event of w's project,
// or an observation of w's organization, of a type w's patterns match.
func (w triggered) startedBy(h events.Head) bool {
	return w.orgID == h.OrgID && (w.projectID == h.ProjectID || h.Type == TriggerObservation) && events.MatchAny(w.patterns, h.Type)
}

// handle starts the runs a batch of events calls for, with the workflows triggering loaded.
func (t *Triggers) handle(ctx context.Context, evs []events.Event) error {
	for _, ev := range evs {
		for _, w := range t.workflows {
			if !w.startedBy(events.Head{Type: ev.Type, OrgID: ev.OrgID, ProjectID: ev.ProjectID}) {
				continue
			}
			if err := t.start(ctx, w, ev); err != nil {
				return err
			}
		}
	}
	return nil
}

// reload reads the ACTIVE workflows with triggers in one statement (it runs before most
// batches, so one round trip rather than a transaction's four); loadedAt is the statement's start
// on the database's clock, which is before its snapshot.
func (t *Triggers) reload(ctx context.Context) error {
	rows, _ := t.cfg.Service.pool.Query(ctx, `select s.at, w.id, w.org_id, w.project_id, w.mode, w.triggers
from (select statement_timestamp() as at) s
left join workflows w on w.status = 'ACTIVE' and cardinality(w.triggers) > 0`)
	var at time.Time
	var list []triggered
	var id, orgID, projectID, mode *string
	var patterns []string
	_, err := pgx.ForEachRow(rows, []any{&at, &id, &orgID, &projectID, &mode, &patterns}, func() error {
		if id != nil {
			list = append(list, triggered{id: *id, orgID: *orgID, projectID: *projectID, mode: *mode, patterns: patterns})
			patterns = nil // the next row scans into a slice of its own
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("load triggered workflows: %w", err)
	}
	t.loadedAt, t.workflows = at, list
	return nil
}

// triggerInput is the input of a run started by an event: the spec's shape for observations,
// the event itself otherwise.
func triggerInput(ev events.Event) (json.RawMessage, error) {
	var p map[string]any
	_ = json.Unmarshal(ev.Payload, &p)
	str := func(k string) string { s, _ := p[k].(string); return s }
	if ev.Type == TriggerObservation {
		return json.Marshal(map[string]string{"observation_id": str("observationId"), "patient_id": str("patientId"),
			"device_type": str("deviceType")})
	}
	in := map[string]any{"event_id": ev.ID, "event_type": ev.Type, "payload": ev.Payload}
	if id := str("patientId"); id != "" {
		in["patient_id"] = id
	}
	return json.Marshal(in)
}

// start starts one run of w for ev unless ev already started one, or ev was caused by a run of w
// or by a chain of triggered runs MaxTriggerDepth deep. The run takes w's mode (its creator's):
// a test workflow's run reaches only synthetic patients, whatever patient the event names, and
// fails at its first patient step otherwise. An event is live as far as runs go: a test
// credential publishes none that names a patient other than a synthetic one (feed.Publish).
func (t *Triggers) start(ctx context.Context, w triggered, ev events.Event) error {
	depth, cause, err := t.causeOf(ctx, ev)
	if err != nil {
		return err
	}
	if cause == w.id {
		return nil // a workflow is not triggered by its own runs
	}
	if depth > MaxTriggerDepth {
		t.log.Warn("trigger chain too deep; run not started", "workflow_id", w.id, "event_id", ev.ID, "depth", depth)
		return nil
	}
	input, err := triggerInput(ev)
	if err != nil { // the same event fails again: set it aside
		return fmt.Errorf("input of a run for event %s: %w: %w", ev.ID, storage.ErrUnstorable, err)
	}
	var run *Run
	err = pgx.BeginFunc(ctx, t.cfg.Service.pool, func(tx pgx.Tx) error {
		// Re-check under a lock: the workflow may have been paused since the reload.
		var status string
		err := tx.QueryRow(ctx, `select status from workflows where id = $1 for share`, w.id).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && status != StatusActive) {
			return nil
		}
		if err != nil {
			return err
		}
		run, _, err = t.cfg.Service.insertRun(ctx, tx, newRun{orgID: w.orgID, projectID: w.projectID, workflowID: w.id,
			trigger: TriggerEvent, mode: runMode(w.mode, access.Live), eventID: ev.ID, depth: depth, input: input})
		return err
	})
	if err != nil {
		return fmt.Errorf("start run of %s for event %s: %w", w.id, ev.ID, postgres.Refused(err))
	}
	if run != nil {
		t.started.Inc()
		t.log.Debug("triggered run started", "workflow_id", w.id, "run_id", run.ID, "event_id", ev.ID, "event_type", ev.Type)
	}
	return nil
}

// causeOf finds the run whose work emitted ev, if any: ev names it (workflow.* events), or ev
// belongs to an agent session or a report a run made. It returns the depth a run started by ev
// would have and the causing run's workflow.
func (t *Triggers) causeOf(ctx context.Context, ev events.Event) (depth int, workflowID string, err error) {
	if ev.Source != events.SourceWorkflow && ev.Source != events.SourceAgent {
		return 0, "", nil
	}
	var p map[string]any
	_ = json.Unmarshal(ev.Payload, &p)
	str := func(k string) string { s, _ := p[k].(string); return s }
	runID := str("run_id")
	if runID == "" {
		runID = str("runId")
	}
	sessionID, reportID := str("sessionId"), str("reportId")
	if runID == "" && sessionID == "" && reportID == "" {
		return 0, "", nil
	}
	var d int
	var wf string
	err = t.cfg.Service.pool.QueryRow(ctx, `select r.trigger_depth, r.workflow_id from workflow_runs r where r.id = coalesce(
	nullif($1, ''),
	(select run_id from agent_sessions where id = nullif($2, '')),
	(select coalesce(rp.run_id, s.run_id) from reports rp left join agent_sessions s on s.id = rp.session_id where rp.id = nullif($3, ''))
)`, runID, sessionID, reportID).Scan(&d, &wf)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("cause of event %s: %w", ev.ID, err)
	}
	return d + 1, wf, nil
}
