package webhooks

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/sealing"
)

// Signing secrets are kept sealed (schemas/postgres/0027_webhook_secrets_sealed.sql): a reader of
// the database without the server sealing key learns none, so cannot forge deliveries.

// secretInfo names this use of the server key (kernel/sealing derives one key per use).
const secretInfo = "carehub webhook secret v1"

// errSecretUnreadable: a sealed secret did not open (another server key, or a corrupt value).
var errSecretUnreadable = errors.New("webhook signing secret does not open under this node's sealing key")

// secretBox seals and opens signing secrets.
type secretBox struct{ aead cipher.AEAD }

func newSecretBox(key *sealing.Key) secretBox {
	aead, err := key.AEAD(secretInfo, nil)
	if err != nil {
		// HKDF and AES-256-GCM fail only on lengths, which are fixed here.
		panic("webhooks: sealing key: " + err.Error())
	}
	return secretBox{aead: aead}
}

// seal encrypts secret (random nonce first) for subscription id. The id is the associated data,
// so a sealed secret copied into another subscription's row does not open there; it moves from
// current to previous in one row on rotation, so the column is not part of it.
func (b secretBox) seal(id, secret string) []byte {
	n := b.aead.NonceSize()
	nonce := make([]byte, n, n+len(secret)+b.aead.Overhead())
	rand.Read(nonce)
	return b.aead.Seal(nonce, nonce, []byte(secret), []byte(id))
}

func (b secretBox) open(id string, sealed []byte) (string, error) {
	n := b.aead.NonceSize()
	if len(sealed) < n {
		return "", errSecretUnreadable
	}
	plain, err := b.aead.Open(nil, sealed[:n], sealed[n:], []byte(id))
	if err != nil {
		return "", errSecretUnreadable
	}
	return string(plain), nil
}

// secretColumns select a subscription's signing secrets as storedSecrets.dest scans them: the
// current one, then the rotated-out one while it still signs.
const secretColumns = `secret, secret_sealed,
	case when previous_secret_expires_at > statement_timestamp() then previous_secret end,
	case when previous_secret_expires_at > statement_timestamp() then previous_secret_sealed end`

// storedSecrets is a subscription's signing secrets as its row holds them: sealed, or in clear
// in a row not sealed yet (SealStoredSecrets seals those when a node starts).
type storedSecrets struct {
	current, previous             *string
	currentSealed, previousSealed []byte
}

func (st *storedSecrets) dest() []any {
	return []any{&st.current, &st.currentSealed, &st.previous, &st.previousSealed}
}

// secrets returns the secrets that sign for subscription id, current first. A rotated-out
// secret that does not open is left out rather than failing the current one: rotating is how a
// subscription recovers when the sealing key was lost.
func (b secretBox) secrets(id string, st storedSecrets) ([]string, error) {
	current, err := b.pick(id, st.current, st.currentSealed)
	if err != nil {
		return nil, err
	}
	if current == "" {
		return nil, errors.New("webhook has no signing secret")
	}
	if previous, err := b.pick(id, st.previous, st.previousSealed); err == nil && previous != "" {
		return []string{current, previous}, nil
	}
	return []string{current}, nil
}

// pick prefers the clear value: only a write that does not seal (before the migration) sets it,
// so it is never older than the sealed one.
func (b secretBox) pick(id string, clear *string, sealed []byte) (string, error) {
	switch {
	case clear != nil:
		return *clear, nil
	case sealed != nil:
		return b.open(id, sealed)
	}
	return "", nil
}

// SealStoredSecrets seals the signing secrets that rows hold in clear (written before secrets
// were sealed) and clears them, and returns how many rows it sealed. It is idempotent, and
// several nodes may run it at once: the rows are locked in id order, and a row another node
// sealed meanwhile no longer matches once its lock is released.
func SealStoredSecrets(ctx context.Context, pool *pgxpool.Pool, key *sealing.Key) (int, error) {
	box := newSecretBox(key)
	var n int
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `select id, secret, previous_secret from webhooks
where secret is not null or previous_secret is not null order by id for update`)
		if err != nil {
			return err
		}
		var idList []string
		var current, previous [][]byte
		var id string
		var cur, prev *string
		_, err = pgx.ForEachRow(rows, []any{&id, &cur, &prev}, func() error {
			idList = append(idList, id)
			current = append(current, sealOrNil(box, id, cur))
			previous = append(previous, sealOrNil(box, id, prev))
			return nil
		})
		if err != nil || len(idList) == 0 {
			return err
		}
		tag, err := tx.Exec(ctx, `update webhooks w set
	secret_sealed = coalesce(u.current, w.secret_sealed),
	previous_secret_sealed = coalesce(u.previous, w.previous_secret_sealed),
	secret = null, previous_secret = null
from unnest($1::text[], $2::bytea[], $3::bytea[]) u(id, current, previous)
where w.id = u.id`, idList, current, previous)
		n = int(tag.RowsAffected())
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("seal webhook secrets: %w", err)
	}
	return n, nil
}

func sealOrNil(box secretBox, id string, clear *string) []byte {
	if clear == nil {
		return nil
	}
	return box.seal(id, *clear)
}
