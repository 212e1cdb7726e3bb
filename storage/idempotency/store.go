package idempotency

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/gob"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/config"
	"carehub/kernel/sealing"
	"carehub/kernel/tick"
)

// Defaults of a Store.
const (
	// Retention is how long a key's answer is replayed (DECISIONS §3).
	Retention = 24 * time.Hour
	// DefaultLease is how long a running request holds its key without renewing it; it renews
	// every third of it. A retry of a request whose node died waits at most this long.
	DefaultLease = 10 * time.Second
	// DefaultSweepInterval is how often Run deletes expired keys.
	DefaultSweepInterval = 10 * time.Minute
)

// Store keeps idempotency keys in Postgres (tables idempotency_keys and idempotency_steps). It
// is safe for concurrent use.
type Store struct {
	pool   *pgxpool.Pool
	key    *sealing.Key
	lease  time.Duration
	sweep  time.Duration
	logger *slog.Logger
}

// Config configures a Store. Zero fields take their defaults.
type Config struct {
	// Lease is the lease of running requests. Default DefaultLease.
	Lease time.Duration
	// Logger logs lease renewal and expiry. Default slog.Default().
	Logger *slog.Logger
	// Key is the server sealing key that recorded answers and steps are sealed under; every
	// node sharing the database must have the same. Default: a random key of this Store's own,
	// so nothing it records opens in another process (ErrUnreadable): for tests only.
	Key *sealing.Key
}

func (c *Config) defaults() {
	config.Default(&c.Lease, DefaultLease)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Key == nil {
		c.Key = sealing.Random()
	}
}

// NewStore returns a store on pool.
func NewStore(pool *pgxpool.Pool, cfg Config) *Store {
	cfg.defaults()
	return &Store{pool: pool, key: cfg.Key, lease: cfg.Lease, sweep: DefaultSweepInterval, logger: cfg.Logger}
}

// Answer is a recorded answer: what a replay sends, and the resources the first request touched
// (its audit record's), which a replay's audit record names again.
type Answer struct {
	Status    int
	Header    http.Header
	Body      []byte
	Patients  []string
	Resources []string
}

// Claim claims key under scope for a request whose hash (of method, path, query and body) is
// requestHash; the hash kept is also of scope.Grant, so a request under another grant is another
// request (ErrMismatch). It returns:
//
//   - a Claim when this request is to run: new key, an expired one (older than Retention), or a
//     claim whose request died or failed without an answer (its recorded steps are kept, and
//     Tx replays them). The caller runs the request with With(ctx, claim) and then calls
//     Complete or Release.
//   - an Answer when a request with the same hash has answered: replay it.
//   - ErrMismatch when the key was used for another request, ErrInProgress when a request with
//     it is running, or another error.
func (s *Store) Claim(ctx context.Context, scope Scope, key string, requestHash []byte) (*Claim, *Answer, error) {
	c, prior, err := s.claim(ctx, scope, key, bind(requestHash, scope.Grant))
	if c != nil || err != nil {
		return c, nil, err
	}
	a, err := prior.Answer(requestHash)
	return nil, a, err
}

// Reserve claims key under scope for a request whose hash is known only once it has run: a
// streamed body is hashed as it is read (the observation intake). It returns:
//
//   - a Claim when this request is to run: new key, an expired one, or a reservation whose
//     request died. The caller runs the request and then calls CompleteFor with the request's
//     hash, or Release.
//   - a Prior when a request has answered under the key: the caller reads its request to the
//     end and asks Prior.Answer with its hash for the answer to replay (or ErrMismatch).
//   - ErrInProgress when a request with the key is running, or another error.
func (s *Store) Reserve(ctx context.Context, scope Scope, key string) (*Claim, *Prior, error) {
	return s.claim(ctx, scope, key, nil)
}

// Prior is what a key answered before, to replay to the same request only.
type Prior struct {
	scope  Scope
	keys   keys
	hash   []byte // bound to the grant
	sealed []byte
	logger *slog.Logger
}

