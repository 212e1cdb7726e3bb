// Package feed is a project's event feed as clients see it: reading the platform event log of a
// project (newest first) and publishing an event into it (publishEvent). Reads go through the
// storage.EventLog contract, so they serve from Postgres or ClickHouse alike; published events go
// to carehub.events.v1 like every other event, and so reach the log, webhooks and subscriptions
// the same way: straight to the topic when the node gives a producer (Config.Producer,
// Config.Direct), since they are the only state the call writes, and through the transactional
// outbox otherwise, with an Idempotency-Key, or while the broker does not answer.
//
// Every event a client reads here, by query or by stream, is served through kernel/phi:
// patient data only to callers that may see it, redacted for the others.
package feed

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/access"
	"carehub/kernel/config"
	"carehub/kernel/events"
	"carehub/kernel/fault"
	"carehub/kernel/jsonwire"
	"carehub/kernel/phi"
	"carehub/processors/internal/scoped"
	"carehub/storage"
	"carehub/storage/idempotency"
	"carehub/storage/kafka"
	"carehub/storage/kafka/publish"
	"carehub/storage/outbox"
	"carehub/storage/postgres"
)

// MaxPayloadBytes bounds a published event's payload (256 KiB).
const MaxPayloadBytes = 256 << 10

// Service reads and publishes project events. It is safe for concurrent use.
type Service struct {
	pool        *pgxpool.Pool
	guard       *phi.Guard
	log         storage.EventLog
	eventsTopic string
	// outbox commits concurrent publishes together: at thousands of calls a second a
	// transaction (and its commit) per call was the ceiling of publishEvent.
	outbox   *outbox.Group
	direct   *publish.Transactional // nil: batches go through the outbox too
	producer *publish.Acked         // nil: single events go through the outbox too
	refusing func() error           // Config.Refusing
	// directPaused is when (Unix ns) single events may try the producer again after it failed.
	directPaused atomic.Int64
	// projects answers which organization a project is in; a query per publish was a fifth of
	// publishEvent's CPU in carehub, and Postgres's besides.
	projects scoped.ProjectOrgs
}

// Config configures a Service. Zero fields take their defaults.
type Config struct {
	// EventsTopic is the topic published events go to. Default kafka.DefaultTopics().Events.
	EventsTopic string
	// Direct, when set, takes a batch (PublishBatch) straight to EventsTopic in one Kafka
	// transaction of its pool instead of through the outbox. A batch's events are the only state
	// it writes, so the outbox's guarantee (the message exists exactly when the change commits)
	// holds with the transaction alone, and the events skip the outbox's insert, relay and
	// cleanup in Postgres: the hop that kept a batch's publish → log p99 over 250 ms. A batch
	// within an Idempotency-Key request still goes through the outbox, whose transaction also
	// records the step. Nil: every publish goes through the outbox.
	Direct *publish.Transactional
	// Producer, when set, takes a single event (Publish, or a batch of one) straight to
	// EventsTopic as one record of this idempotent producer (acks=all), without a transaction:
	// one record is all or nothing by itself, so the guarantee is the same as Direct's, and a
	// call costs a produce instead of an outbox row (insert, the relay's claim, produce and
	// cleanup) or a transaction's four round trips. When the broker does not acknowledge within
	// directWait, the event goes through the outbox after all (publishOne). An event within an
	// Idempotency-Key request still goes through the outbox. Nil: single events go through the
	// outbox.
	Producer *publish.Acked
	// Refusing, when set, says why the broker refuses writes when the node knows (the embedded
	// broker's full disk); a 503 of events Kafka did not take then says that.
	Refusing func() error
}

func (c *Config) defaults() { config.Default(&c.EventsTopic, kafka.DefaultTopics().Events) }

// New returns the feed over pool (projects, outbox) and log (reads).
func New(pool *pgxpool.Pool, log storage.EventLog, cfg Config) *Service {
	cfg.defaults()
	return &Service{pool: pool, guard: phi.NewGuard(postgres.SyntheticPatients{Pool: pool}), log: log, eventsTopic: cfg.EventsTopic,
		outbox: outbox.NewGroup(pool, outbox.GroupConfig{}), direct: cfg.Direct, producer: cfg.Producer, refusing: cfg.Refusing}
}

