package consume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka"
)

// StartRecent is the reset option of a consumer whose new group starts with the records of the
// lookback before now rather than the topic's history: it seeds group (SeedRecent) through a
// short-lived client of no group built from cfg and opts, and returns
// kgo.ConsumeResetOffset(kgo.NewOffset().AfterMilli(now - lookback)) for what seeding does not
// cover. Call it before building the group's client. A seed that fails is logged to cfg.Logger
// and leaves the reset alone to place the start.
func StartRecent(cfg kafka.ClientConfig, group, topic string, lookback time.Duration, opts ...kgo.Opt) kgo.Opt {
	since := time.Now().Add(-lookback)
	reset := kgo.ConsumeResetOffset(kgo.NewOffset().AfterMilli(since.UnixMilli()))
	cfg.Registerer = nil // a short-lived client: its metrics would clash with the consumer's
	err := func() error {
		cl, err := kafka.NewClient(cfg, opts...)
		if err != nil {
			return err
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), seedTimeout)
		defer cancel()
		return SeedRecent(ctx, cl, group, topic, since)
	}()
	if err != nil && cfg.Logger != nil {
		cfg.Logger.Warn("a new consumer group's start was not seeded; the reset offset places it", "group", group, "error", err)
	}
	return reset
}

// seedTimeout bounds StartRecent's round trips.
const seedTimeout = 10 * time.Second

// SeedRecent gives group, when it has committed nothing on topic, a committed start on each of
// topic's partitions at its first record produced at or after since, so the group's first member
// reads the records of the moment before it joined and nothing older. The consumers that start a
// new group with recent records only (workflow triggers, deployment scorers, FHIR subscriptions)
// call it before they build their client, and keep kgo.NewOffset().AfterMilli(since) as the reset
// for what it does not cover (a partition added later).
//
// The reset alone can lose a record: franz-go asks the broker for the offset after since and, when
// a partition has none, for its end in a second request, so a record produced between the two is
// behind the start. Here the end (the last stable offset) is listed first and the start is the
// lower of it and the offset after since: a record produced after the first list is either at or
// after the end, or the first after since. Records between the two are at most read once more.
//
// A group that has members or commits of its own is left as it is (the broker refuses a commit
// without a generation to a group with members). An error Kafka calls retriable (a coordinator not
// there yet on a new cluster) is retried with Backoff until ctx ends. cl is a client of no group;
// it is not closed.
func SeedRecent(ctx context.Context, cl *kgo.Client, group, topic string, since time.Time) error {
	adm := kadm.NewClient(cl)
	for attempt := 1; ; attempt++ {
		err := seed(ctx, adm, group, topic, since)
		if err == nil || !kerr.IsRetriable(err) || ctx.Err() != nil {
			return err
		}
		sleep(ctx, Backoff(attempt))
	}
}

func seed(ctx context.Context, adm *kadm.Client, group, topic string, since time.Time) error {
	committed, err := adm.FetchOffsets(ctx, group)
	if errors.Is(err, kerr.GroupIDNotFound) { // kfake's answer for a group never seen; Kafka's is none
		committed, err = nil, nil
	}
	if err != nil {
		return fmt.Errorf("seed %s: committed offsets: %w", group, err)
	}
	owned := false
	committed.Each(func(o kadm.OffsetResponse) { owned = owned || o.Topic == topic && o.Err == nil && o.At >= 0 })
	if owned {
		return nil
	}
	ends, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("seed %s: end offsets of %s: %w", group, topic, err)
	}
	after, err := adm.ListOffsetsAfterMilli(ctx, since.UnixMilli(), topic)
	if err == nil {
		err = after.Error()
	}
	if err != nil {
		return fmt.Errorf("seed %s: offsets of %s after %s: %w", group, topic, since.Format(time.RFC3339), err)
	}
	start := kadm.Offsets{}
	ends.Each(func(end kadm.ListedOffset) {
		at := end.Offset
		if a, ok := after.Lookup(topic, end.Partition); ok && a.Offset >= 0 && a.Offset < at {
			at = a.Offset
		}
		start.Add(kadm.Offset{Topic: topic, Partition: end.Partition, At: at, LeaderEpoch: -1})
	})
	resps, err := adm.CommitOffsets(ctx, group, start)
	if err != nil {
		return fmt.Errorf("seed %s: commit: %w", group, err)
	}
	if err := resps.Error(); err != nil && !joined(err) {
		return fmt.Errorf("seed %s: commit: %w", group, err)
	}
	return nil
}

// joined reports whether a commit without a generation was refused because the group has members:
// one of them has joined first, and the group starts where its members say.
func joined(err error) bool {
	return errors.Is(err, kerr.UnknownMemberID) || errors.Is(err, kerr.IllegalGeneration) || errors.Is(err, kerr.RebalanceInProgress)
}
