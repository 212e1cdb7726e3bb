package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Message is one outbox row: what the relay produces once the transaction that appended it
// commits.
type Message struct {
	// ID is unique in the outbox (the event id for events; the unique constraint rejects a
	// second row with the same ID, which aborts the transaction). The relay sends it as the
	// HeaderEventID header.
	ID    string
	Topic string
	Key   string
	Value []byte // a JSON document
}

// Record is m as the relay produces it: the event id in HeaderEventID.
func (m Message) Record() *kgo.Record {
	return &kgo.Record{Topic: m.Topic, Key: []byte(m.Key), Value: m.Value,
		Headers: []kgo.RecordHeader{{Key: HeaderEventID, Value: []byte(m.ID)}}}
}

// Append writes msgs to the outbox inside tx, in order, and issues NOTIFY Channel, which Postgres
// delivers on commit (and drops on rollback), so the relay wakes without polling. Nothing is
// written when tx rolls back: a message exists exactly when the change that caused it commits.
func Append(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	return appendOn(ctx, tx, msgs)
}

// appendOn is Append on tx, or on a pool: one statement, so on a pool it is a transaction of
// its own (and one round trip rather than begin, insert and commit).
func appendOn(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, msgs []Message) error {
	if len(msgs) == 0 {
		return nil
	}
	ids := make([]string, len(msgs))
	topics := make([]string, len(msgs))
	keys := make([]string, len(msgs))
	values := make([]string, len(msgs))
	for i, m := range msgs {
		if m.Topic == "" {
			return errors.New("append to outbox: no topic")
		}
		ids[i], topics[i], keys[i], values[i] = m.ID, m.Topic, m.Key, string(m.Value)
	}
	// One statement for the rows (unnest keeps the array order, so seq follows msgs) and the
	// notification; pg_notify inside a transaction is queued until commit.
	const q = `
with rows as (
	insert into outbox (event_id, topic, key, value)
	select e, t, k, v::jsonb from unnest($1::text[], $2::text[], $3::text[], $4::text[]) with ordinality as u(e, t, k, v, n)
	order by n
	returning 1
)
select pg_notify($5, '') from (select 1 from rows limit 1) as any_row`
	if _, err := db.Exec(ctx, q, ids, topics, keys, values, Channel); err != nil {
		return fmt.Errorf("append to outbox: %w", err)
	}
	return nil
}
