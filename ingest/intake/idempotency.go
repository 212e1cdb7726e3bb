package intake

import (
	"encoding/json"
	"fmt"

	"carehub/kernel/fault"
	"carehub/storage/idempotency"
)

// Idempotency-Key handling (DECISIONS §3) is storage/idempotency's, as for every other POST: the
// same key with the same body replays the first answer for 24 h; the same key with another body,
// another route, or while the first request is still running, is 409 CONFLICT. Keys belong to
// the credential, and a replay only to a credential with the same grant (scopes and mode).
//
// The key is reserved before the body is read (Store.Reserve: the body is streamed, so its hash
// is known only at the end), completed with the hash and the answer when the request ends with
// 202 or 422, and released when it ends otherwise (413, 415, 503…), so that a retry runs again.

// requestPrefix starts the hash of an observation request: its route, so that a key used on
// another route is another request, and its media type.
func requestPrefix(media string) string { return "POST /v1/observations\n" + media + "\n" }

// recorded is how an answer is kept for replay: the 202 answer, or the 422's message and
// details.
type recorded struct {
	Answer  *Answer                    `json:"answer,omitempty"`
	Message string                     `json:"message,omitempty"`
	Details map[string]json.RawMessage `json:"details,omitempty"`
}

// storable returns what to keep of a finished request: 202 and 422 are answers to the body and
// are replayed; anything else (413, 503…) is released so that a retry runs again.
func storable(res Result, err error) (idempotency.Answer, bool) {
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
				return idempotency.Answer{}, false
			}
			rec.Details[k] = b
		}
	default:
		return idempotency.Answer{}, false
	}
	body, jerr := json.Marshal(rec)
	if jerr != nil {
		return idempotency.Answer{}, false
	}
	return idempotency.Answer{Status: status, Body: body}, true
}

// replay rebuilds the answer of a completed request, with the types Submit returns.
func replay(a *idempotency.Answer) (Result, error) {
	var rec recorded
	if err := json.Unmarshal(a.Body, &rec); err != nil {
		return Result{}, fmt.Errorf("replay idempotency key: %w", err)
	}
	if a.Status == 202 && rec.Answer != nil {
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
