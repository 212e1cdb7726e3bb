package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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

// plan says which events go where: event j is of project j mod P and type group (j div P) mod G,
// and reaches the subscribers that listen to that pair.
type plan struct {
	projects  []string
	groups    int
	listeners [][]int64 // [project][group] → subscriptions
	orgID     string
}

func (p *plan) event(j int) (project int, typ string) {
	project = j % len(p.projects)
	return project, groupType((j / len(p.projects)) % p.groups)
}

func groupType(g int) string { return fmt.Sprintf("load.g%d", g) }

// idleType is the type idle subscriptions listen to; nothing publishes it.
const idleType = "load.idle"

// sender publishes one event.
type sender interface {
	send(ctx context.Context, j int, project, typ string, payload map[string]any) error
	close()
}

// publisher sends events at a fixed rate and counts what the subscribers should receive.
type publisher struct {
	plan    *plan
	sender  sender
	pad     string
	workers int

	call     hist // the publish call (graphql: the mutation's round trip; kafka: the broker's ack)
	lag      hist // call start behind schedule: the generator or the server could not keep up
	ok       atomic.Int64
	failed   atomic.Int64
	limited  atomic.Int64
	expected atomic.Int64
	firstErr atomic.Value
	rec      *loadreport.Recorder // nil: no progress line
}

type job struct {
	j   int
	due time.Time
}

// run publishes rate events per second for d (or until ctx ends) with the configured workers.
func (p *publisher) run(ctx context.Context, rate float64, d time.Duration) time.Duration {
	jobs := make(chan job, p.workers)
	var wg sync.WaitGroup
	for range p.workers {
		wg.Go(func() {
			for jb := range jobs {
				p.one(ctx, jb)
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
		case jobs <- job{j, due}:
		case <-ctx.Done():
			break schedule
		}
	}
	close(jobs)
	wg.Wait()
	return time.Since(start)
}

func (p *publisher) one(ctx context.Context, jb job) {
	project, typ := p.plan.event(jb.j)
	start := time.Now()
	p.lag.record(start.Sub(jb.due))
	payload := map[string]any{"seq": jb.j, "sentAt": start.UnixNano()}
	if p.pad != "" {
		payload["pad"] = p.pad
	}
	err := p.sender.send(ctx, jb.j, p.plan.projects[project], typ, payload)
	p.call.record(time.Since(start))
	if err != nil {
		var ge *gqlError
		if errors.As(err, &ge) && ge.code == "RATE_LIMITED" {
			p.limited.Add(1)
			if p.rec != nil {
				p.rec.Refuse(1)
			}
		} else {
			p.failed.Add(1)
		}
		p.firstErr.CompareAndSwap(nil, err.Error())
		return
	}
	p.ok.Add(1)
	p.expected.Add(p.plan.listeners[project][(jb.j/len(p.plan.projects))%p.plan.groups])
}

// graphqlSender publishes through the publishEvent mutation: the real path (outbox row, relay,
// events topic, fan-out). Keys take turns, which spreads the per-credential rate limit.
type graphqlSender struct {
	n    *node
	keys []string
}

func (s *graphqlSender) send(ctx context.Context, j int, project, typ string, payload map[string]any) error {
	return s.n.gql(ctx, s.keys[j%len(s.keys)], publishMutation, map[string]any{"type": typ, "payload": payload, "projectId": project}, nil)
}

func (s *graphqlSender) close() {}

// kafkaSender produces event envelopes to the events topic directly, as the outbox relay would:
// it skips Postgres and measures the fan-out and WebSocket path alone. Each send waits for the
// broker's acknowledgement.
type kafkaSender struct {
	cl    *kgo.Client
	topic string
	orgID string
}

func newKafkaSender(brokers []string, kafkaDataDir, topic, orgID string) (*kafkaSender, error) {
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
	return &kafkaSender{cl: cl, topic: topic, orgID: orgID}, nil
}

func (s *kafkaSender) send(ctx context.Context, j int, project, typ string, payload map[string]any) error {
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

func (s *kafkaSender) close() { s.cl.Close() }

func splitList(v string) []string {
	var out []string
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
