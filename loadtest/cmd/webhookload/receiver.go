package main

import (
	"crypto/sha256"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"carehub/kernel/whsig"
)

// maxBody bounds a delivery's body (docs/WEBHOOKS.md: a receiver reads at most 1 MiB).
const maxBody = 1 << 20

// tolerance is how far a delivery's webhook-timestamp may be from the receiver's clock.
const tolerance = 5 * time.Minute

// tracker is the receiver's bookkeeping: it verifies each delivery's signature (docs/WEBHOOKS.md),
// counts each event once (by webhook-id: retries repeat it), and measures publish → delivered
// from the sentAt each published payload carries. It is safe for concurrent use.
type tracker struct {
	secret   string
	now      func() time.Time
	observed func(time.Duration) // called with each first delivery's latency (the progress recorder)

	mu         sync.Mutex
	published  int64 // events of acknowledged publish calls
	delivered  map[deliveryKey]struct{}
	latencies  []time.Duration
	duplicates int64       // redeliveries of an event already counted
	badSig     int64       // missing or wrong signature
	stale      int64       // webhook-timestamp outside the tolerance
	malformed  int64       // signed, but no sentAt in the payload
	outOfOrder int64       // first deliveries of a client's event before one it published earlier
	lastSeq    map[int]int // by publishing client: the highest seq delivered
	last       time.Time   // when the latest first delivery of an event arrived
}

func newTracker(secret string, now func() time.Time, observed func(time.Duration)) *tracker {
	if observed == nil {
		observed = func(time.Duration) {}
	}
	return &tracker{secret: secret, now: now, observed: observed, delivered: map[deliveryKey]struct{}{}, lastSeq: map[int]int{}}
}

// deliveryKey is a webhook-id as the tracker remembers it: the first 16 bytes of its SHA-256.
// A map of them holds no pointers, so the garbage collector does not walk the millions of ids a
// long run delivers: kept as strings, their marking grew with the run and took the CPU of the
// node being measured.
type deliveryKey [16]byte

func keyOf(id string) deliveryKey {
	sum := sha256.Sum256([]byte(id))
	return deliveryKey(sum[:16])
}

// delivery is the part of a delivered body the tracker reads.
type delivery struct {
	Payload struct {
		SentAt int64 `json:"sentAt"` // unix nanoseconds when the publish call was sent
		Client int   `json:"client"`
		Seq    int   `json:"seq"` // the client's publish call
	} `json:"payload"`
}

// element is one event of a batched delivery (an ordered subscription with batchSize > 1): the
// webhook-id and body it would have alone (docs/WEBHOOKS.md).
type element struct {
	ID   string          `json:"id"`
	Body json.RawMessage `json:"body"`
}

// receive judges one delivery (one event, or a batch of them) and returns the status to answer:
// 204 when counted (or a duplicate), 401 for a bad or stale signature, 400 for a body it cannot
// read.
func (t *tracker) receive(h http.Header, body []byte) int {
	now := t.now()
	id, ts := h.Get(whsig.HeaderID), h.Get(whsig.HeaderTimestamp)
	if !whsig.Verify(t.secret, id, ts, body, h.Get(whsig.HeaderSignature)) {
		t.count(&t.badSig)
		return http.StatusUnauthorized
	}
	unix, _ := strconv.ParseInt(ts, 10, 64) // Verify parsed it
	if now.Sub(time.Unix(unix, 0)).Abs() > tolerance {
		t.count(&t.stale)
		return http.StatusUnauthorized
	}
	elems := []element{{ID: id, Body: body}}
	if len(body) > 0 && body[0] == '[' {
		if err := json.Unmarshal(body, &elems); err != nil || len(elems) == 0 {
			t.count(&t.malformed)
			return http.StatusBadRequest
		}
	}
	ds := make([]delivery, len(elems))
	for i, e := range elems {
		if err := json.Unmarshal(e.Body, &ds[i]); err != nil || ds[i].Payload.SentAt == 0 || e.ID == "" {
			t.count(&t.malformed)
			return http.StatusBadRequest
		}
	}
	var fresh []time.Duration
	t.mu.Lock()
	for i, e := range elems {
		key := keyOf(e.ID)
		if _, dup := t.delivered[key]; dup {
			t.duplicates++
			continue
		}
		p := ds[i].Payload
		if last, ok := t.lastSeq[p.Client]; ok && p.Seq < last {
			t.outOfOrder++
		}
		t.lastSeq[p.Client] = max(t.lastSeq[p.Client], p.Seq)
		t.delivered[key] = struct{}{}
		latency := now.Sub(time.Unix(0, p.SentAt))
		t.latencies = append(t.latencies, latency)
		fresh = append(fresh, latency)
		if now.After(t.last) { // concurrent deliveries may take the lock out of order
			t.last = now
		}
	}
	t.mu.Unlock()
	for _, l := range fresh {
		t.observed(l)
	}
	return http.StatusNoContent
}

func (t *tracker) count(n *int64) {
	t.mu.Lock()
	*n++
	t.mu.Unlock()
}

// publishedN records n events acknowledged by the node.
func (t *tracker) publishedN(n int) {
	t.mu.Lock()
	t.published += int64(n)
	t.mu.Unlock()
}

// lag is the events published but not yet delivered. A delivery can arrive before its publish
// call's answer, so it is never below zero.
func (t *tracker) lag() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return max(t.published-int64(len(t.delivered)), 0)
}

// tally is a copy of the tracker's counts.
type tally struct {
	Published, Delivered, Duplicates, BadSignature, Stale, Malformed, OutOfOrder int64
	Latencies                                                                    []time.Duration
	Last                                                                         time.Time // the latest first delivery's arrival
}

// deliveredSoFar is how many events were delivered so far.
func (t *tracker) deliveredSoFar() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int64(len(t.delivered))
}

func (t *tracker) tally() tally {
	t.mu.Lock()
	defer t.mu.Unlock()
	return tally{Published: t.published, Delivered: int64(len(t.delivered)), Duplicates: t.duplicates,
		BadSignature: t.badSig, Stale: t.stale, Malformed: t.malformed, OutOfOrder: t.outOfOrder,
		Latencies: append([]time.Duration(nil), t.latencies...), Last: t.last}
}

// ServeHTTP is the receiver: POST only, the body read whole (bounded) before verification.
func (t *tracker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		t.count(&t.malformed)
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		return
	}
	w.WriteHeader(t.receive(r.Header, body))
}
