package kafka

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Topics names carehub's topics. The zero value names none; start from
// DefaultTopics and override what a deployment renames.
type Topics struct {
	Events       string // platform events, keyed by project id
	Observations string // device observations, keyed by patient id
	WorkflowRuns string // workflow run commands and updates, keyed by run id
	Audit        string // audit records, keyed by org id
	// EventsDLQ holds the records of Events a consumer could not handle (the event log,
	// the webhook dispatcher, the workflow triggers: consume.DeadLetter; the record's
	// carehub-dlq-consumer header names which), until an operator replays them (carehub
	// deadletter). AuditDLQ and ObservationsDLQ do the same for Audit (the audit writer) and
	// Observations (the observation writer).
	EventsDLQ       string
	AuditDLQ        string
	ObservationsDLQ string
}

// DefaultTopics returns the topic names carehub uses unless configured
// otherwise.
func DefaultTopics() Topics {
	return Topics{
		Events:          "carehub.events.v1",
		Observations:    "carehub.observations.v1",
		WorkflowRuns:    "carehub.workflow-runs.v1",
		Audit:           "carehub.audit.v1",
		EventsDLQ:       "carehub.events.dlq.v1",
		AuditDLQ:        "carehub.audit.dlq.v1",
		ObservationsDLQ: "carehub.observations.dlq.v1",
	}
}

// Namespace prefixes the names a deployment owns on a Kafka cluster (topics, consumer groups,
// transactional ids), so that several deployments, or parallel test packages, share one cluster
// without reading each other's records. The empty namespace prefixes nothing: the names are
// DefaultTopics and the components' default groups, as before namespaces existed.
type Namespace string

// namespaceRE: Kafka's legal topic characters, a bound that leaves room for the longest name
// (topic names are at most 249 bytes), and no leading dot or dash.
var namespaceRE = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,99}$`)

// Validate reports whether n can prefix topic and group names.
func (n Namespace) Validate() error {
	if n == "" || namespaceRE.MatchString(string(n)) {
		return nil
	}
	return fmt.Errorf("namespace %q: 1 to 100 of a-z A-Z 0-9 . _ -, not starting with . or -", string(n))
}

// Name returns name in the namespace: "<namespace>.<name>", or name itself in the empty one.
func (n Namespace) Name(name string) string {
	if n == "" || name == "" {
		return name
	}
	return string(n) + "." + name
}

// Topics returns DefaultTopics in the namespace.
func (n Namespace) Topics() Topics {
	t := DefaultTopics()
	return Topics{Events: n.Name(t.Events), Observations: n.Name(t.Observations),
		WorkflowRuns: n.Name(t.WorkflowRuns), Audit: n.Name(t.Audit), EventsDLQ: n.Name(t.EventsDLQ),
		AuditDLQ: n.Name(t.AuditDLQ), ObservationsDLQ: n.Name(t.ObservationsDLQ)}
}

// All returns the non-empty topic names in a fixed order: events,
// observations, workflow runs, audit, then the dead letters of events, audit and observations.
func (t Topics) All() []string {
	all := make([]string, 0, 7)
	for _, name := range []string{t.Events, t.Observations, t.WorkflowRuns, t.Audit, t.EventsDLQ, t.AuditDLQ, t.ObservationsDLQ} {
		if name != "" {
			all = append(all, name)
		}
	}
	return all
}

// Layout is how the topics carehub creates are laid out on the cluster. A zero field leaves
// the choice to the broker's defaults (num.partitions, default.replication.factor,
// min.insync.replicas), which is what a single node and a cluster configured for carehub want.
type Layout struct {
	Partitions  int32
	Replication int16
	// MinInsync is the topics' min.insync.replicas: with acks=all (NewClient's default) a
	// record is acknowledged only once this many replicas hold it, so a cluster of three with
	// 2 loses no acknowledged record when one broker dies.
	MinInsync int
}

// EnsureTopics creates the topics that do not exist yet as l lays them out, then waits until
// metadata shows every topic with a leader on each partition, so a producer started next does
// not race the creation. Topics that already exist are left as they are, whatever their layout.
// It is safe to call concurrently and repeatedly.
//
// cl is only borrowed: EnsureTopics does not close it.
func EnsureTopics(ctx context.Context, cl *kgo.Client, l Layout, topics ...string) error {
	if len(topics) == 0 {
		return nil
	}
	partitions, replication := int32(-1), int16(-1)
	if l.Partitions > 0 {
		partitions = l.Partitions
	}
	if l.Replication > 0 {
		replication = l.Replication
	}
	var configs map[string]*string
	if l.MinInsync > 0 {
		configs = map[string]*string{"min.insync.replicas": kadm.StringPtr(strconv.Itoa(l.MinInsync))}
	}
	adm := kadm.NewClient(cl) // closing adm would close cl

	created, err := adm.CreateTopics(ctx, partitions, replication, configs, topics...)
	if err != nil {
		return fmt.Errorf("create topics %v: %w", topics, err)
	}
	var errs []error
	for _, r := range created.Sorted() {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			errs = append(errs, fmt.Errorf("create topic %s: %w", r.Topic, r.Err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}

	backoff := 20 * time.Millisecond
	for {
		missing, err := topicsNotReady(ctx, adm, topics)
		if err == nil && len(missing) == 0 {
			cl.ForceMetadataRefresh()
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = fmt.Errorf("not in metadata: %v", missing)
			}
			return fmt.Errorf("wait for topics %v: %w (%w)", topics, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// topicsNotReady returns the topics that metadata does not yet show with a
// leader for every partition, or whose leaders do not yet serve them.
func topicsNotReady(ctx context.Context, adm *kadm.Client, topics []string) ([]string, error) {
	md, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, name := range topics {
		td, ok := md[name]
		if !ok || td.Err != nil || len(td.Partitions) == 0 {
			missing = append(missing, name)
			continue
		}
		for _, p := range td.Partitions {
			if p.Err != nil || p.Leader < 0 {
				missing = append(missing, name)
				break
			}
		}
	}
	if len(missing) > 0 {
		return missing, nil
	}
	// Kafka announces a new partition's leader in metadata slightly before
	// that broker serves it; a produce in between fails with
	// NOT_LEADER_OR_FOLLOWER and the client backs off for its metadata
	// min age. Asking each leader for its end offset closes the gap.
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, err
	}
	for _, name := range topics {
		ps := ends[name]
		ok := len(ps) == len(md[name].Partitions)
		for _, o := range ps {
			ok = ok && o.Err == nil
		}
		if !ok {
			missing = append(missing, name)
		}
	}
	return missing, nil
}
