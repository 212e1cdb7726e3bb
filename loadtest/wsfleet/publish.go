package wsfleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/events"
	"carehub/kernel/ids"
	loadreport "carehub/loadtest/report"
	"carehub/storage/kafka"
)

const publishMutation = `mutation($type: String!, $payload: JSON!, $projectId: ID!) {
  publishEvent(type: $type, payload: $payload, projectId: $projectId) { id }
}`

// Plan says which events go where: event j is of project j mod P and type group (j div P) mod G,
// and reaches the subscribers that listen to that pair.
type Plan struct {
	Projects  []string
	Groups    int
	Listeners [][]int64 // [project][group] → subscriptions
	OrgID     string
}

// NewPlan returns a plan of projects and groups with no listener yet.
func NewPlan(orgID string, projects []string, groups int) *Plan {
	p := &Plan{Projects: projects, Groups: groups, OrgID: orgID, Listeners: make([][]int64, len(projects))}
	for i := range p.Listeners {
		p.Listeners[i] = make([]int64, groups)
	}
	return p
}

// Assign is where connection i listens: project i mod P, type group (i div P) mod G, counted as
// a listener of that pair. It is not safe for concurrent use: assign, then connect.
func (p *Plan) Assign(i int) (project string, types []string) {
	pi := i % len(p.Projects)
	g := (i / len(p.Projects)) % p.Groups
	p.Listeners[pi][g]++
	return p.Projects[pi], []string{GroupType(g)}
}

// Event is where event j goes: its project's index and its type.
func (p *Plan) Event(j int) (project int, typ string) {
	project = j % len(p.Projects)
	return project, GroupType((j / len(p.Projects)) % p.Groups)
}

// GroupType is the event type of type group g.
func GroupType(g int) string { return fmt.Sprintf("load.g%d", g) }

// IdleType is the type idle subscriptions listen to; nothing publishes it.
const IdleType = "load.idle"

// Sender publishes one event.
type Sender interface {
	// Send publishes event j of project and type with payload, returning once it is
	// acknowledged.
	Send(ctx context.Context, j int, project, typ string, payload map[string]any) error
	Close()
}

// Publisher sends events at a fixed rate and counts what the subscribers should receive.
type Publisher struct {
	Plan    *Plan
	Sender  Sender
	Pad     string // added to every payload as "pad"
	Workers int    // concurrent publish calls

	Call     Hist // the publish call (graphql: the mutation's round trip; kafka: the broker's ack)
	Lag      Hist // call start behind schedule: the generator or the server could not keep up
	OK       atomic.Int64
	Failed   atomic.Int64
	Limited  atomic.Int64 // answered RATE_LIMITED
	Expected atomic.Int64 // Σ over acknowledged events of their listeners
	firstErr atomic.Value
	Rec      *loadreport.Recorder // nil: no progress line
}

// FirstError is the first publish error, "" when none.
func (p *Publisher) FirstError() string {
	e, _ := p.firstErr.Load().(string)
	return e
}

// Job is one event to publish, due at a time of the schedule.
type Job struct {
	J   int
	Due time.Time
}

// Run publishes rate events per second for d (or until ctx ends) with p.Workers concurrent
// calls on an absolute schedule, and returns how long it took.
func (p *Publisher) Run(ctx context.Context, rate float64, d time.Duration) time.Duration {
	jobs := make(chan Job, p.Workers)
	var wg sync.WaitGroup
	for range p.Workers {
		wg.Go(func() {
			for jb := range jobs {
				p.One(ctx, jb)
			}
		})
	}
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	end := start.Add(d)
schedule:
	for j := 0; ; j++ {
		due := start.Add(time.Duration(j) * interval)
		if !due.Before(end) {
			break
		}
		if wait := time.Until(due); wait > 0 {
			select {
			case <-ctx.Done():
				break schedule
			case <-time.After(wait):
			}
		}
		select {
		case jobs <- Job{j, due}:
		case <-ctx.Done():
			break schedule
		}
	}
	close(jobs)
	wg.Wait()
	return time.Since(start)
}

