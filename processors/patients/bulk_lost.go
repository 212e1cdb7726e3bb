package patients

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Bulk Data files live in an unlogged table (schemas/postgres 0043): a PostgreSQL crash, or a
// failover to a standby, leaves it empty while the jobs, logged, still count what they wrote. A
// job whose files hold fewer resources than its count is started again from its first type, so
// a lost file is written anew rather than missing from a manifest.

// filesLost reports whether export id's files hold fewer than the written resources its job
// counts.
func (s *Service) filesLost(ctx context.Context, id string, written int64) (bool, error) {
	var stored int64
	if err := s.pool.QueryRow(ctx, `select coalesce(sum(count), 0) from bulk_export_files where export_id = $1`, id).Scan(&stored); err != nil {
		return false, fmt.Errorf("export files: %w", err)
	}
	return stored != written, nil
}

// restartExport puts export id back at its start, in progress, with none of its files: cond
// names the state it must still be in (the caller's lease, or completed). It reports whether it
// was.
func (s *Service) restartExport(ctx context.Context, id, cond string, args ...any) (bool, error) {
	restarted := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `update bulk_exports set status = 'in-progress', position = '{}', written = 0,
			completed_at = null, expires_at = null where id = $1 and `+cond, append([]any{id}, args...)...)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		restarted = true
		_, err = tx.Exec(ctx, `delete from bulk_export_files where export_id = $1`, id)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("restart export %s: %w", id, err)
	}
	return restarted, nil
}
