package fhirsubs

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/storage"
)

// BindingTTL is how long a websocket binding token binds.
const BindingTTL = 5 * time.Minute

// defaultWSHeartbeat is a websocket channel's heartbeat when its subscription sets none: an idle
// socket still hears that it is alive.
const defaultWSHeartbeat = 60 * time.Second

// tokenMAC is the HMAC of a binding token's claims under the node's sealing key: any node of the
// cluster (they share it) accepts a token any other issued.
func (s *Service) tokenMAC(claims string) []byte {
	key, err := s.cfg.Key.Derive("carehub fhir websocket binding v1", nil)
	if err != nil {
		panic("fhirsubs: derive: " + err.Error())
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(claims))
	return m.Sum(nil)
}

// BindingToken is $get-ws-binding-token: a token that binds a websocket to the caller's
// websocket-channel subscription id until it expires.
func (s *Service) BindingToken(ctx context.Context, id string) (token string, expires time.Time, err error) {
	sub, err := s.get(ctx, id)
	if err != nil {
		return "", time.Time{}, err
	}
	if sub.Channel != ChannelWebSocket {
		return "", time.Time{}, fault.Invalid("subscription %s has a %s channel: only a websocket channel binds a socket", ids.FHIR(sub.ID), sub.Channel)
	}
	expires = time.Now().Add(BindingTTL).Truncate(time.Second)
	claims := sub.ID + "." + strconv.FormatInt(expires.Unix(), 10)
	return base64.RawURLEncoding.EncodeToString([]byte(claims)) + "." + base64.RawURLEncoding.EncodeToString(s.tokenMAC(claims)), expires, nil
}

// ErrBadToken is every refusal of a binding token: it says nothing of which part failed.
var ErrBadToken = errors.New("the binding token is not valid (unknown, altered or expired): get one with $get-ws-binding-token")

// bind returns the subscription a binding token names, when it is valid and the subscription is
// still a live websocket one.
func (s *Service) bind(ctx context.Context, token string) (Subscription, error) {
	c64, m64, ok := strings.Cut(token, ".")
	claimsB, err1 := base64.RawURLEncoding.DecodeString(c64)
	mac, err2 := base64.RawURLEncoding.DecodeString(m64)
	if !ok || err1 != nil || err2 != nil || !hmac.Equal(mac, s.tokenMAC(string(claimsB))) {
		return Subscription{}, ErrBadToken
	}
	id, expStr, _ := strings.Cut(string(claimsB), ".")
	exp, err := strconv.ParseInt(expStr, 10, 64)
	if err != nil || time.Now().Unix() > exp {
		return Subscription{}, ErrBadToken
	}
	sub, err := scanSubscription(s.pool.QueryRow(ctx, `select `+columns+` from `+subscriptions+` where id = $1 and deleted_at is null`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return sub, ErrBadToken
	}
	return sub, err
}

// Bind returns the subscription a binding token names, when the token is valid, the
// subscription a live websocket one and its creator's key still authenticates; ErrBadToken (or
// what current says) otherwise.
func (s *Service) Bind(ctx context.Context, token string) (Subscription, error) {
	sub, err := s.bind(ctx, token)
	if err != nil {
		return sub, err
	}
	return s.current(ctx, sub)
}

// Stream serves a websocket channel bound to sub (Bind): a handshake, then every event numbered
// after the bind in order, at most max-count per notification, and heartbeats. send writes one
// text message. It returns when ctx ends, send fails, or the subscription is deleted or its
// creator's key stops authenticating (an error saying so).
func (s *Service) Stream(ctx context.Context, sub Subscription, base string, wake *Wake, send func([]byte) error) error {
	var err error
	woken, stop := wake.Wait(sub.ID)
	defer stop()
	beat := defaultWSHeartbeat
	if sub.HeartbeatSeconds > 0 {
		beat = time.Duration(sub.HeartbeatSeconds) * time.Second
	}
	heartbeat := time.NewTimer(beat)
	defer heartbeat.Stop()
	sent := sub.EventsSinceStart
	typ := TypeHandshake
	for {
		var evs []event
		if typ == TypeNotification {
			evs, err = s.events(ctx, sub.ID, sent, min(sub.EventsSinceStart, sent+int64(sub.MaxCount)))
			if err != nil {
				return err
			}
		}
		if typ != "" {
			body, patients, err := s.bundle(ctx, sub, base, typ, evs)
			if err != nil {
				return err
			}
			if err := send(body); err != nil {
				return err
			}
			if len(evs) > 0 {
				sent = evs[len(evs)-1].Number
				s.audit(sub, evs, patients)
			}
			heartbeat.Reset(beat)
		}
		if sent < sub.EventsSinceStart {
			typ = TypeNotification // the rest of a burst, max-count at a time
		} else {
			select {
			case <-ctx.Done():
				return nil
			case <-heartbeat.C:
				typ = TypeHeartbeat
			case <-woken:
				typ = TypeNotification
			}
		}
		// The subscription as it is now: deleted, or its key revoked, ends the stream.
		if sub, err = s.current(ctx, sub); err != nil {
			return err
		}
		if typ == TypeNotification && sent >= sub.EventsSinceStart {
			typ = "" // a wake-up for events another socket's read already covered
		}
	}
}

// current re-reads sub for a stream: an error ends it.
func (s *Service) current(ctx context.Context, sub Subscription) (Subscription, error) {
	now, err := scanSubscription(s.pool.QueryRow(ctx, `select `+columns+` from `+subscriptions+` where id = $1 and deleted_at is null`, sub.ID))
	if errors.Is(err, pgx.ErrNoRows) {
		return sub, errors.New("the subscription was deleted")
	}
	if err != nil {
		return sub, fmt.Errorf("read subscription: %w", err)
	}
	ok, err := s.keyUsable(ctx, now.KeyID)
	if err != nil {
		return sub, err
	}
	if !ok {
		return sub, errors.New("the key that created the subscription is revoked or expired")
	}
	return now, nil
}

// audit records a notification that carried patient data.
func (s *Service) audit(sub Subscription, evs []event, patients []string) {
	if s.cfg.Audit == nil || len(patients) == 0 {
		return
	}
	resources := []string{sub.ID}
	for _, ev := range evs {
		resources = append(resources, ev.FocusID)
	}
	s.cfg.Audit(storage.AuditRecord{ID: ids.New(ids.Request), Time: time.Now().UTC(), OrgID: sub.OrgID, KeyID: sub.KeyID,
		Mode: sub.Mode, UserAgent: userAgent, Operation: "FHIR Subscription notification " + ids.FHIR(sub.ID) + " (" + sub.Channel + ", " + sub.Content + ")",
		ResourceIDs: resources, PatientIDs: patients, Outcome: "success", Status: 200})
}