// One publishes one job now: its payload is {seq, sentAt (now, Unix ns)} and the pad.
func (p *Publisher) One(ctx context.Context, jb Job) {
	project, typ := p.Plan.Event(jb.J)
	start := time.Now()
	p.Lag.Record(start.Sub(jb.Due))
	payload := map[string]any{"seq": jb.J, "sentAt": start.UnixNano()}
	if p.Pad != "" {
		payload["pad"] = p.Pad
	}
	err := p.Sender.Send(ctx, jb.J, p.Plan.Projects[project], typ, payload)
	p.Call.Record(time.Since(start))
	if err != nil {
		var ge *GQLError
		if errors.As(err, &ge) && ge.Code == "RATE_LIMITED" {
			p.Limited.Add(1)
			if p.Rec != nil {
				p.Rec.Refuse(1)
			}
		} else {
			p.Failed.Add(1)
		}
		p.firstErr.CompareAndSwap(nil, err.Error())
		return
	}
	p.OK.Add(1)
	p.Expected.Add(p.Plan.Listeners[project][(jb.J/len(p.Plan.Projects))%p.Plan.Groups])
}

// GraphQLSender publishes through the publishEvent mutation: the real path (outbox row, relay,
// events topic, fan-out). Keys take turns, which spreads the per-credential rate limit.
type GraphQLSender struct {
	Node *Node
	Keys []string // with exec:workflows
}

// Send calls publishEvent with the j-th key in turn; a GraphQL error is a *GQLError.
func (s *GraphQLSender) Send(ctx context.Context, j int, project, typ string, payload map[string]any) error {
	return s.Node.GQL(ctx, s.Keys[j%len(s.Keys)], publishMutation, map[string]any{"type": typ, "payload": payload, "projectId": project}, nil)
}

// Close does nothing: the node's connections belong to its Node.
func (s *GraphQLSender) Close() {}

// KafkaSender produces event envelopes to the events topic directly, as the outbox relay would:
// it skips Postgres and measures the fan-out and WebSocket path alone. Each send waits for the
// broker's acknowledgement.
type KafkaSender struct {
	cl    *kgo.Client
	topic string
	orgID string
}

// NewKafkaSender returns a sender to topic on brokers, authenticated with the credentials of
// the embedded broker whose data dir is kafkaDataDir ("": none), for events of orgID.
func NewKafkaSender(brokers []string, kafkaDataDir, topic, orgID string) (*KafkaSender, error) {
	var creds kafka.Credentials
	if kafkaDataDir != "" {
		var err error
		if creds, err = kafka.EmbeddedCredentials(kafkaDataDir); err != nil {
			return nil, err
		}
	}
	opts := append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil))}, creds.Opts()...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	return &KafkaSender{cl: cl, topic: topic, orgID: orgID}, nil
}

// Send produces the event's envelope keyed by project and waits for the broker's
// acknowledgement.
func (s *KafkaSender) Send(ctx context.Context, j int, project, typ string, payload map[string]any) error {
	raw, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	ev := events.Event{ID: ids.New(ids.Event), Type: typ, OrgID: s.orgID, ProjectID: project, Source: "integration",
		Severity: "info", Payload: raw, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	value, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return s.cl.ProduceSync(ctx, &kgo.Record{Key: []byte(project), Value: value}).FirstErr()
}

// Close closes the producer.
func (s *KafkaSender) Close() { s.cl.Close() }

// WarmUp publishes event j = 0, 1, … of plan through snd every 100 ms until f receives one, for
// at most limit: a server that reads the topic from its end once it has its partitions (carehub's
// hub, a consumer group joining) misses what was published before. It then waits a second for
// the stragglers, empties f's counts and histograms, and leaves f measuring.
func WarmUp(ctx context.Context, f *Fleet, plan *Plan, snd Sender, limit time.Duration) error {
	warm := &Publisher{Plan: plan, Sender: snd, Workers: 1}
	f.Measuring.Store(true)
	end := time.Now().Add(limit)
	for j := 0; f.Received.Load() == 0; j++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(end) {
			if e := warm.FirstError(); e != "" {
				return fmt.Errorf("no event reached a subscriber within %s of publishing (first publish error: %s)", limit, e)
			}
			return fmt.Errorf("no event reached a subscriber within %s of publishing", limit)
		}
		warm.One(ctx, Job{j, time.Now()})
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	f.Reset()
	return nil
}
