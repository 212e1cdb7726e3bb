package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"carehub/kernel/ids"
	"carehub/kernel/whsig"
)

// maxBody bounds a notification's body.
const maxBody = 4 << 20

// secretWait is how long a notification to a subscription whose create answer has not come back
// yet (so whose secret is not known yet) waits for it: the handshake may race the answer.
const secretWait = 5 * time.Second

// obs is one observation the run posted: when its POST was answered 202, which subscription
// should name it, and when (and how often) a notification did.
type obs struct {
	sub      int32
	phase    int8      // 0 not yet accepted (notified first), 1 phase A, 2 phase B
	accepted time.Time // the 202's receipt
	notified time.Time // the first notification naming it
	event    time.Time // its notification-event's timestamp (the platform event's creation)
	times    int32     // notifications naming it
	by       int32     // the subscription the first notification went to
}

// sub is the receiver's view of one subscription.
type sub struct {
	ready      chan struct{} // closed once secret is set
	secret     string
	handshakes int
	heartbeats int
	posts      int   // event notifications
	events     int64 // notification events received (duplicates included)
	last       int64 // the highest event number received
	numbers    map[int64]struct{}
	focus      map[string]struct{}
	dupNumber  int64
	dupFocus   int64
	outOfOrder int64 // event numbers received after a higher one (not duplicates)
}

// tracker is the rest-hook receiver: it verifies each notification's signature under its
// subscription's secret (whsig.Verify), reads its SubscriptionStatus and matches each
// notification event's focus to the observation the run posted. It is safe for concurrent use.
type tracker struct {
	observed func(n int, latency time.Duration) // each first notification of an accepted observation

	mu        sync.Mutex
	subs      []*sub
	obs       map[string]*obs // by observation id (carehub form, obs_…)
	badSig    int64
	stale     int64
	malformed int64
	unknown   int64 // focus naming an observation the run did not post
	notified  int64 // observations notified (first time), by the counters below per phase
	byPhase   [3]int64
	pending   int64 // accepted, not yet notified
}

func newTracker(subs int, observed func(int, time.Duration)) *tracker {
	t := &tracker{observed: observed, subs: make([]*sub, subs), obs: make(map[string]*obs, 1<<16)}
	for i := range t.subs {
		t.subs[i] = &sub{ready: make(chan struct{}), numbers: map[int64]struct{}{}, focus: map[string]struct{}{}}
	}
	return t
}

// setSecret records subscription i's signing secret (from its create answer).
func (t *tracker) setSecret(i int, secret string) {
	t.mu.Lock()
	s := t.subs[i]
	s.secret = secret
	t.mu.Unlock()
	close(s.ready)
}

// accepted records the ids of a 202 in phase, each for subscription subOf[k].
func (t *tracker) accepted(phase int8, at time.Time, idList []string, subOf []int32) {
	var late []time.Duration
	t.mu.Lock()
	for k, id := range idList {
		id = ids.FromFHIR(id)
		o := t.obs[id]
		if o == nil {
			o = &obs{}
			t.obs[id] = o
		}
		o.sub, o.phase, o.accepted = subOf[k], phase, at
		if o.notified.IsZero() {
			t.pending++
		} else { // the notification came before the 202 was read
			t.unknown--
			t.notified++
			t.byPhase[phase]++
			late = append(late, max(o.notified.Sub(at), 0))
		}
	}
	t.mu.Unlock()
	for _, d := range late {
		t.observed(1, d)
	}
}

// lag is the observations accepted and not yet notified.
func (t *tracker) lag() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pending
}

// notifiedIn is how many observations of phase have been notified.
func (t *tracker) notifiedIn(phase int8) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byPhase[phase]
}

// status is what the receiver reads of a notification Bundle: entry[0], the SubscriptionStatus
// Parameters.
type status struct {
	ResourceType string `json:"resourceType"`
	Type         string `json:"type"`
	Entry        []struct {
		Resource struct {
			ResourceType string `json:"resourceType"`
			Parameter    []struct {
				Name      string `json:"name"`
				ValueCode string `json:"valueCode"`
				Part      []struct {
					Name           string `json:"name"`
					ValueString    string `json:"valueString"`
					ValueInstant   string `json:"valueInstant"`
					ValueReference struct {
						Reference string `json:"reference"`
					} `json:"valueReference"`
				} `json:"part"`
			} `json:"parameter"`
		} `json:"resource"`
	} `json:"entry"`
}

// event is one notification-event of a notification.
type event struct {
	number int64
	at     time.Time
	focus  string // observation id, carehub form
}

