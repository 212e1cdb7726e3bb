package kafka

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"
)

// Producer defaults carehub applies in NewClient. They are exported so
// callers and tests can reason about them; override any of them with the
// matching kgo option in NewClient's extra options.
const (
	// DefaultClientID is the client id when ClientConfig.ClientID is empty.
	DefaultClientID = "carehub"
	// DefaultLinger is how long a partition's batch waits for more records.
	// Long enough to batch under load, short enough that ingest's 202 (sent
	// after the broker acknowledges) stays fast.
	DefaultLinger = 5 * time.Millisecond
	// DefaultBatchMaxBytes caps one record batch. It stays under the
	// broker's default message.max.bytes (1 MiB + 12 bytes).
	DefaultBatchMaxBytes int32 = 1 << 20
	// DefaultFetchMaxWait is how long a fetch waits on the broker for data
	// (the Java client's default, not franz-go's 5 s). A consumer adds
	// partitions to its fetches only between fetches, so on a group join,
	// where committed partitions are ready before the rest, a long poll on
	// the first ones would hold back the others for the whole wait.
	DefaultFetchMaxWait = 500 * time.Millisecond
	// DefaultMetadataMinAge is the least time between two metadata
	// refreshes (franz-go: 5 s). When a broker restarts or a partition's
	// leader is not ready yet, produce and fetch wait for the next refresh;
	// 1 s bounds that stall at little cost.
	DefaultMetadataMinAge = time.Second
)

// ClientConfig says which cluster a client talks to and where it reports.
type ClientConfig struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// ClientID names the client to the broker (quotas, broker logs) and
	// labels its metrics (client_id). Default DefaultClientID. Clients that
	// share a Registerer need distinct ids.
	ClientID string
	// Registerer, when non-nil, receives the client's metrics (namespace
	// "carehub", subsystem "kafka", const label client_id); they are
	// unregistered when the client is closed.
	Registerer prometheus.Registerer
	// Logger receives the client's warnings and errors. Default: discard.
	Logger *slog.Logger
	// Credentials authenticate the client when the brokers require SASL (the embedded broker
	// always does). Default: none.
	Credentials Credentials
	// Watch, when set, is called with each of franz-go's messages at info level and above, for a
	// caller that must react to one the API does not report (publish.Transactional). It is
	// called on franz-go's goroutines and must be quick.
	Watch func(level kgo.LogLevel, msg string)
}

// Validate reports whether the config can build a client.
func (c ClientConfig) Validate() error {
	if len(c.Brokers) == 0 {
		return errors.New("kafka client: no brokers")
	}
	if err := c.Credentials.Validate(); err != nil {
		return err
	}
	for _, b := range c.Brokers {
		if b == "" {
			return errors.New("kafka client: empty broker address")
		}
	}
	return nil
}

// defaults fills the unset fields. A nil Logger stays nil: franz-go then logs nothing.
func (c *ClientConfig) defaults() {
	if c.ClientID == "" {
		c.ClientID = DefaultClientID
	}
}

// NewClient returns a franz-go client with carehub's defaults:
//
//   - idempotent producer (franz-go's default, kept) with acks=all, so a
//     record whose promise reports success is on every in-sync replica and a
//     retried batch is never written twice;
//   - unlimited produce retries and no record delivery timeout: a record is
//     retried until it is delivered, the client is closed, or the context
//     passed to Produce is cancelled before the record is sent. That is what
//     the outbox relay needs (it must not drop a row because Kafka was down
//     for a minute). Request-scoped producers (ingest) bound the wait with
//     their request context instead; a record already in flight is not
//     cancelled, because cancelling it would break idempotent sequencing.
//     Pass kgo.RecordDeliveryTimeout in extra to bound delivery anyway;
//   - records to a topic that does not exist fail after a few metadata
//     retries (topics are created by EnsureTopics, never automatically);
//   - DefaultLinger and DefaultBatchMaxBytes for batching, DefaultFetchMaxWait
//     for consuming, DefaultMetadataMinAge for recovering from leader moves;
//   - keyed records go to murmur2(key) mod partitions, as the Java client
//     partitions them (StickyKeyPartitioner); unkeyed records stick to one
//     partition per batch;
//   - consumers read committed (kgo.ReadCommitted): a record of an aborted
//     transaction (an intake request that failed, a writer batch cut short
//     by a crash) is never seen, and a committed one is seen once the
//     transaction commits;
//   - franz-go's warnings and errors go to cfg.Logger;
//   - kprom metrics on cfg.Registerer, if set.
//
// extra options are applied last and override the defaults. The caller
// closes the client.
func NewClient(cfg ClientConfig, extra ...kgo.Opt) (*kgo.Client, error) {
	return newClient(cfg, extra, kgo.NewClient)
}