// Query selects events of one project.
type Query struct {
	ProjectID string
	Type      string    // exact type, optional
	Types     []string  // exact types or prefix patterns ("agent.*"), any of them; optional
	Since     time.Time // zero for any time
	To        time.Time // exclusive; zero for no end
	// Resource filters (payload ids). A patient filter needs read:patients: which events
	// concern a patient is patient data.
	PatientID, AgentID, WorkflowID, DeploymentID string
	Ascending                                    bool              // oldest first
	Total                                        storage.TotalMode // exact (default), estimate or none
	Limit                                        int               // 1..1000
	Cursor                                       string            // from an earlier page
}

// Page is a page of events as the caller may see them.
type Page struct {
	Events     []phi.Event
	Total      int64
	NextCursor string // "" on the last page
}

// Events returns a page of a project's events, newest first (oldest first with Ascending), with
// the total number of matches as q.Total asks. Events carrying patient data the caller may not
// see are redacted (phi.Guard). A project the caller cannot see is NotFound; a cursor the log
// did not produce is Invalid.
func (s *Service) Events(ctx context.Context, q Query) (Page, error) {
	eq, none, err := s.eventQuery(ctx, q)
	if err != nil || none {
		return Page{Events: []phi.Event{}}, err
	}
	page, err := s.log.QueryEvents(ctx, eq)
	if errors.Is(err, storage.ErrBadCursor) {
		return Page{}, fault.Invalid("invalid cursor: pass the meta.cursor of an earlier response unchanged")
	}
	if err != nil {
		return Page{}, fmt.Errorf("events of %s: %w", q.ProjectID, err)
	}
	evs, err := s.guard.Events(ctx, page.Events)
	if err != nil {
		return Page{}, fmt.Errorf("events of %s: %w", q.ProjectID, err)
	}
	return Page{Events: evs, Total: page.Total, NextCursor: page.NextCursor}, nil
}

// eventQuery checks q for the caller (project visible, range ordered, patterns valid, a patient
// filter allowed) and returns the store query. none is true when the answer is empty whatever
// the log holds: a test credential filtered by a patient that is not a synthetic patient of the
// project's organization, who gets what an unknown patient gets, so that the filter does not
// tell a real patient's events exist.
func (s *Service) eventQuery(ctx context.Context, q Query) (eq storage.EventQuery, none bool, err error) {
	p, err := access.Caller(ctx)
	if err != nil {
		return eq, false, err
	}
	if err := checkRange(q.Since, q.To, "since"); err != nil {
		return eq, false, err
	}
	if err := checkPatterns(q.Types); err != nil {
		return eq, false, err
	}
	if q.PatientID != "" {
		if _, err := access.Require(ctx, access.ReadPatients); err != nil {
			return eq, false, err
		}
		access.Touch(ctx, access.KindPatient, q.PatientID)
	}
	orgID, err := s.projects.Lookup(ctx, s.pool, p, q.ProjectID)
	if err != nil {
		return eq, false, err
	}
	if q.PatientID != "" && !p.SeesRealPatients() {
		allowed, err := s.guard.Allow(ctx, phi.Reader{Patients: true, Observations: true},
			[]phi.Subject{{OrgID: orgID, Patients: []string{phi.PatientID(q.PatientID)}, Need: phi.NeedPatients}})
		if err != nil {
			return eq, false, fmt.Errorf("events of %s: %w", q.ProjectID, err)
		}
		none = !allowed[0]
	}
	return storage.EventQuery{OrgID: p.OrgFilter(), ProjectID: q.ProjectID, Type: q.Type, Types: q.Types,
		Since: q.Since, To: q.To, PatientID: q.PatientID, AgentID: q.AgentID, WorkflowID: q.WorkflowID,
		DeploymentID: q.DeploymentID, Ascending: q.Ascending, Total: q.Total, Limit: q.Limit, Cursor: q.Cursor}, none, nil
}

