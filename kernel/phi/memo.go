package phi

import (
	"encoding/json"
	"sync"
	"unsafe"

	"carehub/storage"
)

// The fan-out hands one event to every subscriber it reaches, and each subscriber's stream
// serves it through EventsFor: classifying (and redacting) the same payload once per subscriber
// made one large event to a thousand subscribers a thousand walks of it, the largest cost of
// the fan-out after encoding. eventMemo remembers the last events' classification and redacted
// payload, keyed by the event and the payload's very bytes (their address and length: a stored
// event's payload is never changed), so that each is worked out once per event.

// memoSize is how many events the memo remembers: more than the events in flight to the
// subscribers of one node at once.
const memoSize = 1024

type memoKey struct {
	id   string
	data *byte
	n    int
}

type memoEntry struct {
	subject  Subject
	named    bool
	redacted []byte // RedactPayload's answer, once asked
}

type eventMemo struct {
	mu      sync.Mutex
	entries map[memoKey]*memoEntry
	order   []memoKey // ring of the keys, oldest at next
	next    int
}

var memo = &eventMemo{entries: make(map[memoKey]*memoEntry, memoSize)}

func keyOf(ev storage.Event) memoKey {
	return memoKey{id: ev.ID, data: unsafe.SliceData(ev.Payload), n: len(ev.Payload)}
}

// classify is ClassifyEvent(ev.Type, ev.Payload), worked out once per event. The subject's
// patients are the caller's to keep (a copy).
func (m *eventMemo) classify(ev storage.Event) (Subject, bool) {
	if ev.ID == "" || len(ev.Payload) == 0 {
		return ClassifyEvent(ev.Type, ev.Payload)
	}
	k := keyOf(ev)
	m.mu.Lock()
	e, ok := m.entries[k]
	m.mu.Unlock()
	if !ok {
		s, named := ClassifyEvent(ev.Type, ev.Payload)
		e = &memoEntry{subject: s, named: named}
		m.put(k, e)
	}
	s := e.subject
	s.Patients = append([]string(nil), s.Patients...)
	return s, e.named
}

// redact is RedactPayload(ev.Type, ev.Payload), worked out once per event of the memo.
func (m *eventMemo) redact(ev storage.Event) json.RawMessage {
	if ev.ID == "" || len(ev.Payload) == 0 {
		return RedactPayload(ev.Type, ev.Payload)
	}
	k := keyOf(ev)
	m.mu.Lock()
	e := m.entries[k]
	var out []byte
	if e != nil {
		out = e.redacted
	}
	m.mu.Unlock()
	if out != nil {
		return out[:len(out):len(out)] // shared: an append copies
	}
	out = RedactPayload(ev.Type, ev.Payload)
	if e != nil {
		m.mu.Lock()
		e.redacted = out
		m.mu.Unlock()
	}
	return out[:len(out):len(out)]
}

func (m *eventMemo) put(k memoKey, e *memoEntry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.entries[k]; ok {
		return
	}
	if len(m.order) < memoSize {
		m.order = append(m.order, k)
	} else {
		delete(m.entries, m.order[m.next])
		m.order[m.next] = k
		m.next = (m.next + 1) % memoSize
	}
	m.entries[k] = e
}
