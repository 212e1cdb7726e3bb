package consume

import (
	"context"

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
