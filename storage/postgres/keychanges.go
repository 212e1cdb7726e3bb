package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// KeyChangesChannel is the Postgres channel on which APIKeys.Revoke and APIKeys.Rotate announce
// the id of the key they changed, in the transaction that changes it: every node listens
// (KeyListener) and drops its cached state of that key, so that a revocation made by the CLI or
// another node applies everywhere at once rather than after the cache TTL.
const KeyChangesChannel = "carehub_key_changed"

// notifyKeyChanged announces key id on KeyChangesChannel when tx commits.
func notifyKeyChanged(ctx context.Context, tx pgx.Tx, id string) error {
	if _, err := tx.Exec(ctx, `select pg_notify($1, $2)`, KeyChangesChannel, id); err != nil {
		return fmt.Errorf("announce api key change: %w", err)
	}
	return nil
}

// KeyCache is a cache of API keys that KeyListener keeps in step with KeyChangesChannel:
// *auth.Authenticator.
type KeyCache interface {
	ForgetKey(id string) // drop what is cached of key id
	Forget()             // drop everything
}

// KeyListener keeps a KeyCache in step with KeyChangesChannel over a connection of its own
// (LISTEN holds a session; a pooled connection would lose it). While it is disconnected, the
// cache TTL bounds how late a change is seen; when it reconnects it drops the whole cache, since
// what was announced meanwhile is lost.
type KeyListener struct {
	cfg    *pgx.ConnConfig
	cache  KeyCache
	logger *slog.Logger
	conn   *pgx.Conn
}

// keyListenerRetry is the pause before reconnecting after the connection failed.
const keyListenerRetry = time.Second

// ListenKeyChanges connects with cfg and listens on KeyChangesChannel before it returns, so that
// every change committed after it returns reaches cache once Run runs.
func ListenKeyChanges(ctx context.Context, cfg *pgx.ConnConfig, cache KeyCache, logger *slog.Logger) (*KeyListener, error) {
	l := &KeyListener{cfg: cfg, cache: cache, logger: logger}
	if err := l.connect(ctx); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *KeyListener) connect(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return fmt.Errorf("key changes: connect: %w", err)
	}
	if _, err := conn.Exec(ctx, "listen "+pgx.Identifier{KeyChangesChannel}.Sanitize()); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return fmt.Errorf("key changes: listen: %w", err)
	}
	l.conn = conn
	return nil
}

// Run applies announced key changes until ctx ends, reconnecting after a failure; it closes the
// connection when it returns.
func (l *KeyListener) Run(ctx context.Context) error {
	defer func() {
		if l.conn != nil {
			l.conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for ctx.Err() == nil {
		err := l.follow(ctx)
		if ctx.Err() != nil {
			break
		}
		l.logger.Warn("key change listener disconnected; revocations reach this node within the key cache TTL until it reconnects", "err", err)
		l.conn.Close(context.WithoutCancel(ctx))
		l.conn = nil
		if err := l.reconnect(ctx); err != nil {
			break
		}
		l.cache.Forget() // what was announced while disconnected is lost
	}
	return nil
}

// follow drops the cached state of each announced key until the connection fails or ctx ends.
func (l *KeyListener) follow(ctx context.Context) error {
	for {
		n, err := l.conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		l.cache.ForgetKey(n.Payload)
	}
}

// reconnect retries connect every keyListenerRetry until it succeeds or ctx ends.
func (l *KeyListener) reconnect(ctx context.Context) error {
	t := time.NewTicker(keyListenerRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		err := l.connect(ctx)
		if err == nil {
			return nil
		}
		if !errors.Is(err, context.Canceled) {
			l.logger.Warn("key change listener cannot reconnect", "err", err)
		}
	}
}
