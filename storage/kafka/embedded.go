package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kfake"

	"carehub/storage/writeback"
)

// ErrDataDirLocked is returned by StartEmbedded when another process (or
// another Embedded in this one) already serves the data dir.
var ErrDataDirLocked = errors.New("kafka data dir is in use")

// Names of carehub's own files in the data dir; kfake ignores them.
const (
	lockFile  = "carehub.lock"
	dirtyFile = "carehub.running"
	// kfakeUsersFile is where kfake persists its SASL users.
	kfakeUsersFile = "sasl.json"
)

// EmbeddedConfig configures StartEmbedded. Zero fields take their defaults.
type EmbeddedConfig struct {
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Port makes the broker listen on 127.0.0.1:Port. Default: an ephemeral port.
	Port int
	// SyncWrites fsyncs every produced batch before it is acknowledged.
	//
	// Without it (the default) an acknowledged record is in the OS page cache:
	// it survives a crash or kill -9 of carehub, not a crash of the machine.
	// That is Kafka's own default (log.flush.interval.messages unbounded), where
	// replication covers machine loss; the embedded broker has no replicas, so
	// turn this on where losing the last acknowledged records to a power cut
	// matters more than produce throughput.
	SyncWrites bool
	// DiskReserve is the free space of the data dir's disk under which the broker refuses
	// produce requests and transaction commits (DiskFull says so) until space returns.
	// Default: DefaultDiskReserve.
	DiskReserve int64
}

func (c *EmbeddedConfig) defaults() {
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	if c.DiskReserve <= 0 {
		c.DiskReserve = DefaultDiskReserve
	}
}

// Embedded is an in-process Kafka-protocol broker (franz-go's kfake) whose
// topics, records, committed group offsets and producer ids persist under a
// data dir. It is one broker on 127.0.0.1; clients reach it at Addrs and authenticate with
// Credentials (SASL/SCRAM-SHA-256). The data dir is private to its owner (0700).
//
// Topics are never created automatically (like carehub's Kafka config):
// use EnsureTopics.
//
// While its disk has less than EmbeddedConfig.DiskReserve free, it refuses produce requests
// and transaction commits, and DiskFull says so (embedded_disk.go).
type Embedded struct {
	c     *kfake.Cluster
	dir   string
	lock  *os.File
	log   *slog.Logger
	once  sync.Once
	addrs []string
	creds Credentials
	// pacer has the kernel write the segments back as they are written, not in a burst of
	// 30 s of them at once (package writeback).
	pacer *writeback.Pacer
	disk  *diskGuard
	// diskStop stops the disk's watch; diskDone is closed once it has stopped.
	diskStop, diskDone chan struct{}
}

