package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/cmd/carehub/node"
	"carehub/storage/kafka"
	"carehub/storage/kafka/consume"
	"carehub/storage/kafka/publish"
)

const deadLetterUsage = `usage:
  carehub deadletter list   [--topic events|audit|observations] [--data-dir DIR | --kafka-brokers B] [--kafka-namespace NS]
  carehub deadletter replay [--topic events|audit|observations] [--data-dir DIR | --kafka-brokers B] [--kafka-namespace NS] [--partition P] --offset N | --all

Consumers set aside on a dead-letter topic the records their store refuses, one such topic per
source topic (--topic, default events): events holds those of the event log, the webhook
dispatcher and the workflow triggers (the CONSUMER column says which), audit those of the audit
writer, observations those of the observation writer (see carehub_*_dead_lettered_total and
carehub_observations_skipped_total{reason="rejected_by_database"}). list shows them, by
dead-letter offset, with where they came from and why (never their payload). replay produces
the chosen ones to their source topic again, once what refused them is mended: every consumer
of that topic reads them again, and each is idempotent by record id (the live WebSocket feed
sends a replayed event again). It leaves them on the dead-letter topic, so replay each once.
With the embedded broker the server must be stopped (it holds the broker).
`

// deadLetterTopic returns the dead-letter topic --topic names, in topics.
func deadLetterTopic(topics kafka.Topics, name string) (string, error) {
	switch name {
	case "events":
		return topics.EventsDLQ, nil
	case "audit":
		return topics.AuditDLQ, nil
	case "observations":
		return topics.ObservationsDLQ, nil
	}
	return "", fmt.Errorf("deadletter: --topic %q: events, audit or observations", name)
}

// deadLetterReadTimeout bounds reading the dead-letter topic to its end.
const deadLetterReadTimeout = 30 * time.Second

func cmdDeadLetter(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "replay") {
		fmt.Fprint(stderr, deadLetterUsage)
		return errUsage
	}
	sub := args[0]
	cfg := node.Defaults()
	cfg.LogLevel = "warn"
	fs := storeFlags("deadletter "+sub, &cfg)
	offset := fs.Int64("offset", -1, "replay the record at this dead-letter offset (as list shows it)")
	partition := fs.Int("partition", -1, "with --offset: the dead-letter partition (needed when the offset is in several)")
	all := fs.Bool("all", false, "replay every record")
	source := fs.String("topic", "events", "which dead-letter topic: that of events, audit or observations")
	if err := parse(fs, args[1:], stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 || (sub == "replay" && (*offset < 0) == !*all) || (sub == "list" && (*all || *offset >= 0)) {
		fmt.Fprint(stderr, deadLetterUsage)
		return errUsage
	}
	topic, err := deadLetterTopic(kafka.Namespace(cfg.KafkaNamespace).Topics(), *source)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	cl, closeBroker, err := openBroker(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeBroker()
	dead, err := readDeadLetters(ctx, cl, topic)
	if err != nil {
		return err
	}
	if sub == "list" {
		return listDeadLetters(stdout, dead)
	}
	return replayDeadLetters(ctx, cl, stdout, dead, int32(*partition), *offset)
}

// openBroker connects to the configured brokers, or starts the embedded one under the data dir
// (which fails while a server holds it).
func openBroker(ctx context.Context, cfg node.Config) (*kgo.Client, func(), error) {
	brokers, creds, closeBroker := cfg.KafkaBrokers, cfg.KafkaCredentials, func() {}
	if len(brokers) == 0 {
		if err := node.CheckDataDir(cfg.DataDir); err != nil {
			return nil, nil, err
		}
		b, err := kafka.StartEmbedded(ctx, filepath.Join(cfg.DataDir, "kafka"), kafka.EmbeddedConfig{Logger: node.NewLogger(cfg)})
		if err != nil {
			return nil, nil, fmt.Errorf("embedded kafka (stop the server first, or pass --kafka-brokers): %w", err)
		}
		brokers, creds, closeBroker = b.Addrs(), b.Credentials(), func() { _ = b.Close() }
	}
	cl, err := kafka.NewClient(kafka.ClientConfig{Brokers: brokers, Credentials: creds, ClientID: "carehub-deadletter"})
	if err != nil {
		closeBroker()
		return nil, nil, fmt.Errorf("kafka: %w", err)
	}
	return cl, func() { cl.Close(); closeBroker() }, nil
}

// readDeadLetters reads topic from its start to the end it has now, without a consumer group.
func readDeadLetters(ctx context.Context, cl *kgo.Client, topic string) ([]consume.DeadLettered, error) {
	ctx, cancel := context.WithTimeout(ctx, deadLetterReadTimeout)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("dead-letter topic %s: %w", topic, err)
	}
	start := map[string]map[int32]kgo.Offset{topic: {}}
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			start[topic][o.Partition] = kgo.NewOffset().AtStart()
			left[o.Partition] = o.Offset
		}
	})
	if err := ends.Error(); err != nil {
		return nil, fmt.Errorf("dead-letter topic %s: %w", topic, err)
	}
	if len(left) == 0 {
		return nil, nil
	}
	cl.AddConsumePartitions(start)
	defer cl.PurgeTopicsFromConsuming(topic)
	var out []consume.DeadLettered
	for len(left) > 0 {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("read dead-letter topic %s: %w", topic, err)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if end, ok := left[r.Partition]; ok && r.Offset >= end-1 {
				delete(left, r.Partition)
			}
			if d, err := consume.ReadDeadLettered(r); err == nil {
				out = append(out, d)
			}
		})
	}
	return out, nil
}

func listDeadLetters(stdout io.Writer, dead []consume.DeadLettered) error {
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tOFFSET\tSOURCE\tCONSUMER\tSET ASIDE\tERROR")
	for _, d := range dead {
		fmt.Fprintf(tw, "%d\t%d\t%s/%d@%d\t%s\t%s\t%s\n", d.Record.Partition, d.Record.Offset, d.SourceTopic,
			d.SourcePartition, d.SourceOffset, d.Consumer, d.Time.Format(time.RFC3339), d.Error)
	}
	return tw.Flush()
}

// replayDeadLetters produces the record at partition and offset (partition < 0: any) to its
// source topic, or every record when offset < 0.
func replayDeadLetters(ctx context.Context, cl *kgo.Client, stdout io.Writer, dead []consume.DeadLettered, partition int32, offset int64) error {
	var recs []*kgo.Record
	for _, d := range dead {
		if offset < 0 || d.Record.Offset == offset && (partition < 0 || d.Record.Partition == partition) {
			recs = append(recs, d.ReplayRecord())
		}
	}
	switch {
	case len(recs) == 0:
		return errors.New("deadletter replay: no such record (see carehub deadletter list)")
	case offset >= 0 && len(recs) > 1:
		return fmt.Errorf("deadletter replay: offset %d is in %d partitions: name one with --partition", offset, len(recs))
	}
	if err := publish.NewAcked(cl).All(ctx, recs...); err != nil {
		return fmt.Errorf("deadletter replay: %w", err)
	}
	fmt.Fprintf(stdout, "replayed %d record(s)\n", len(recs))
	return nil
}