func checkRange(from, to time.Time, fromName string) error {
	if !from.IsZero() && !to.IsZero() && to.Before(from) {
		return fault.Validation("to must not be before "+fromName, map[string]string{"to": "must not be before " + fromName})
	}
	return nil
}

// checkPatterns accepts the type patterns of DECISIONS §4: an exact type, "prefix.*" or "*".
func checkPatterns(patterns []string) error {
	for _, p := range patterns {
		if p == "*" || events.ValidType(p) {
			continue
		}
		if prefix, ok := strings.CutSuffix(p, ".*"); ok && (events.ValidType(prefix) || events.ValidType(prefix+".x")) {
			continue
		}
		return fault.Invalid("types: %q is not an event type, \"prefix.*\" or \"*\"", p)
	}
	return nil
}

// Serve returns one streamed event as the caller in ctx may see it (an eventStream push). When
// the caller's access to its patients cannot be decided (Postgres unreachable), the event is
// served redacted rather than withheld or leaked.
func (s *Service) Serve(ctx context.Context, ev events.Event) phi.Event {
	return s.serve(ctx, []events.Event{ev})[0]
}

// serve is Serve of several events.
func (s *Service) serve(ctx context.Context, evs []events.Event) []phi.Event {
	served, err := s.guard.Events(ctx, evs)
	if err != nil {
		served = make([]phi.Event, len(evs))
		for i, ev := range evs {
			served[i] = phi.RedactEvent(ev)
		}
	}
	return served
}

// Publish creates an event of type typ with payload (a JSON object of at most 256 KiB) in one of
// the caller's projects, source integration, and publishes it (publishOne). It returns the event as
// the caller may see it: a payload that names a patient is patient data like any other
// (phi.FreeForm). Requires exec:workflows.
func (s *Service) Publish(ctx context.Context, typ string, payload json.RawMessage, projectID string) (*phi.Event, error) {
	evs, err := s.publish(ctx, []Draft{{ProjectID: projectID, Type: typ, Payload: payload}}, func(int) string { return "" }, false)
	if err != nil {
		return nil, err
	}
	return &evs[0], nil
}

// MaxBatch is the most events PublishBatch takes in one call.
const MaxBatch = 1000

// Draft is an event a client publishes: its project, type and payload.
type Draft struct {
	ProjectID string
	Type      string
	Payload   json.RawMessage
}

// PublishBatch publishes 1 to MaxBatch events as Publish does each, all or nothing: every draft
// is checked first (a validation failure names each field as "[i].field"; a project the caller
// cannot see is NotFound), then all the events are written in one transaction: to the events
// topic (Config.Direct) or to the outbox. It returns them in the order of drafts, as the caller
// may see them. A transaction the broker has not acknowledged within batchWait (10 s) is aborted
// and Unavailable. Requires exec:workflows.
func (s *Service) PublishBatch(ctx context.Context, drafts []Draft) ([]phi.Event, error) {
	if len(drafts) == 0 || len(drafts) > MaxBatch {
		return nil, fault.Invalid("a batch holds 1 to %d events, not %d", MaxBatch, len(drafts))
	}
	return s.publish(ctx, drafts, func(i int) string { return fmt.Sprintf("[%d].", i) }, true)
}