// Reachable succeeds once a TCP connection to one of brokers opens, each tried within timeout.
// A node checks its external brokers with it before it starts anything, so an unreachable
// cluster is the first and only line the operator reads, not the last after the start-up log and
// the client's retries.
func Reachable(ctx context.Context, brokers []string, timeout time.Duration) error {
	d := net.Dialer{Timeout: timeout}
	var causes []string
	for _, b := range brokers {
		conn, err := d.DialContext(ctx, "tcp", b)
		if err == nil {
			conn.Close()
			return nil
		}
		causes = append(causes, err.Error())
	}
	return fmt.Errorf("no broker of %s can be reached (%s)", strings.Join(brokers, ","), strings.Join(causes, "; "))
}

// TransactionalID returns prefix followed by 12 random hex digits: a transactional id of this
// process alone, for a producer whose instance has no stable name to fence its predecessor with.
func TransactionalID(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// NewGroupTransactSession is NewClient for a consumer that produces what it derives from its
// input in Kafka transactions that also commit its consumer offsets (exactly once from topic to
// topic); extra must name a kgo.ConsumerGroup and a kgo.TransactionalID.
func NewGroupTransactSession(cfg ClientConfig, extra ...kgo.Opt) (*kgo.GroupTransactSession, error) {
	var s *kgo.GroupTransactSession
	_, err := newClient(cfg, extra, func(opts ...kgo.Opt) (*kgo.Client, error) {
		var err error
		if s, err = kgo.NewGroupTransactSession(opts...); err != nil {
			return nil, err
		}
		return s.Client(), nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

func newClient(cfg ClientConfig, extra []kgo.Opt, build func(...kgo.Opt) (*kgo.Client, error)) (*kgo.Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(DefaultLinger),
		kgo.ProducerBatchMaxBytes(DefaultBatchMaxBytes),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.FetchMaxWait(DefaultFetchMaxWait),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.MetadataMinAge(DefaultMetadataMinAge),
	}
	opts = append(opts, cfg.Credentials.Opts()...)
	if cfg.Logger != nil || cfg.Watch != nil {
		l := cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
		opts = append(opts, kgo.WithLogger(&slogLogger{l: l.With("client_id", cfg.ClientID), watch: cfg.Watch}))
	}
	var (
		metrics *conventionalMetrics
		unreg   *unregisterOnClose
	)
	if cfg.Registerer != nil {
		// kprom would register each metric on its own and panic on a
		// duplicate. Instead it registers nowhere, and the whole set goes
		// on the caller's registry as one collector after the client
		// exists, so a clash is an error we can return.
		metrics = newConventionalMetrics(kprom.NewMetrics("carehub",
			kprom.Subsystem("kafka"),
			kprom.WithClientLabel(),
			kprom.FetchAndProduceDetail(kprom.ByNode, kprom.ByTopic, kprom.Records, kprom.Batches,
				kprom.UncompressedBytes, kprom.CompressedBytes, kprom.ConsistentNaming),
			kprom.Registry(nil),
		), cfg.ClientID)
		unreg = &unregisterOnClose{reg: cfg.Registerer, c: metrics}
		opts = append(opts, kgo.WithHooks(metrics.Metrics, unreg))
	}
	opts = append(opts, extra...)

	cl, err := build(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	if metrics != nil {
		if err := cfg.Registerer.Register(metrics); err != nil {
			// Not registered, so nothing to unregister: the registry
			// matches by descriptor and would remove the other client's
			// metrics instead.
			unreg.disarm()
			cl.Close()
			if _, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
				return nil, fmt.Errorf("kafka client: metrics for client id %q are already registered; give each client a distinct ClientID: %w", cfg.ClientID, err)
			}
			return nil, fmt.Errorf("kafka client: register metrics: %w", err)
		}
	}
	return cl, nil
}

// unregisterOnClose removes a client's metrics from the registry when the
// client closes, so a later client may reuse the id. Only once: kgo runs
// close hooks on every Close, and the registry unregisters by descriptor, so
// a second Close would remove a newer client's metrics under the same id.
type unregisterOnClose struct {
	reg  prometheus.Registerer
	c    prometheus.Collector
	once sync.Once
}

// OnClientClosed implements kgo.HookClientClosed.
func (u *unregisterOnClose) OnClientClosed(*kgo.Client) {
	u.once.Do(func() { u.reg.Unregister(u.c) })
}

func (u *unregisterOnClose) disarm() { u.once.Do(func() {}) }

// slogLogger adapts slog to kgo.Logger at warn and above: franz-go's info
// and debug logs are per-request chatter. With watch, franz-go logs at info
// and watch sees every message; slog still gets warn and above.
type slogLogger struct {
	l     *slog.Logger
	watch func(kgo.LogLevel, string)
}

func (s *slogLogger) Level() kgo.LogLevel {
	if s.watch != nil {
		return kgo.LogLevelInfo
	}
	return kgo.LogLevelWarn
}

func (s *slogLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if s.watch != nil {
		s.watch(level, msg)
		if level > kgo.LogLevelWarn {
			return
		}
	}
	var lvl slog.Level
	switch level {
	case kgo.LogLevelError:
		lvl = slog.LevelError
	case kgo.LogLevelWarn:
		lvl = slog.LevelWarn
	case kgo.LogLevelInfo:
		lvl = slog.LevelInfo
	default:
		lvl = slog.LevelDebug
	}
	s.l.Log(context.Background(), lvl, msg, keyvals...)
}
