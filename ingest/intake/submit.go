package intake

import (
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"sort"
	"time"

	"carehub/kernel/access"
	"carehub/kernel/fault"
	"carehub/storage/idempotency"
	"carehub/storage/kafka/publish"
)

// Answer is the body of a 202, and the details of a 422: how many observations were accepted,
// why the others were not, and the ids of the accepted ones in request order.
type Answer struct {
	Accepted int          `json:"accepted"`
	Rejected []EntryError `json:"rejected"`
	IDs      []string     `json:"ids"`
}

// Submission is one POST /v1/observations.
type Submission struct {
	ContentType    string    // selects the format; see MediaFHIRJSON, MediaFHIRNDJSON
	Body           io.Reader // read at most MaxBodyBytes; never buffered whole when NDJSON
	IdempotencyKey string    // optional
}

// Result is what Submit answers besides errors.
type Result struct {
	Answer Answer // the 202 body
	// Replayed says the answer (or the error) is that of an earlier request with the same
	// Idempotency-Key and body.
	Replayed bool
}

// Submit validates the observations of s and commits the valid ones to Kafka in one
// transaction. It returns only after the broker has acknowledged them (the 202 answer), or an
// error of package fault, and then nothing of the request will ever be stored:
//
//   - KindValidation (422) when nothing is valid, or a transaction Bundle has an invalid entry;
//     its Details carry the Answer fields (accepted 0, rejected, ids []);
//   - KindTooLarge (413) over MaxBodyBytes or MaxEntries; KindUnsupportedMedia (415);
//   - KindInvalid (400) for a body that is not JSON, or a malformed Idempotency-Key;
//   - KindConflict (409) for an Idempotency-Key in use by a running request or used with
//     another body;
//   - KindUnavailable (503; answer with Retry-After: RetryAfter) when the writers are past the
//     lag bound, or Kafka or Postgres fail.
//
// With Result.Replayed the result and the error are those of the first request with the key.
// Submit needs write:observations.
func (in *Intake) Submit(ctx context.Context, s Submission) (res Result, err error) {
	var offsets map[int32]int64 // of the request's transaction: its last offset per partition
	received := time.Now()
	ctx, cancel := context.WithTimeout(ctx, in.cfg.RequestTimeout)
	defer cancel()
	format := "unknown"
	defer func() { in.m.requests.WithLabelValues(format, outcome(res, err)).Inc() }()

	p, err := access.Require(ctx, access.WriteObservations)
	if err != nil {
		return Result{}, err
	}
	if lag, fresh := in.Lag(); fresh && in.cfg.MaxLag > 0 && lag > in.cfg.MaxLag {
		in.m.throttled.Inc()
		return Result{}, fault.Unavailable("observation ingest is behind: %d observations wait to be stored; retry later", lag)
	}
	if in.adm != nil {
		tk, wait, ok := in.adm.admit(received)
		if !ok {
			in.m.throttled.Inc()
			return Result{}, fault.Unavailable("observation ingest is behind: more is waiting to be stored than fits its %s budget; room in about %s; retry later",
				in.cfg.LatencyBudget, seconds(wait))
		}
		defer func() { in.adm.done(tk, received, res.Answer.Accepted, offsets) }()
		if wait > 0 {
			hold := time.NewTimer(wait)
			select {
			case <-hold.C:
			case <-ctx.Done():
				hold.Stop()
				return Result{}, fault.Unavailable("observation ingest is behind: the request ended while it waited for room; retry later")
			}
		}
	}
	media, ndjson, err := mediaKind(s.ContentType)
	if err != nil {
		return Result{}, err
	}
	body := io.Reader(&limitReader{r: s.Body, left: in.cfg.MaxBodyBytes})

	key := s.IdempotencyKey
	// With an Idempotency-Key, the body's hash tells a retry from another request under the
	// same key; without one nothing reads it (hashing every body was 2 % of the CPU of
	// loadtest -self).
	var digest hash.Hash
	var claim *idempotency.Claim
	if key != "" {
		if !idempotency.ValidKey(key) {
			return Result{}, fault.Invalid("Idempotency-Key must be 1 to %d visible ASCII characters", idempotency.MaxKeyLength)
		}
		digest = sha256.New()
		digest.Write([]byte(requestPrefix(media)))
		body = io.TeeReader(body, digest)
		var prior *idempotency.Prior
		claim, prior, err = in.keys.Reserve(ctx, idempotency.ScopeOf(p), key)
		switch {
		case fault.KindOf(err) == fault.KindConflict:
			return Result{}, err
		case err != nil:
			return Result{}, fault.Wrap(fault.KindUnavailable, err, "idempotency keys are unavailable; retry later")
		case prior != nil:
			if _, err := io.Copy(io.Discard, body); err != nil {
				return Result{}, readError(err)
			}
			a, err := prior.Answer(digest.Sum(nil))
			if err != nil {
				return Result{}, err
			}
			in.m.replayed.Inc()
			res, err := replay(a)
			res.Replayed = true
			return res, err
		}
	}

	rq := &request{in: in, ctx: ctx, p: p, key: key, lim: limits{now: received, maxFuture: in.cfg.MaxFuture}, received: received}
	var accepted []string
	if ndjson {
		format = "ndjson"
		accepted, err = rq.ndjson(body)
	} else {
		format, accepted, err = rq.json(body)
	}
	offsets = rq.offsets
	sort.SliceStable(rq.rejected, func(i, j int) bool { return rq.rejected[i].Index < rq.rejected[j].Index })
	for _, e := range rq.rejected {
		in.m.rejected.WithLabelValues(e.Code).Inc()
	}
	in.m.requestSize.Observe(float64(rq.entries))
	switch {
	case err != nil:
	case len(accepted) == 0:
		msg := "no observation in the request is valid; nothing was accepted"
		if rq.entries == 0 {
			msg = "the request holds no observation"
		}
		err = rq.invalid(msg)
	default:
		in.m.accepted.Add(float64(len(accepted)))
		res.Answer = Answer{Accepted: len(accepted), Rejected: nonNil(rq.rejected), IDs: accepted}
	}
	if claim != nil {
		// The answer is recorded whatever happened to the request's context.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		var kerr error
		if a, ok := storable(res, err); ok {
			kerr = claim.CompleteFor(rctx, digest.Sum(nil), a)
		} else {
			kerr = claim.Release(rctx)
		}
		cancel()
		if kerr != nil {
			in.logger.Error("idempotency key not recorded", "err", kerr)
		}
	}
	return res, err
}