// publish checks, writes and serves drafts; field(i) prefixes the names of draft i's invalid
// fields. batch publishes straight to Kafka when the service may (Config.Direct).
func (s *Service) publish(ctx context.Context, drafts []Draft, field func(int) string, batch bool) ([]phi.Event, error) {
	p, err := access.Require(ctx, access.ExecWorkflows)
	if err != nil {
		return nil, err
	}
	bad := map[string]string{}
	evs := make([]events.Event, len(drafts))
	for i, d := range drafts {
		evs[i] = draftEvent(d, field(i), bad)
	}
	if len(bad) > 0 {
		return nil, fault.Validation("invalid event", bad)
	}
	for i, d := range drafts {
		if evs[i].OrgID, err = s.projects.Lookup(ctx, s.pool, p, d.ProjectID); err != nil {
			return nil, err
		}
	}
	if !p.SeesRealPatients() {
		if err := s.syntheticOnly(ctx, evs); err != nil {
			return nil, err
		}
	}
	msgs, err := outbox.EventMessages(s.eventsTopic, evs...)
	if err != nil {
		return nil, fmt.Errorf("publish events: %w", err)
	}
	switch {
	case idempotency.From(ctx) != nil:
		// A step of an Idempotency-Key request: its transaction also records the step.
		err = idempotency.Tx(ctx, s.pool, &evs, func(tx pgx.Tx) error { return outbox.Append(ctx, tx, msgs...) })
	case len(msgs) == 1 && s.producer != nil:
		err = s.publishOne(ctx, msgs[0])
	case batch && s.direct != nil:
		err = s.produce(ctx, msgs)
	default:
		err = s.outbox.Append(ctx, msgs...)
	}
	if err != nil {
		return nil, fmt.Errorf("publish events: %w", err)
	}
	return s.serve(ctx, evs), nil
}

// draftEvent is the event d makes, but for its organization (its project's, looked up once
// every draft is valid), or the zero Event with each invalid field of d in bad, its name
// prefixed. The payload is read once for all its checks: events.New's (jsonwire.Storable, which
// also says whether it is JSON at all) and the repeated member's. What the event log cannot
// store must not be acknowledged: it would reach the log's writer, which cannot commit past it.
func draftEvent(d Draft, prefix string, bad map[string]string) events.Event {
	if d.ProjectID == "" {
		bad[prefix+"projectId"] = "is required"
	}
	if t := bytes.TrimLeft(d.Payload, " \t\r\n"); len(d.Payload) > MaxPayloadBytes {
		bad[prefix+"payload"] = fmt.Sprintf("is %d bytes; at most %d (256 KiB) are allowed", len(d.Payload), MaxPayloadBytes)
	} else if len(t) == 0 || t[0] != '{' {
		bad[prefix+"payload"] = "must be a JSON object"
	}
	var (
		ev  events.Event
		err error
	)
	switch {
	case !events.ValidType(d.Type):
		bad[prefix+"type"] = "must be two or more dot-separated segments of a-z, 0-9 and _, such as device.observation_received"
		if bad[prefix+"payload"] == "" {
			err = jsonwire.Storable(d.Payload)
		}
	case bad[prefix+"payload"] == "":
		// The only faults New can find in it now are the payload's: the rest is set here.
		ev, err = events.New(d.Type, "", d.ProjectID, events.SourceIntegration, events.SeverityInfo, d.Payload)
	}
	if se, ok := errors.AsType[*jsonwire.StorableError](err); ok {
		bad[strings.TrimSuffix(prefix+"payload."+se.Path, ".")] = se.Reason
	} else if err != nil {
		bad[prefix+"payload"] = "must be a JSON object"
	} else if bad[prefix+"payload"] == "" {
		if name := repeatedMember(d.Payload); name != "" {
			bad[prefix+"payload"] = fmt.Sprintf("names the member %q twice", name)
		}
	}
	return ev
}

// syntheticOnly refuses the events of a test credential that name a patient other than a
// synthetic patient of their organization, as every other path of a test credential does: such an
// event would reach live readers, webhooks and workflow triggers as if a live credential had
// written it about a real patient. A real patient is NotFound, as an unknown one is, so the
// refusal tells nothing; a patient named without an id cannot be shown to be synthetic.
func (s *Service) syntheticOnly(ctx context.Context, evs []events.Event) error {
	var each []phi.Subject // one per patient named, so that the refusal names the patient
	for _, ev := range evs {
		sub, ok := phi.ClassifyEvent(ev.Type, ev.Payload)
		if !ok {
			continue
		}
		if sub.Unidentified {
			return fault.Validation("invalid event", map[string]string{
				"payload": "a test credential names patients by the id of a synthetic patient (pat_…) only"})
		}
		for _, id := range sub.Patients {
			each = append(each, phi.Subject{OrgID: ev.OrgID, Patients: []string{id}, Need: phi.NeedPatients})
		}
	}
	if len(each) == 0 {
		return nil
	}
	// What a test credential holding the patient scopes may see: synthetic patients only.
	allowed, err := s.guard.Allow(ctx, phi.Reader{Patients: true, Observations: true}, each)
	if err != nil {
		return fmt.Errorf("publish events: %w", err)
	}
	for i, ok := range allowed {
		if !ok {
			return fault.NotFound("patient", each[i].Patients[0])
		}
	}
	return nil
}

