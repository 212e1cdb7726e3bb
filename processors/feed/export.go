package feed

import (
	"context"
	"errors"
	"fmt"

	"carehub/kernel/events"
	"carehub/kernel/fault"
	"carehub/kernel/phi"
	"carehub/storage"
)

// Export streams every event matching q to emit, in q's order, each as the caller may see it
// (phi.Guard, exactly as Events serves a page) with the cursor that resumes the export after it:
// pass the last cursor received as q.Cursor to continue an interrupted download. The store reads
// the range in one streamed query (storage.EventLog.ExportEvents) without counting (q.Limit and
// q.Total are ignored) and hands it over in chunks of storage.ExportChunk events, each guarded
// at once: memory stays bounded whatever the size. emit's error stops the export and is
// returned.
func (s *Service) Export(ctx context.Context, q Query, emit func(ev phi.Event, cursor string) error) error {
	q.Total = storage.TotalNone
	eq, none, err := s.eventQuery(ctx, q)
	if err != nil || none {
		return err
	}
	err = s.log.ExportEvents(ctx, eq, func(chunk []events.Event) error {
		evs, err := s.guard.Events(ctx, chunk)
		if err != nil {
			return fmt.Errorf("export events of %s: %w", q.ProjectID, err)
		}
		for _, ev := range evs {
			if err := emit(ev, storage.EncodeCursor(ev.CreatedAt, ev.ID)); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, storage.ErrBadCursor) {
		return fault.Invalid("invalid cursor: pass the cursor of the last exported event unchanged")
	}
	return err // emit's own, or the store's (named "export events: …")
}
