package consume

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Handler handles the records of one poll. It returns nil only when the effect of every record
// is durable; an error makes the runner rewind the batch and hand it over again after a backoff
// (see the package comment). It is called from one goroutine at a time.
type Handler func(ctx context.Context, recs []*kgo.Record) error

// Middleware wraps a Handler with one concern.
type Middleware func(Handler) Handler

// GroupOpts are the client options a consumer run by Runner needs: membership of group on
// topics, no auto-commit (Commit commits after the effect) and rebalances blocked while a poll
// is in hand. Consumers add their own (a reset offset, a fetch wait) after them.
func GroupOpts(group string, topics ...string) []kgo.Opt {
	return []kgo.Opt{
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
	}
}