// StartEmbedded starts the embedded broker on dir, creating dir if needed,
// and returns once it accepts connections.
//
// Only one Embedded may serve a dir at a time (ErrDataDirLocked otherwise);
// the lock is an flock, so the kernel drops it when a process dies and a
// killed carehub needs no manual cleanup.
//
// If the previous process on dir did not Close (it crashed or was killed),
// StartEmbedded recovers: kfake replays the segment files, dropping a torn
// trailing batch, and StartEmbedded then checkpoints the recovered state
// with one clean close and reopen, so that state logs with a torn tail are
// rewritten before anything is appended after the tear.
//
// ctx bounds nothing inside kfake (loading a dir cannot be interrupted);
// StartEmbedded fails if ctx is done before it returns.
func StartEmbedded(ctx context.Context, dir string, cfg EmbeddedConfig) (*Embedded, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cfg.defaults()
	if dir == "" {
		return nil, errors.New("embedded kafka: empty data dir")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded kafka: %w", err)
	}
	if err := tightenDir(dir); err != nil {
		return nil, fmt.Errorf("embedded kafka: %w", err)
	}
	lock, err := lockDir(filepath.Join(dir, lockFile))
	if err != nil {
		return nil, fmt.Errorf("embedded kafka on %s: %w", dir, err)
	}

	e := &Embedded{dir: dir, lock: lock, log: cfg.Logger.With("data_dir", dir),
		disk: &diskGuard{dir: dir, reserve: uint64(cfg.DiskReserve)}, diskStop: make(chan struct{}), diskDone: make(chan struct{})}
	if e.creds, err = embeddedCredentials(dir); err != nil {
		lock.Close()
		return nil, err
	}
	c, err := e.open(cfg)
	if err != nil {
		lock.Close()
		return nil, err
	}
	e.c = c
	e.addrs = c.ListenAddrs()
	e.pacer = writeback.Start(dir, writeback.DefaultInterval, e.log)
	go e.watchDisk(c, e.diskStop, e.diskDone)
	if err := ctx.Err(); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// open starts kfake on the dir, first checkpointing it if the last process
// died with it open.
func (e *Embedded) open(cfg EmbeddedConfig) (*kfake.Cluster, error) {
	marker := filepath.Join(e.dir, dirtyFile)
	_, statErr := os.Stat(marker)
	dirty := statErr == nil
	if err := os.WriteFile(marker, fmt.Appendf(nil, "%d\n", os.Getpid()), 0o600); err != nil {
		return nil, fmt.Errorf("embedded kafka: %w", err)
	}
	// The one user is seeded from the credentials file on every start; kfake's own copy of its
	// users (which a dir from before authentication holds empty) would replace it.
	if err := os.Remove(filepath.Join(e.dir, kfakeUsersFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("embedded kafka: %w", err)
	}

	kopts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.DataDir(e.dir),
		kfake.ClusterID("carehub-embedded"),
		kfake.WithLogger(kfakeLogger{e.log, &e.disk.full}),
		// Loopback is not private on a shared host: every connection authenticates.
		kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-256", e.creds.User, e.creds.Password),
	}
	if cfg.Port != 0 {
		kopts = append(kopts, kfake.Ports(cfg.Port))
	}
	if cfg.SyncWrites {
		kopts = append(kopts, kfake.SyncWrites())
	}

	if dirty {
		e.log.Warn("embedded kafka was not shut down cleanly; recovering")
		c, err := kfake.NewCluster(kopts...)
		if err != nil {
			return nil, fmt.Errorf("embedded kafka: recover %s: %w", e.dir, err)
		}
		// Close writes every state file whole (tmp file + rename), which
		// is the checkpoint; the reopen below loads a clean dir.
		c.Close()
	}
	c, err := kfake.NewCluster(kopts...)
	if err != nil {
		return nil, fmt.Errorf("embedded kafka: start on %s: %w", e.dir, err)
	}
	return c, nil
}

// Addrs returns the broker's host:port addresses, for ClientConfig.Brokers.
func (e *Embedded) Addrs() []string { return slices.Clone(e.addrs) }

// Credentials returns what a client authenticates with, for ClientConfig.Credentials.
func (e *Embedded) Credentials() Credentials { return e.creds }

// Close persists the broker's state, stops it and releases the data dir. It
// is safe to call more than once; later calls do nothing.
func (e *Embedded) Close() error {
	var err error
	e.once.Do(func() {
		e.pacer.Stop()
		close(e.diskStop)
		<-e.diskDone
		e.c.Close()
		// On a full disk kfake's closing checkpoint may not have been written: the marker
		// stays, so the next start recovers from the segments as after a kill.
		_, _, _ = e.disk.check() // the disk as the broker closed
		if e.disk.full.Load() {
			e.log.Warn("embedded kafka: closed on a full disk; the next start recovers the data dir")
		} else if rmErr := os.Remove(filepath.Join(e.dir, dirtyFile)); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			err = fmt.Errorf("embedded kafka: %w", rmErr)
		}
		if cErr := e.lock.Close(); cErr != nil && err == nil {
			err = fmt.Errorf("embedded kafka: release lock: %w", cErr)
		}
	})
	return err
}

// kfakeLogger forwards kfake's warnings and errors to slog.
type kfakeLogger struct {
	l *slog.Logger
	// diskFull is the guard's state: while the disk is full, a write kfake could not make (a
	// batch, an abort's marker) is debug, not a line each: the guard has said so once.
	diskFull *atomic.Bool
}

func (k kfakeLogger) Logf(level kfake.LogLevel, msg string, args ...any) {
	line := fmt.Sprintf(msg, args...)
	switch {
	case level != kfake.LogLevelError && level != kfake.LogLevelWarn: // kfake's info and debug: dropped
	case k.diskFull.Load() && (noSpace(line) || strings.HasPrefix(msg, "endTx: failed to persist")):
		k.l.Debug(line)
	case level == kfake.LogLevelError:
		k.l.Error(line)
	case strings.HasPrefix(msg, "txn: EndTxn slow"):
		// kfake warns of every transaction commit slower than 5 ms, which transactional
		// observation intake makes routine under load: that one is debug.
		k.l.Debug(line)
	default:
		k.l.Warn(line)
	}
}
