package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Ping succeeds when a broker answers a metadata request: the readiness
// check. It returns when the context ends if no broker answers.
func Ping(ctx context.Context, cl *kgo.Client) error {
	if err := cl.Ping(ctx); err != nil {
		return fmt.Errorf("kafka ping: %w", err)
	}
	return nil
}

// PartitionLag is how far a consumer group is behind on one partition.
type PartitionLag struct {
	Topic     string
	Partition int32
	// Committed is the group's committed offset (the next offset it reads),
	// or -1 when the group has committed nothing on this partition.
	Committed int64
	// Start and End are the partition's log start offset and high
	// watermark.
	Start, End int64
	// Lag is End minus Committed, or End minus Start without a commit:
	// the records the group has yet to process. Never negative.
	Lag int64
	// MemberID is the group member assigned the partition, "" when none is
	// (the group is empty or rebalancing).
	MemberID string
}

// Lag returns the group's lag on every partition of topics, sorted by topic
// and partition. Without topics it covers every topic the group has
// committed to or is assigned. A partition the group never committed to
// counts in full from the log start, so a new group on a full topic shows
// its real backlog. A topic that does not exist is an error.
//
// Members are reported for classic (client-balanced) groups, which is what
// franz-go consumers use unless they opt into KIP-848.
//
// Retriable broker errors (a group coordinator loading, moving or not yet
// created on a fresh cluster) are retried until ctx ends; an unknown topic,
// retriable to Kafka, is not.
func Lag(ctx context.Context, adm *kadm.Client, group string, topics ...string) ([]PartitionLag, error) {
	backoff := 50 * time.Millisecond
	for {
		lags, err := lag(ctx, adm, group, topics)
		if err == nil || !kerr.IsRetriable(err) || errors.Is(err, kerr.UnknownTopicOrPartition) {
			return lags, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

func lag(ctx context.Context, adm *kadm.Client, group string, topics []string) ([]PartitionLag, error) {
	described, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("lag of group %s: describe: %w", group, err)
	}
	dg := described[group]
	if dg.Err != nil && !errors.Is(dg.Err, kerr.GroupIDNotFound) {
		return nil, fmt.Errorf("lag of group %s: describe: %w", group, dg.Err)
	}
	dg.Err = nil

	want := topics
	if len(want) == 0 {
		want = []string{kadm.FetchAllGroupTopics}
	}
	commits, err := adm.FetchOffsetsForTopics(ctx, group, want...)
	if errors.Is(err, kerr.GroupIDNotFound) {
		// Some brokers (kfake, newer Kafka) answer offset fetches for an
		// unknown group with an error: it simply has no commits.
		commits, err = uncommitted(ctx, adm, topics)
	}
	if err != nil {
		return nil, fmt.Errorf("lag of group %s: committed offsets: %w", group, err)
	}

	listed := dg.AssignedPartitions()
	for t := range commits {
		listed.Add(t)
	}
	names := listed.Topics()
	if len(names) == 0 {
		return nil, nil
	}
	start, err := adm.ListStartOffsets(ctx, names...)
	if err != nil {
		return nil, fmt.Errorf("lag of group %s: start offsets: %w", group, err)
	}
	end, err := adm.ListEndOffsets(ctx, names...)
	if err != nil {
		return nil, fmt.Errorf("lag of group %s: end offsets: %w", group, err)
	}

	var out []PartitionLag
	for _, l := range kadm.CalculateGroupLagWithStartOffsets(dg, commits, start, end).Sorted() {
		if len(topics) > 0 && !slices.Contains(topics, l.Topic) {
			continue
		}
		if l.Err != nil {
			return nil, fmt.Errorf("lag of group %s on %s/%d: %w", group, l.Topic, l.Partition, l.Err)
		}
		pl := PartitionLag{
			Topic:     l.Topic,
			Partition: l.Partition,
			Committed: l.Commit.At,
			Start:     l.Start.Offset,
			End:       l.End.Offset,
			Lag:       l.Lag,
		}
		if l.Member != nil {
			pl.MemberID = l.Member.MemberID
		}
		out = append(out, pl)
	}
	return out, nil
}

// uncommitted returns "no commit" (-1) for every partition of topics, failing
// on a topic that does not exist.
func uncommitted(ctx context.Context, adm *kadm.Client, topics []string) (kadm.OffsetResponses, error) {
	out := make(kadm.OffsetResponses)
	if len(topics) == 0 {
		return out, nil
	}
	md, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		return nil, err
	}
	for _, t := range topics {
		td, ok := md[t]
		if !ok {
			return nil, fmt.Errorf("topic %s: %w", t, kerr.UnknownTopicOrPartition)
		}
		if td.Err != nil {
			return nil, fmt.Errorf("topic %s: %w", t, td.Err)
		}
		ps := make(map[int32]kadm.OffsetResponse, len(td.Partitions))
		for p := range td.Partitions {
			ps[p] = kadm.OffsetResponse{Offset: kadm.Offset{Topic: t, Partition: p, At: -1, LeaderEpoch: -1}}
		}
		out[t] = ps
	}
	return out, nil
}

// TotalLag sums the lag of every partition.
func TotalLag(lags []PartitionLag) int64 {
	var n int64
	for _, l := range lags {
		n += l.Lag
	}
	return n
}
