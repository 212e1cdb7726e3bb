package clickhouse

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The backfill of the hourly sums (0021_event_counts.sql): the events stored before the sums'
// view existed are counted once, by the Open that creates the view, and a node killed partway
// through leaves the sums neither short nor counted twice: the next Open resumes where it
// stopped.
//
// Its progress is a table of its own, backfillTable, one row per step. Month 0 is the backfill
// itself: pending (the sums are about to be created), then its cut (events logged before it are
// the backfill's, the rest the view's), then complete. Every other row is a month (a partition,
// yyyymm): staged, then done. A month is counted into stageTable (a copy of the sums table's
// layout), then moved into the sums in one step (MOVE PARTITION, atomic: the month is either
// all in the stage or all in the sums), then marked done. So on resuming, a month that was
// not staged is counted again into an emptied stage; a staged one still in the stage is moved;
// a staged one gone from the stage was moved and only its mark is missing.
const (
	backfillTable = "event_counts_backfill"
	stageTable    = "event_counts_hourly_stage"
)

// States of backfillTable's rows: a step's row is never changed, the month's state is the
// greatest one written.
const (
	backfillPending  uint8 = 0 // month 0: the sums table is being created
	backfillCut      uint8 = 1 // month 0: the cut is taken, months in progress
	backfillComplete uint8 = 2 // month 0: every month is in the sums

	monthStaged uint8 = 1 // the month's sums are all in stageTable
	monthDone   uint8 = 2 // the month's sums are in the sums table
	// monthMoved is not recorded (monthDone follows it): the step between the move and its mark,
	// where backfillStep lets a test stop too.
	monthMoved uint8 = 3
)

const createBackfillTable = `CREATE TABLE IF NOT EXISTS ` + backfillTable + ` (
    month UInt32,
    state UInt8,
    cut   DateTime64(6, 'UTC'),
    at    DateTime64(6, 'UTC') DEFAULT now64(6)
) ENGINE = MergeTree ORDER BY (month, state)`

// backfillStep is called after each step is recorded, and after each move; tests make it fail
// to stop a backfill there, as a killed node would.
var backfillStep = func(month uint32, state uint8) error { return nil }

// planBackfill creates the progress table and, when the sums are about to be created (fresh),
// starts a new backfill in it: the pending row is written before the sums table exists, so an
// Open killed after creating it still finds the backfill to do.
func (s *Store) planBackfill(ctx context.Context, fresh bool) error {
	if err := s.conn.Exec(ctx, createBackfillTable); err != nil {
		return fmt.Errorf("clickhouse migrations: %w", err)
	}
	if !fresh {
		return nil
	}
	if err := s.conn.Exec(ctx, "TRUNCATE TABLE "+backfillTable); err != nil {
		return fmt.Errorf("clickhouse migrations: %w", err)
	}
	return s.mark(ctx, 0, backfillPending, time.Unix(0, 0))
}

// mark records a step of the backfill.
func (s *Store) mark(ctx context.Context, month uint32, state uint8, cut time.Time) error {
	// The cut in microseconds: bound as a time, the driver would send whole seconds, and a
	// resumed backfill would then leave out what was logged in the cut's last second.
	if err := s.conn.Exec(ctx, "INSERT INTO "+backfillTable+" (month, state, cut) SELECT ?, ?, fromUnixTimestamp64Micro(?, 'UTC')",
		month, state, cut.UnixMicro()); err != nil {
		return fmt.Errorf("clickhouse migrations: backfill %s: %w", countsTable, err)
	}
	return backfillStep(month, state)
}

// backfillCounts runs or resumes the backfill planBackfill started, if any: it counts, a month
// (a partition) at a time so the server holds one month's groups, the events logged before the
// cut.
func (s *Store) backfillCounts(ctx context.Context) error {
	fail := func(err error) error { return fmt.Errorf("clickhouse migrations: backfill %s: %w", countsTable, err) }
	progress, cut, err := s.backfillProgress(ctx)
	if err != nil {
		return fail(err)
	}
	run, planned := progress[0]
	if !planned || run == backfillComplete {
		return nil
	}
	if run == backfillPending {
		// The view exists now: what is logged from here on, it counts.
		if err := s.conn.QueryRow(ctx, "SELECT now64(6)").Scan(&cut); err != nil {
			return fail(err)
		}
		if err := s.mark(ctx, 0, backfillCut, cut); err != nil {
			return err
		}
	}
	if err := s.conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+stageTable+" AS "+countsTable); err != nil {
		return fail(err)
	}
	months, err := column[uint64](ctx, s.conn, `SELECT DISTINCT toUInt64(partition) FROM system.parts
WHERE database = currentDatabase() AND table = 'event_log' AND active ORDER BY 1`)
	if err != nil {
		return fail(err)
	}
	for _, p := range months {
		m := uint32(p)
		if progress[m] == monthDone {
			continue
		}
		if progress[m] != monthStaged {
			if err := s.conn.Exec(ctx, "ALTER TABLE "+stageTable+" DROP PARTITION ?", m); err != nil {
				return fail(err)
			}
			if err := s.conn.Exec(ctx, "INSERT INTO "+stageTable+" "+countsSelect+`toYYYYMM(created_at) = ?
AND logged_at < fromUnixTimestamp64Micro(?, 'UTC') GROUP BY ALL`, m, cut.UnixMicro()); err != nil {
				return fail(err)
			}
			if err := s.mark(ctx, m, monthStaged, cut); err != nil {
				return err
			}
		}
		staged, err := column[uint64](ctx, s.conn, "SELECT count() FROM "+stageTable+" WHERE toYYYYMM(hour) = ?", m)
		if err != nil {
			return fail(err)
		}
		if staged[0] > 0 { // else moved before a restart, or nothing to count
			if err := s.conn.Exec(ctx, "ALTER TABLE "+stageTable+" MOVE PARTITION ? TO TABLE "+countsTable, m); err != nil {
				return fail(err)
			}
			if err := backfillStep(m, monthMoved); err != nil {
				return err
			}
		}
		if err := s.mark(ctx, m, monthDone, cut); err != nil {
			return err
		}
	}
	if err := s.conn.Exec(ctx, "DROP TABLE IF EXISTS "+stageTable); err != nil {
		return fail(err)
	}
	return s.mark(ctx, 0, backfillComplete, cut)
}

// backfillProgress reads the greatest state of each month in backfillTable, and the cut.
func (s *Store) backfillProgress(ctx context.Context) (map[uint32]uint8, time.Time, error) {
	rows, err := s.conn.Query(ctx, "SELECT month, max(state), max(cut) FROM "+backfillTable+" GROUP BY month")
	if err != nil {
		return nil, time.Time{}, err
	}
	progress := map[uint32]uint8{}
	var cut time.Time
	for rows.Next() {
		var (
			month uint32
			state uint8
			c     time.Time
		)
		if err := rows.Scan(&month, &state, &c); err != nil {
			_ = rows.Close()
			return nil, time.Time{}, err
		}
		progress[month] = state
		if month == 0 {
			cut = c
		}
	}
	return progress, cut, errors.Join(rows.Err(), rows.Close())
}