// repeatedMember returns a member name the JSON object payload has twice, or "". Readers of a
// repeated name disagree on which value counts (the PHI guard and jsonb take the last,
// ClickHouse's JSONExtract the first), so a payload naming, say, two patientIds could be indexed
// under one patient and judged by the other: it is refused.
func repeatedMember(payload json.RawMessage) string {
	seen := make(map[string]struct{}, 8)
	var repeated string
	_ = jsonwire.Members(payload, func(key, _ []byte) error {
		if _, ok := seen[string(key)]; ok {
			repeated = string(key)
			return errRepeated // stops the walk
		}
		seen[string(key)] = struct{}{}
		return nil
	})
	return repeated
}

var errRepeated = errors.New("repeated member")

// directWait bounds how long a single event waits for the broker before it goes to the outbox
// instead, and directPause how long single events then go to the outbox without trying the
// broker first.
const (
	directWait  = 2 * time.Second
	directPause = 10 * time.Second
)

// batchWait bounds how long a batch waits for a producer of the pool and for the broker to
// acknowledge its transaction. The client retries a record without end (kafka.NewClient), so a
// batch would otherwise wait for as long as the node cannot reach the brokers; past it the
// transaction is aborted and the call answered 503.
const batchWait = 10 * time.Second

// publishOne publishes one event's record: straight to Kafka while the broker answers, through
// the outbox when it does not, so a publish succeeds through a broker outage as every other
// mutation does (its event waits in Postgres). A record the broker receives after its wait ended
// is published twice with one event id, and every consumer keeps one (the log, webhooks and
// triggers are idempotent by event id).
func (s *Service) publishOne(ctx context.Context, m outbox.Message) error {
	if time.Now().UnixNano() >= s.directPaused.Load() {
		// Within, not All: a record waiting for a broker that cannot be reached is failed when
		// the producer next looks at it, not when its context ends.
		err := s.producer.Within(ctx, directWait, m.Record())
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fault.Wrap(fault.KindUnavailable, err, s.refusal("the event could not be published; retry later (with an Idempotency-Key, a retry publishes it once whatever happened)"))
		}
		s.directPaused.Store(time.Now().Add(directPause).UnixNano())
	}
	return s.outbox.Append(ctx, m)
}

// produce writes msgs to Kafka in one transaction of the direct pool: all of them or none.
func (s *Service) produce(ctx context.Context, msgs []outbox.Message) error {
	ctx, cancel := context.WithTimeout(ctx, batchWait)
	defer cancel()
	txn, err := s.direct.Acquire(ctx)
	if err != nil {
		return fault.Wrap(fault.KindUnavailable, err, "no event producer is free; nothing was published, retry later")
	}
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = m.Record()
	}
	if err := txn.Add(ctx, recs...); err != nil {
		txn.Abort()
		return fault.Wrap(fault.KindUnavailable, err, s.refusal("the events could not be published; nothing was, retry later"))
	}
	if err := txn.Commit(ctx); err != nil {
		// Almost always nothing was published; a commit whose answer was lost may have been.
		return fault.Wrap(fault.KindUnavailable, err, s.refusal("the events could not be published; retry later (with an Idempotency-Key, a retry publishes them once whatever happened)"))
	}
	return nil
}

// refusal is message, or why the broker refuses writes when the node knows.
func (s *Service) refusal(message string) string {
	if s.refusing != nil {
		if why := s.refusing(); why != nil {
			return "the events could not be published: " + why.Error() + "; retry later"
		}
	}
	return message
}
