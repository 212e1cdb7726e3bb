package consume

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Decode returns a Handler that decodes each record with decode and hands the values, in record
// order, to handle. A record decode rejects is poison: no retry can make it valid, so it must
// not hold its partition. It is passed to skip (Runner.Skip: logged by topic, partition and
// offset, never by value, which may carry patient data, and counted), left out, and committed
// with its batch. handle is not called when no record of the batch decodes.
func Decode[T any](skip func(*kgo.Record, error), decode func([]byte) (T, error), handle func(context.Context, []T) error) Handler {
	return func(ctx context.Context, recs []*kgo.Record) error {
		vals := make([]T, 0, len(recs))
		for _, r := range recs {
			v, err := decode(r.Value)
			if err != nil {
				skip(r, err)
				continue
			}
			vals = append(vals, v)
		}
		if len(vals) == 0 {
			return nil
		}
		return handle(ctx, vals)
	}
}

// Select returns a Handler that hands next only the records of a batch that keep returns, so a
// consumer can pass over the records it has no use for (by a header, or a glance at the value)
// before decoding any. The records passed over count as handled: the middleware around the
// Handler (Commit) commits the whole batch. An error from keep is the batch's error. next is
// not called when keep returns none.
func Select(keep func(context.Context, []*kgo.Record) ([]*kgo.Record, error), next Handler) Handler {
	return func(ctx context.Context, recs []*kgo.Record) error {
		kept, err := keep(ctx, recs)
		if err != nil || len(kept) == 0 {
			return err
		}
		return next(ctx, kept)
	}
}

// Stale reports whether a copy of state loaded at loadedAt may be older than what recs need: it
// was loaded before their newest record was produced, plus a second for clock skew. A record's
// timestamp is when it was produced, after its event was created, so state that existed before
// an event is in a copy loaded after the record's timestamp. The handlers that match records
// against rows kept in memory (workflow triggers, deployment scorers) reload when it says so.
func Stale(loadedAt time.Time, recs []*kgo.Record) bool {
	var newest time.Time
	for _, r := range recs {
		if r.Timestamp.After(newest) {
			newest = r.Timestamp
		}
	}
	return !loadedAt.After(newest.Add(time.Second))
}