// Answer returns the answer recorded for the request whose hash is requestHash, or ErrMismatch
// when the key answered another request (or a credential with another grant), or ErrUnreadable.
func (p *Prior) Answer(requestHash []byte) (*Answer, error) {
	if !bytes.Equal(p.hash, bind(requestHash, p.scope.Grant)) {
		return nil, ErrMismatch
	}
	a, err := openAnswer(p.keys, p.sealed)
	if errors.Is(err, ErrUnreadable) {
		p.logger.Warn("an idempotency key's answer does not open under this node's sealing key (sealed before v2, or nodes with different keys)",
			"org_id", p.scope.OrgID, "key_id", p.scope.KeyID)
	}
	return a, err
}

// claim claims key for a request whose bound hash is boundHash, or nil for a reservation
// (Reserve): the Claim when the request is to run, else the Prior answer under the key.
func (s *Store) claim(ctx context.Context, scope Scope, key string, boundHash []byte) (*Claim, *Prior, error) {
	k, err := derive(s.key, scope, key)
	if err != nil {
		return nil, nil, fmt.Errorf("idempotency key: %w", err)
	}
	c := &Claim{store: s, scope: scope, keys: k, owner: token()}
	for range 3 {
		claimed, err := s.take(ctx, c, boundHash)
		if err != nil {
			return nil, nil, err
		}
		if claimed {
			c.startRenewing()
			return c, nil, nil
		}
		p := &Prior{scope: scope, keys: k, logger: s.logger}
		var status *int32
		err = s.pool.QueryRow(ctx, `select request_hash, status_code, response from idempotency_keys
where org_id = $1 and key_id = $2 and key_hash = $3`, scope.OrgID, scope.KeyID, k.lookup).Scan(&p.hash, &status, &p.sealed)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // answered and swept, or released, in between: claim again
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read idempotency key: %w", err)
		}
		switch {
		case boundHash != nil && p.hash != nil && !bytes.Equal(p.hash, boundHash):
			return nil, nil, ErrMismatch
		case status == nil:
			return nil, nil, ErrInProgress
		}
		return nil, p, nil
	}
	return nil, nil, errors.New("claim idempotency key: contended")
}

// take claims c's key when it is free: absent, expired, or left without an answer by a
// request with the same hash (both nil for a reservation) that died or failed. A fresh claim (new or expired key) starts
// without steps; a taken-over one keeps the steps its request committed.
func (s *Store) take(ctx context.Context, c *Claim, boundHash []byte) (bool, error) {
	claimed := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var fresh bool
		err := tx.QueryRow(ctx, `
insert into idempotency_keys as k (org_id, key_id, key_hash, request_hash, owner, locked_until)
values ($1, $2, $3, $4, $5, now() + $6::interval)
on conflict (org_id, key_id, key_hash) do update set
	request_hash = excluded.request_hash, owner = excluded.owner, locked_until = excluded.locked_until,
	status_code = null, response = null,
	created_at = case when k.created_at < now() - $7::interval then now() else k.created_at end
where k.created_at < now() - $7::interval
	or (k.status_code is null and k.request_hash is not distinct from excluded.request_hash
		and (k.locked_until is null or k.locked_until < now()))
returning k.created_at = now()`, c.scope.OrgID, c.scope.KeyID, c.keys.lookup, boundHash, c.owner, s.lease, Retention).Scan(&fresh)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		claimed = true
		if fresh {
			_, err = tx.Exec(ctx, `delete from idempotency_steps where org_id = $1 and key_id = $2 and key_hash = $3`,
				c.scope.OrgID, c.scope.KeyID, c.keys.lookup)
		}
		return err
	})
	if err != nil {
		return false, fmt.Errorf("claim idempotency key: %w", err)
	}
	return claimed, nil
}

func token() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

const answerAD = "answer"

func openAnswer(k keys, sealed []byte) (*Answer, error) {
	plain, err := k.open(sealed, answerAD)
	if err != nil {
		return nil, err
	}
	var a Answer
	if err := gob.NewDecoder(bytes.NewReader(plain)).Decode(&a); err != nil {
		return nil, fmt.Errorf("replay idempotency key: %w", err)
	}
	return &a, nil
}

// Complete records a as the answer of c's request, to be replayed until the key expires, and
// ends c. A claim lost to a retry records nothing (the retry answers).
func (c *Claim) Complete(ctx context.Context, a Answer) error {
	return c.complete(ctx, nil, a)
}

