package consume

import (
	"context"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Committer commits records' offsets; *kgo.Client is one.
type Committer interface {
	CommitRecords(ctx context.Context, rs ...*kgo.Record) error
}

// Commit commits a batch's offsets after next has handled it, and only then: a batch whose
// handler failed is not committed, so its records are read again rather than lost. A failed
// commit is logged and not returned: the effect is durable and reading the records again is
// harmless (handlers are idempotent), while returning it would redo the effect for nothing.
func Commit(cl Committer, log *slog.Logger) Middleware {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return func(next Handler) Handler {
		return func(ctx context.Context, recs []*kgo.Record) error {
			if err := next(ctx, recs); err != nil {
				return err
			}
			if err := cl.CommitRecords(ctx, recs...); err != nil && ctx.Err() == nil {
				log.Warn("commit after the effect failed; the records will be read and handled again", "error", err)
			}
			return nil
		}
	}
}
