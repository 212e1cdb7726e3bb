package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/storage/kafka/publish"
)

// Headers of a dead-lettered record, besides the original's own: where it was read from, which
// consumer set it aside, why and when. ReplayRecord reads them.
const (
	HeaderSourceTopic     = "carehub-dlq-source-topic"
	HeaderSourcePartition = "carehub-dlq-source-partition"
	HeaderSourceOffset    = "carehub-dlq-source-offset"
	HeaderConsumer        = "carehub-dlq-consumer"
	HeaderError           = "carehub-dlq-error"
	HeaderTime            = "carehub-dlq-time" // RFC 3339, UTC
)

// DeadLetterConfig configures DeadLetter.
type DeadLetterConfig struct {
	// Name is the consumer's name, in the HeaderConsumer header and logs. Required.
	Name string
	// Topic receives the records set aside. Required.
	Topic string
	// Producer produces them (publish.Acked: each waits for its ack). Required.
	Producer *kgo.Client
	// Permanent reports whether a handler's error is the records' own fault, which no retry
	// can mend (storage.ErrUnstorable); other errors are retried as ever. Required.
	Permanent func(error) bool
	// Reason words an error for the log and the HeaderError header; it must not quote the
	// record's value (patient data). Default: "the handler refused the record".
	Reason func(error) string
	// OnDeadLetter, when set, is called for each record set aside, once it is produced (the
	// consumer's own counter).
	OnDeadLetter func(*kgo.Record)
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// DeadLetter returns a middleware that keeps a record its handler can never handle from
// stalling its partition. When the handler fails a batch with a Permanent error, the batch is
// handed to the handler again by halves until every record that still fails is alone; each
// of those is produced to Config.Topic with the headers above, counted, and logged by topic,
// partition and offset (never by value), and the batch succeeds: Commit commits it whole, the
// records handled included. A transient error, on the batch or on any part of it, is returned
// as it is and the runner retries the whole batch, so the handler must be idempotent (as every
// consumer's is). A record that fails is read again by no consumer of the group; an operator
// replays it with `carehub deadletter replay` once what refused it is mended.
func DeadLetter(cfg DeadLetterConfig) Middleware {
	if cfg.Reason == nil {
		cfg.Reason = func(error) string { return "the handler refused the record" }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d := &deadLetter{cfg: cfg, out: publish.NewAcked(cfg.Producer), log: cfg.Logger.With("consumer", cfg.Name, "dlq_topic", cfg.Topic)}
	return func(next Handler) Handler {
		return func(ctx context.Context, recs []*kgo.Record) error {
			err := next(ctx, recs)
			if err == nil || !cfg.Permanent(err) {
				return err
			}
			return d.isolate(ctx, next, recs, err)
		}
	}
}

type deadLetter struct {
	cfg DeadLetterConfig
	out *publish.Acked
	log *slog.Logger
}

// isolate handles recs, which next failed with the permanent error err, by halves, and
// dead-letters each record that fails alone. It returns the first transient error.
func (d *deadLetter) isolate(ctx context.Context, next Handler, recs []*kgo.Record, err error) error {
	if len(recs) == 1 {
		return d.send(ctx, recs[0], err)
	}
	half := len(recs) / 2
	for _, part := range [][]*kgo.Record{recs[:half], recs[half:]} {
		err := next(ctx, part)
		if err != nil && !d.cfg.Permanent(err) {
			return err
		}
		if err != nil {
			if err := d.isolate(ctx, next, part, err); err != nil {
				return err
			}
		}
	}
	return nil
}

// DeadLetterRecord returns rec as it goes to the dead-letter topic: its key, value and headers,
// and the headers above, naming consumer and reason (which must not quote the value). A
// consumer that sets records aside itself produces it (the observation writer, inside its
// Kafka transaction); DeadLetter does for the others.
func DeadLetterRecord(rec *kgo.Record, topic, consumer, reason string) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: rec.Key, Value: rec.Value, Headers: append(slices.Clone(rec.Headers),
		kgo.RecordHeader{Key: HeaderSourceTopic, Value: []byte(rec.Topic)},
		kgo.RecordHeader{Key: HeaderSourcePartition, Value: strconv.AppendInt(nil, int64(rec.Partition), 10)},
		kgo.RecordHeader{Key: HeaderSourceOffset, Value: strconv.AppendInt(nil, rec.Offset, 10)},
		kgo.RecordHeader{Key: HeaderConsumer, Value: []byte(consumer)},
		kgo.RecordHeader{Key: HeaderError, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderTime, Value: time.Now().UTC().AppendFormat(nil, time.RFC3339Nano)},
	)}
}

// send produces rec to the dead-letter topic and logs it.
func (d *deadLetter) send(ctx context.Context, rec *kgo.Record, cause error) error {
	reason := d.cfg.Reason(cause)
	out := DeadLetterRecord(rec, d.cfg.Topic, d.cfg.Name, reason)
	if err := d.out.All(ctx, out); err != nil {
		return fmt.Errorf("consume: dead-letter a record: %w", err)
	}
	if d.cfg.OnDeadLetter != nil {
		d.cfg.OnDeadLetter(rec)
	}
	d.log.Error("ALERT: a record was set aside on the dead-letter topic; replay it once its cause is mended",
		"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "error", reason)
	return nil
}

// DeadLettered is a record of a dead-letter topic as DeadLetter wrote it: where it came from
// and why it was set aside.
type DeadLettered struct {
	Record          *kgo.Record // as read from the dead-letter topic
	SourceTopic     string
	SourcePartition int32
	SourceOffset    int64
	Consumer, Error string
	Time            time.Time
}

// ReadDeadLettered reads the headers DeadLetter wrote on rec; it fails for a record without a
// source topic (not written by DeadLetter).
func ReadDeadLettered(rec *kgo.Record) (DeadLettered, error) {
	d := DeadLettered{Record: rec}
	for _, h := range rec.Headers {
		v := string(h.Value)
		switch h.Key {
		case HeaderSourceTopic:
			d.SourceTopic = v
		case HeaderSourcePartition:
			p, _ := strconv.ParseInt(v, 10, 32)
			d.SourcePartition = int32(p)
		case HeaderSourceOffset:
			d.SourceOffset, _ = strconv.ParseInt(v, 10, 64)
		case HeaderConsumer:
			d.Consumer = v
		case HeaderError:
			d.Error = v
		case HeaderTime:
			d.Time, _ = time.Parse(time.RFC3339Nano, v)
		}
	}
	if d.SourceTopic == "" {
		return d, errors.New("not a dead-lettered record: no source topic header")
	}
	return d, nil
}

// ReplayRecord is the record to produce to put d back on its source topic: its key, value and
// original headers, without DeadLetter's.
func (d DeadLettered) ReplayRecord() *kgo.Record {
	out := &kgo.Record{Topic: d.SourceTopic, Key: d.Record.Key, Value: d.Record.Value}
	for _, h := range d.Record.Headers {
		switch h.Key {
		case HeaderSourceTopic, HeaderSourcePartition, HeaderSourceOffset, HeaderConsumer, HeaderError, HeaderTime:
		default:
			out.Headers = append(out.Headers, h)
		}
	}
	return out
}
