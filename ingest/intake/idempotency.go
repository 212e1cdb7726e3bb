package intake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/fault"
	"carehub/storage/idempotency"
)

// Idempotency-Key handling (DECISIONS §3): the same key with the same body replays the first
// answer for 24 h; the same key with another body, or while the first request is still running,
// is 409 CONFLICT. Keys are per organization; the hash is also of the credential's grant (scopes
// and mode), so a credential with other scopes or mode gets 409, not the first one's answer.
//
// A key is reserved before the body is read (the body is streamed, so its hash is known only at
// the end), completed with the hash and the answer when the request ends with 202 or 422, and
// released when it ends otherwise (413, 415, 503…), so that a retry runs again. A reservation
// outlives a crashed request by at most its lease.

// KeyRetention is how long an answer is replayed: as long as every other Idempotency-Key's.
const KeyRetention = idempotency.Retention

type keyState int

const (
	keyReserved   keyState = iota // new: this request runs and completes or releases it
	keyInProgress                 // another request with this key is running
	keyCompleted                  // answered before: replay or conflict
)

type storedAnswer struct {
	hash   []byte
	status int
	body   []byte
}

type keyStore struct {
	pool  *pgxpool.Pool
	lease time.Duration
}

// reserve claims (org, key) for this request, or reports that it is taken.
func (k *keyStore) reserve(ctx context.Context, org, key string) (keyState, storedAnswer, error) {
	for attempt := 0; attempt < 3; attempt++ {
		var reserved bool
		err := k.pool.QueryRow(ctx, `insert into ingest_idempotency (org_id, key, locked_until) values ($1, $2, now() + $3::interval)
on conflict (org_id, key) do update set request_hash = null, status_code = null, response = null,
	locked_until = excluded.locked_until, created_at = now()
where ingest_idempotency.created_at < now() - $4::interval
	or (ingest_idempotency.status_code is null and ingest_idempotency.locked_until < now())
returning true`, org, key, k.lease, KeyRetention).Scan(&reserved)
		if err == nil {
			return keyReserved, storedAnswer{}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return 0, storedAnswer{}, fmt.Errorf("reserve idempotency key: %w", err)
		}
		var a storedAnswer
		var status *int32
		err = k.pool.QueryRow(ctx, `select request_hash, status_code, response from ingest_idempotency
where org_id = $1 and key = $2`, org, key).Scan(&a.hash, &status, &a.body)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // released or swept in between: try to reserve again
		}
		if err != nil {
			return 0, storedAnswer{}, fmt.Errorf("read idempotency key: %w", err)
		}
		if status == nil {
			return keyInProgress, storedAnswer{}, nil
		}
		a.status = int(*status)
		return keyCompleted, a, nil
	}
	return 0, storedAnswer{}, errors.New("reserve idempotency key: contended")
}

// complete records the answer of the request that reserved (org, key).
func (k *keyStore) complete(org, key string, a storedAnswer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := k.pool.Exec(ctx, `update ingest_idempotency set request_hash = $3, status_code = $4, response = $5, locked_until = null
where org_id = $1 and key = $2`, org, key, a.hash, a.status, a.body)
	if err != nil {
		return fmt.Errorf("complete idempotency key: %w", err)
	}
	return nil
}

// release drops the reservation of (org, key) so that a retry runs afresh.
func (k *keyStore) release(org, key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := k.pool.Exec(ctx, `delete from ingest_idempotency where org_id = $1 and key = $2 and status_code is null`, org, key); err != nil {
		return fmt.Errorf("release idempotency key: %w", err)
	}
	return nil
}

// sweep deletes answers older than KeyRetention, a chunk at a time, and returns how many.
func (k *keyStore) sweep(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := k.pool.Exec(ctx, `delete from ingest_idempotency where ctid = any(array(
	select ctid from ingest_idempotency where created_at < now() - $1::interval limit 5000))`, KeyRetention)
		if err != nil {
			return total, fmt.Errorf("sweep idempotency keys: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 5000 {
			return total, nil
		}
	}
}

// recorded is how an answer is kept for replay: the 202 answer, or the 422's message and
// details.
type recorded struct {
	Answer  *Answer                    `json:"answer,omitempty"`
	Message string                     `json:"message,omitempty"`
	Details map[string]json.RawMessage `json:"details,omitempty"`
}

// storable returns what to keep of a finished request: 202 and 422 are answers to the body and
// are replayed; anything else (413, 503…) is released so that a retry runs again.
func storable(res Result, err error, hash []byte) (storedAnswer, bool) {
	var rec recorded
	var status int
	switch {
	case err == nil:
		rec.Answer, status = &res.Answer, 202
	case fault.KindOf(err) == fault.KindValidation:
		f := fault.As(err)
		rec.Message, status = f.Message, 422
		rec.Details = make(map[string]json.RawMessage, len(f.Details))
		for k, v := range f.Details {
			b, jerr := json.Marshal(v)
			if jerr != nil {
				return storedAnswer{}, false
			}
			rec.Details[k] = b
		}
	default:
		return storedAnswer{}, false
	}
	body, jerr := json.Marshal(rec)
	if jerr != nil {
		return storedAnswer{}, false
	}
	return storedAnswer{hash: hash, status: status, body: body}, true
}

// result rebuilds the answer of a completed request, with the types Submit returns.
func (a storedAnswer) result() (Result, error) {
	var rec recorded
	if err := json.Unmarshal(a.body, &rec); err != nil {
		return Result{}, fmt.Errorf("replay idempotency key: %w", err)
	}
	if a.status == 202 && rec.Answer != nil {
		return Result{Answer: *rec.Answer}, nil
	}
	details := make(map[string]any, len(rec.Details))
	for k, raw := range rec.Details {
		var v any
		switch k {
		case "accepted":
			var n int
			v = &n
		case "rejected":
			v = &[]EntryError{}
		case "ids":
			v = &[]string{}
		default:
			v = new(any)
		}
		if err := json.Unmarshal(raw, v); err != nil {
			return Result{}, fmt.Errorf("replay idempotency key: %w", err)
		}
		switch p := v.(type) {
		case *int:
			details[k] = *p
		case *[]EntryError:
			details[k] = *p
		case *[]string:
			details[k] = *p
		case *any:
			details[k] = *p
		}
	}
	return Result{}, &fault.Error{Kind: fault.KindValidation, Message: rec.Message, Details: details}
}
