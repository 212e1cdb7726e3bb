package intake

import (
	"context"
	"crypto/sha256"
	"errors"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/kernel/jsonwire"
	"carehub/schemas/kafka/observation"
)

// validate checks entries, looks up their patients in one query, and returns the records of
// the valid ones with their ids; the invalid ones are added to rq.rejected.
func (rq *request) validate(entries []entry) ([]*kgo.Record, []string, error) {
	msgs := make([]parsed, 0, len(entries))
	indexes := make([]int, 0, len(entries))
	patientIDs := make([]string, 0, 8)
	seen := map[string]bool{}
	for _, e := range entries {
		if e.err != nil {
			rq.reject(e.index, e.err)
			continue
		}
		p, ee := parseEntry(e.raw, rq.lim)
		if ee != nil {
			rq.reject(e.index, ee)
			continue
		}
		msgs = append(msgs, p)
		indexes = append(indexes, e.index)
		if id := p.msg.PatientID; !seen[id] {
			seen[id] = true
			patientIDs = append(patientIDs, id)
		}
	}
	if len(msgs) == 0 {
		return nil, nil, nil
	}
	found, err := rq.in.patients.lookup(rq.ctx, patientIDs)
	if err != nil {
		return nil, nil, fault.Wrap(fault.KindUnavailable, err, "patient lookup failed; nothing was accepted, retry later")
	}
	recs := make([]*kgo.Record, 0, len(msgs))
	accepted := make([]string, 0, len(msgs))
	b := rq.newRecords(msgs)
	for i := range msgs {
		m := &msgs[i].msg
		pe := found[m.PatientID]
		if !pe.visibleTo(rq.p) {
			rq.reject(indexes[i], entryErr(CodeUnknownPatient, "patient %q not found", m.PatientID))
			continue
		}
		m.OrgID = pe.orgID
		m.ReceivedAt = rq.received
		m.ID = rq.observationID(m, indexes[i])
		access.Touch(rq.ctx, access.KindPatient, m.PatientID)
		parts, err := partMessages(m, msgs[i].parts)
		if err != nil {
			return nil, nil, err // not reached: the panel was decoded once already
		}
		recs = append(recs, b.add(m))
		for j := range parts {
			recs = append(recs, b.add(&parts[j]))
		}
		accepted = append(accepted, m.ID)
	}
	return recs, accepted, nil
}

// records makes the Kafka records of one validate call from a few allocations, not three for
// each observation: the records are produced in one transaction and released together.
type records struct {
	topic string
	arena []kgo.Record      // never grown past its capacity: recs point into it
	buf   []byte            // every record's value
	keys  map[string][]byte // a patient's key, shared by its records
}

// messageSize is about what a record adds to its observation (AppendJSON).
const messageSize = 384

func (rq *request) newRecords(msgs []parsed) *records {
	size := 0
	for i := range msgs {
		size += len(msgs[i].msg.Observation) + messageSize
	}
	return &records{topic: rq.in.cfg.Topic, arena: make([]kgo.Record, 0, len(msgs)), buf: make([]byte, 0, size),
		keys: make(map[string][]byte)}
}

// add returns the record of m.
func (b *records) add(m *observation.Message) *kgo.Record {
	key, ok := b.keys[m.PatientID]
	if !ok {
		key = []byte(m.PatientID)
		b.keys[m.PatientID] = key
	}
	start := len(b.buf)
	b.buf = m.AppendJSON(b.buf)
	// Capped: what is appended after cannot reach into this record's bytes.
	value := b.buf[start:len(b.buf):len(b.buf)]
	if len(b.arena) == cap(b.arena) { // a panel's parts: more records than observations
		return &kgo.Record{Topic: b.topic, Key: key, Value: value}
	}
	b.arena = append(b.arena, kgo.Record{Topic: b.topic, Key: key, Value: value})
	return &b.arena[len(b.arena)-1]
}

// observationID is the id of an accepted observation. With Observation.id it is
// ClientObservationID; else with an Idempotency-Key it is derived from (organization, key, entry
// index, the observation), so a retry after an unknown outcome repeats the ids while a key reused
// with another body once its answer has expired gets new ones; else new. Both derivations take
// the observation's content because the writer stores an id once: an id shared by two
// different observations would acknowledge the second and store only the first.
func (rq *request) observationID(m *observation.Message, index int) string {
	switch {
	case m.ClientID != "":
		return ClientObservationID(m.OrgID, m.ClientID, m.Observation)
	case rq.key != "":
		return DerivedID(m.OrgID, "key", rq.key+"\x00"+strconv.Itoa(index)+"\x00"+contentDigest(m.Observation))
	}
	return ids.New(ids.Observation)
}

// ClientObservationID is the id of an observation sent with a client id (Observation.id):
// derived from (organization, that id, the observation as sent, whitespace aside). A retry of
// the same observation is the same id and is stored once however often it is sent; another
// observation under an id already used is an observation of its own, stored too.
func ClientObservationID(orgID, clientID string, observation []byte) string {
	return DerivedID(orgID, "id", clientID+"\x00"+contentDigest(observation))
}

// contentDigest is the SHA-256 of a valid JSON value without its insignificant whitespace, so
// the same observation pretty-printed in a file or compact in a Bundle is the same content.
func contentDigest(raw []byte) string {
	sum := sha256.Sum256(jsonwire.AppendCompactValid(make([]byte, 0, len(raw)), raw))
	return string(sum[:])
}

// DerivedID returns obs_ and a ULID made of the first 16 bytes of SHA-256(kind, org, value): a
// stable id for a client-chosen name. Derived ids are not time-ordered.
func DerivedID(orgID, kind, value string) string {
	h := sha256.Sum256([]byte("carehub/observation\x00" + kind + "\x00" + orgID + "\x00" + value))
	var u [16]byte
	copy(u[:], h[:16])
	return ids.Observation + ulidString(u)
}

func (rq *request) produce(recs []*kgo.Record) error {
	if len(recs) == 0 {
		return nil
	}
	if rq.txn == nil {
		t, err := rq.in.producers.Acquire(rq.ctx)
		if err != nil {
			return fault.Wrap(fault.KindUnavailable, err, "no observation producer is free; nothing was accepted, retry later")
		}
		rq.txn = t
	}
	if err := rq.txn.Add(rq.ctx, recs...); err != nil {
		rq.abort()
		return rq.in.unavailable(err)
	}
	return nil
}

func (rq *request) commit() error {
	start := time.Now()
	err := rq.txn.Commit(rq.ctx)
	rq.offsets = rq.txn.Offsets()
	rq.txn = nil
	if err != nil {
		if errors.Is(rq.ctx.Err(), context.Canceled) {
			// The client went away before the commit (a device's timeout, a load test's end):
			// nothing was accepted, and nobody waits for the 503.
			rq.in.logger.Debug("observations not committed to Kafka: the client went away", "err", err)
		} else {
			rq.in.logger.Warn("observations not committed to Kafka; answered 503", "err", err)
		}
		return rq.in.unavailable(err)
	}
	rq.in.m.produce.Observe(time.Since(start).Seconds())
	return nil
}

func (rq *request) abort() {
	if rq.txn != nil {
		rq.txn.Abort()
		rq.txn = nil
	}
}