// CompleteFor completes a reservation (Reserve): a is the answer of the request whose hash,
// known now that it has run, is requestHash; only that request gets a replayed.
func (c *Claim) CompleteFor(ctx context.Context, requestHash []byte, a Answer) error {
	return c.complete(ctx, bind(requestHash, c.scope.Grant), a)
}

func (c *Claim) complete(ctx context.Context, boundHash []byte, a Answer) error {
	c.end()
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(a); err != nil {
		return fmt.Errorf("record idempotent answer: %w", err)
	}
	_, err := c.store.pool.Exec(ctx, `
with done as (
	update idempotency_keys set status_code = $5, response = $6, request_hash = coalesce($7, request_hash),
		owner = null, locked_until = null
	where org_id = $1 and key_id = $2 and key_hash = $3 and owner = $4
	returning org_id, key_id, key_hash
)
delete from idempotency_steps st using done
where st.org_id = done.org_id and st.key_id = done.key_id and st.key_hash = done.key_hash`,
		c.scope.OrgID, c.scope.KeyID, c.keys.lookup, c.owner, a.Status, c.keys.seal(buf.Bytes(), answerAD), boundHash)
	if err != nil {
		return fmt.Errorf("record idempotent answer: %w", err)
	}
	return nil
}

// Release ends c without an answer (the request failed in a way a retry may fix: 5xx, 429), so
// that the next request with the key and the same body runs. When c committed no step the key
// is forgotten; otherwise its steps stay, and the retry resumes after them.
func (c *Claim) Release(ctx context.Context) error {
	c.end()
	tag, err := c.store.pool.Exec(ctx, `delete from idempotency_keys k
where org_id = $1 and key_id = $2 and key_hash = $3 and owner = $4
	and not exists (select 1 from idempotency_steps st
		where st.org_id = k.org_id and st.key_id = k.key_id and st.key_hash = k.key_hash)`,
		c.scope.OrgID, c.scope.KeyID, c.keys.lookup, c.owner)
	if err == nil && tag.RowsAffected() == 0 {
		_, err = c.store.pool.Exec(ctx, `update idempotency_keys set owner = null, locked_until = null
where org_id = $1 and key_id = $2 and key_hash = $3 and owner = $4`, c.scope.OrgID, c.scope.KeyID, c.keys.lookup, c.owner)
	}
	if err != nil {
		return fmt.Errorf("release idempotency key: %w", err)
	}
	return nil
}

// startRenewing renews c's lease every third of it until end.
func (c *Claim) startRenewing() {
	ctx, stop := context.WithCancel(context.Background())
	c.stop = stop
	c.renewing.Go(func() {
		tick.Every(ctx, c.store.lease/3, func(ctx context.Context) {
			tag, err := c.store.pool.Exec(ctx, `update idempotency_keys set locked_until = now() + $5::interval
where org_id = $1 and key_id = $2 and key_hash = $3 and owner = $4`,
				c.scope.OrgID, c.scope.KeyID, c.keys.lookup, c.owner, c.store.lease)
			switch {
			case ctx.Err() != nil:
			case err != nil:
				c.store.logger.Warn("renewing an idempotency key's lease failed", "err", err)
			case tag.RowsAffected() == 0:
				stop() // lost to a retry; the next step stops the request
			}
		})
	})
}

// end stops the lease renewal and waits for it. It is idempotent.
func (c *Claim) end() {
	c.endOnce.Do(func() {
		if c.stop != nil {
			c.stop()
		}
		c.renewing.Wait()
	})
}

// Sweep deletes keys older than Retention (and their steps), a chunk at a time, and returns how
// many. A key whose request is still running is left alone.
func (s *Store) Sweep(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, `delete from idempotency_keys where ctid = any(array(
	select ctid from idempotency_keys where created_at < now() - $1::interval
		and (locked_until is null or locked_until < now()) limit 1000))`, Retention)
		if err != nil {
			return total, fmt.Errorf("sweep idempotency keys: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 1000 {
			return total, nil
		}
	}
}

// Run sweeps expired keys every sweep interval until ctx is done.
func (s *Store) Run(ctx context.Context) error {
	tick.Every(ctx, s.sweep, func(ctx context.Context) {
		if n, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.logger.Warn("expiring idempotency keys failed", "err", err)
		} else if n > 0 {
			s.logger.Debug("idempotency keys expired", "count", n)
		}
	})
	return nil
}