// ServeHTTP receives a notification for subscription /s/{i}.
func (t *tracker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	i, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/s/"))
	if err != nil || i < 0 || i >= len(t.subs) {
		t.count(&t.malformed)
		w.WriteHeader(http.StatusNotFound)
		return
	}
	s := t.subs[i]
	select {
	case <-s.ready:
	case <-time.After(secretWait):
	case <-r.Context().Done():
		return
	}
	t.mu.Lock()
	secret := s.secret
	t.mu.Unlock()
	id, ts := r.Header.Get(whsig.HeaderID), r.Header.Get(whsig.HeaderTimestamp)
	if secret == "" || !whsig.Verify(secret, id, ts, body, r.Header.Get(whsig.HeaderSignature)) {
		t.count(&t.badSig)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if unix, _ := strconv.ParseInt(ts, 10, 64); now.Sub(time.Unix(unix, 0)).Abs() > 5*time.Minute {
		t.count(&t.stale)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	typ, evs, ok := parseNotification(body)
	if !ok {
		t.count(&t.malformed)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	t.receive(i, now, typ, evs)
	w.WriteHeader(http.StatusOK)
}

// parseNotification reads a notification Bundle's type and events.
func parseNotification(body []byte) (typ string, evs []event, ok bool) {
	var b status
	if json.Unmarshal(body, &b) != nil || b.ResourceType != "Bundle" || b.Type != "history" || len(b.Entry) == 0 ||
		b.Entry[0].Resource.ResourceType != "Parameters" {
		return "", nil, false
	}
	for _, p := range b.Entry[0].Resource.Parameter {
		switch p.Name {
		case "type":
			typ = p.ValueCode
		case "notification-event":
			var ev event
			for _, part := range p.Part {
				switch part.Name {
				case "event-number":
					ev.number, _ = strconv.ParseInt(part.ValueString, 10, 64)
				case "timestamp":
					ev.at, _ = time.Parse(time.RFC3339Nano, part.ValueInstant)
				case "focus":
					ref := part.ValueReference.Reference
					ev.focus = ids.FromFHIR(ref[strings.LastIndexByte(ref, '/')+1:])
				}
			}
			if ev.number <= 0 {
				return typ, nil, false
			}
			evs = append(evs, ev)
		}
	}
	return typ, evs, typ != ""
}

// receive books one verified notification of subscription i received at now.
func (t *tracker) receive(i int, now time.Time, typ string, evs []event) {
	var fresh []time.Duration
	t.mu.Lock()
	s := t.subs[i]
	switch typ {
	case "handshake":
		s.handshakes++
	case "heartbeat":
		s.heartbeats++
	default:
		s.posts++
	}
	for _, ev := range evs {
		s.events++
		if _, dup := s.numbers[ev.number]; dup {
			s.dupNumber++
		} else {
			if ev.number < s.last {
				s.outOfOrder++
			}
			s.numbers[ev.number] = struct{}{}
			s.last = max(s.last, ev.number)
		}
		if ev.focus == "" {
			continue
		}
		if _, dup := s.focus[ev.focus]; dup {
			s.dupFocus++
			continue
		}
		s.focus[ev.focus] = struct{}{}
		o := t.obs[ev.focus]
		if o == nil { // not (yet) known: the 202 is still being read, or not ours
			o = &obs{sub: -1}
			t.obs[ev.focus] = o
			t.unknown++
		}
		o.times++
		if o.times > 1 {
			continue
		}
		o.notified, o.event, o.by = now, ev.at, int32(i)
		if o.phase != 0 {
			t.pending--
			t.notified++
			t.byPhase[o.phase]++
			fresh = append(fresh, max(now.Sub(o.accepted), 0))
		}
	}
	t.mu.Unlock()
	for _, d := range fresh {
		t.observed(1, d)
	}
}

func (t *tracker) count(n *int64) {
	t.mu.Lock()
	*n++
	t.mu.Unlock()
}

// tally is what the receiver counted, for one phase's observations.
type tally struct {
	Sent, Notified, Missing, WrongSub, Repeated      int64
	AcceptToNotified, AcceptToEvent, EventToNotified []time.Duration
	SentAt                                           []time.Time // with AcceptToNotified, for the per-second series
}

// phase tallies the observations of phase.
func (t *tracker) phase(phase int8) tally {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out tally
	for _, o := range t.obs {
		if o.phase != phase {
			continue
		}
		out.Sent++
		if o.notified.IsZero() {
			out.Missing++
			continue
		}
		out.Notified++
		if o.by != o.sub {
			out.WrongSub++
		}
		if o.times > 1 {
			out.Repeated++
		}
		out.AcceptToNotified = append(out.AcceptToNotified, max(o.notified.Sub(o.accepted), 0))
		out.SentAt = append(out.SentAt, o.accepted)
		if !o.event.IsZero() {
			out.AcceptToEvent = append(out.AcceptToEvent, o.event.Sub(o.accepted))
			out.EventToNotified = append(out.EventToNotified, o.notified.Sub(o.event))
		}
	}
	return out
}

// subsTally is what the receiver counted per subscription, summed.
type subsTally struct {
	Handshakes, Heartbeats, Posts, Events      int64
	DupNumbers, DupFocus, OutOfOrder, Gaps     int64
	NoHandshake                                int
	BadSignature, Stale, Malformed, UnknownObs int64
	EventsPerPostMean                          float64
}

func (t *tracker) subsTally() subsTally {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := subsTally{BadSignature: t.badSig, Stale: t.stale, Malformed: t.malformed, UnknownObs: t.unknown}
	for _, s := range t.subs {
		out.Handshakes += int64(s.handshakes)
		out.Heartbeats += int64(s.heartbeats)
		out.Posts += int64(s.posts)
		out.Events += s.events
		out.DupNumbers += s.dupNumber
		out.DupFocus += s.dupFocus
		out.OutOfOrder += s.outOfOrder
		out.Gaps += s.last - int64(len(s.numbers)) // numbers 1..last never received
		if s.handshakes == 0 {
			out.NoHandshake++
		}
	}
	if out.Posts > 0 {
		out.EventsPerPostMean = float64(out.Events) / float64(out.Posts)
	}
	return out
}
