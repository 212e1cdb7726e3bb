package fhirsubs

import (
	"context"
	"fmt"
	"time"
)

// EventRetention is how long a numbered event is kept once nothing needs it: a rest-hook
// subscription's events its receiver took, a websocket subscription's (whose sockets heard them
// as they were numbered), a deleted subscription's. $events reads back this far. A rest-hook
// receiver that has not taken an event keeps it however old it is.
const EventRetention = 24 * time.Hour

// sweepBatch bounds one delete's rows, so a sweep of a busy day holds no lock long.
const sweepBatch = 10_000

// Sweep deletes the events past olderThan that nothing needs (EventRetention), sweepBatch rows a
// statement, and returns how many it deleted.
func (s *Service) Sweep(ctx context.Context, olderThan time.Duration) (int64, error) {
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, `delete from fhir_subscription_events where ctid in (
	select e.ctid from fhir_subscription_events e join fhir_subscriptions s on s.id = e.subscription_id
	where e.occurred_at < now() - $1::interval
	  and (s.channel = 'websocket' or s.deleted_at is not null or e.number <= s.delivered_through)
	limit $2)`, olderThan.String(), sweepBatch)
		if err != nil {
			return total, fmt.Errorf("sweep subscription events: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < sweepBatch {
			return total, nil
		}
	}
}