// outcome labels a Submit for carehub_ingest_requests_total.
func outcome(res Result, err error) string {
	if res.Replayed {
		return "replayed"
	}
	if err == nil {
		return "accepted"
	}
	switch fault.KindOf(err) {
	case fault.KindValidation:
		return "invalid"
	case fault.KindTooLarge:
		return "too_large"
	case fault.KindUnsupportedMedia:
		return "unsupported_media"
	case fault.KindInvalid:
		return "bad_request"
	case fault.KindConflict:
		return "conflict"
	case fault.KindUnavailable:
		return "unavailable"
	case fault.KindUnauthenticated, fault.KindInsufficientScope, fault.KindForbidden:
		return "denied"
	}
	return "error"
}

// request is the state of one POST /v1/observations.
type request struct {
	in       *Intake
	ctx      context.Context
	p        *access.Principal
	key      string
	lim      limits
	received time.Time

	offsets  map[int32]int64 // of the committed transaction: its last offset per partition
	entries  int             // entries seen, valid or not
	rejected []EntryError    // in the order found; sorted by index before answering
	txn      *publish.Txn    // begun at the first valid record
}

func (rq *request) reject(index int, e *EntryError) {
	rq.rejected = append(rq.rejected, EntryError{Index: index, Code: e.Code, Message: e.Message})
}

// invalid is the 422 of a request of which nothing was accepted, with the answer as details.
func (rq *request) invalid(message string) error {
	sort.SliceStable(rq.rejected, func(i, j int) bool { return rq.rejected[i].Index < rq.rejected[j].Index })
	return &fault.Error{Kind: fault.KindValidation, Message: message,
		Details: map[string]any{"accepted": 0, "rejected": nonNil(rq.rejected), "ids": []string{}}}
}

// unavailable is the 503 of observations Kafka did not take. It names Kafka, not the audit log
// or "the observation stream", since the device's operator has to know which system is down.
func (in *Intake) unavailable(err error) error {
	wait := (in.RetryAfter() + time.Second - 1) / time.Second
	if in.cfg.Refusing != nil {
		if why := in.cfg.Refusing(); why != nil {
			return fault.Wrap(fault.KindUnavailable, err, fmt.Sprintf("observation intake is unavailable: %s; nothing was accepted, retry after %d s", why, wait))
		}
	}
	return fault.Wrap(fault.KindUnavailable, err, fmt.Sprintf("observation intake is unavailable: "+
		"the Kafka broker cannot be reached or did not acknowledge the observations; nothing was accepted, retry after %d s", wait))
}

func tooManyEntries(n int) error {
	return &fault.Error{Kind: fault.KindTooLarge, Message: fmt.Sprintf("a request may hold at most %d observations; nothing was accepted", n),
		Details: map[string]any{"maxEntries": n}}
}

func nonNil(e []EntryError) []EntryError {
	if e == nil {
		return []EntryError{}
	}
	return e
}
