package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/events"
	"carehub/storage"
)

// AppendEventsCopy, AppendEventsCopyNew and AppendEventsUnnest expose AppendEvents' paths (a
// batch staged, copied straight in, inserted from arrays) to the benchmarks, which pick the
// threshold between them (copyThreshold).
func (l *EventLog) AppendEventsCopy(ctx context.Context, evs []events.Event) error {
	return pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error { return appendCopy(ctx, tx, evs) })
}

func (l *EventLog) AppendEventsCopyNew(ctx context.Context, evs []events.Event) error {
	return l.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error { return copyNew(ctx, c, evs) })
}

func (l *EventLog) AppendEventsUnnest(ctx context.Context, evs []events.Event) error {
	return l.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error { return appendUnnest(ctx, c, evs) })
}

// CopyThreshold is copyThreshold, for tests of the COPY path.
const CopyThreshold = copyThreshold

// EncodeCursor lets the benchmarks start a page anywhere in the log.
func EncodeCursor(at time.Time, id string) string { return storage.EncodeCursor(at, id) }

// SharedBuffersMB is the shared_buffers a durable local cluster gets.
func SharedBuffersMB() uint64 { return sharedBuffersMB() }
