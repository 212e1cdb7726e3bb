package feed

import (
	"context"
	"errors"
	"fmt"

	"carehub/kernel/fault"
	"carehub/kernel/phi"
	"carehub/storage"
)

// exportPage is how many events Export reads per store query: its memory bound, whatever the
// size of the range.
const exportPage = 1000

// Export streams every event matching q to emit, in q's order, each as the caller may see it
// (phi.Guard, exactly as Events serves a page) with the cursor that resumes the export after it:
// pass the last cursor received as q.Cursor to continue an interrupted download. It reads
// exportPage events at a time without counting (q.Limit and q.Total are ignored), so memory
// stays bounded. emit's error stops the export and is returned.
func (s *Service) Export(ctx context.Context, q Query, emit func(ev phi.Event, cursor string) error) error {
	q.Limit, q.Total = exportPage, storage.TotalNone
	eq, err := s.eventQuery(ctx, q)
	if err != nil {
		return err
	}
	for {
		page, err := s.log.QueryEvents(ctx, eq)
		if errors.Is(err, storage.ErrBadCursor) {
			return fault.Invalid("invalid cursor: pass the cursor of the last exported event unchanged")
		}
		if err != nil {
			return fmt.Errorf("export events of %s: %w", q.ProjectID, err)
		}
		evs, err := s.guard.Events(ctx, page.Events)
		if err != nil {
			return fmt.Errorf("export events of %s: %w", q.ProjectID, err)
		}
		for _, ev := range evs {
			if err := emit(ev, storage.EncodeCursor(ev.CreatedAt, ev.ID)); err != nil {
				return err
			}
		}
		if page.NextCursor == "" {
			return nil
		}
		eq.Cursor = page.NextCursor
	}
}
