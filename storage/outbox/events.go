package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/events"
)

// AppendEvents writes evs to the outbox inside tx (Append), for the relay to
// publish on topic once tx commits: key = project id, value = the JSON envelope, and the relay is
// woken on commit.
//
// AppendEvents validates every event first and writes nothing if one is invalid. An event id already
// in the outbox is an error (the unique constraint), which aborts tx: ids are minted by events.New.
func AppendEvents(ctx context.Context, tx pgx.Tx, topic string, evs ...events.Event) error {
	msgs, err := EventMessages(topic, evs...)
	if err != nil {
		return err
	}
	if err := Append(ctx, tx, msgs...); err != nil {
		return fmt.Errorf("append events: %w", err)
	}
	return nil
}

// EventMessages returns the outbox messages of evs for topic, as AppendEvents writes them (for
// Group, which writes them in a transaction of its own). It validates every event.
func EventMessages(topic string, evs ...events.Event) ([]Message, error) {
	if len(evs) > 0 && topic == "" {
		return nil, errors.New("append events: no topic")
	}
	msgs := make([]Message, len(evs))
	for i, ev := range evs {
		value, err := events.Encode(ev)
		if err != nil {
			return nil, fmt.Errorf("append events: %w", err)
		}
		msgs[i] = Message{ID: ev.ID, Topic: topic, Key: ev.ProjectID, Value: value}
	}
	return msgs, nil
}
