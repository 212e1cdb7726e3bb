package graphql

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	gqlerrors "github.com/graph-gophers/graphql-go/errors"

	"carehub/kernel/access"
)

// The answer-size bound. The cost budget (cost.go) counts values, and a scalar costs 1 however
// large it is: sixteen aliases of events(limit: 100) { payload } over 256 KiB payloads cost a
// few thousand units and answered 390 MiB. So an operation also has a budget in bytes
// (Config.MaxResponseBytes), which the resolvers of the large scalars (event payloads, run and
// session input and output, installation config) charge as they fetch or resolve them. The
// first charge past it cancels the operation, so that no further page is fetched, and the
// operation is answered with RESPONSE_TOO_LARGE alone: memory holds at most the budget and the
// page being charged, not the whole answer. The serialized data is checked against the same
// bound at the end, for what no resolver charges (strings, many small values).

// DefaultMaxResponseBytes is the default answer-size budget of one operation.
const DefaultMaxResponseBytes = 16 << 20

// CodeResponseTooLarge is the extensions.code of an operation whose answer would exceed the
// answer-size budget.
const CodeResponseTooLarge = "RESPONSE_TOO_LARGE"

// errResponseTooLarge fails the resolvers that charge past the budget; the operation's answer
// is replaced by tooLarge, so its text never reaches a client.
var errResponseTooLarge = fmt.Errorf("graphql: answer-size budget exceeded")

// answerBudget is one operation's answer-size budget. Resolvers run concurrently; its counter
// is atomic, and fetch lets one page of large values be fetched and charged at a time, so that
// parallel aliases cannot fetch many pages before the first is charged.
type answerBudget struct {
	max    int64
	used   atomic.Int64
	over   atomic.Bool
	cancel context.CancelFunc
	fetch  chan struct{}
}

type answerBudgetKey struct{}

// withAnswerBudget returns ctx with a budget of max bytes, cancelled when the budget is
// exceeded; the caller must call cancel when the operation ends.
func withAnswerBudget(ctx context.Context, max int64) (context.Context, *answerBudget, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	b := &answerBudget{max: max, cancel: cancel, fetch: make(chan struct{}, 1)}
	return context.WithValue(ctx, answerBudgetKey{}, b), b, cancel
}

func budgetOf(ctx context.Context) *answerBudget {
	b, _ := ctx.Value(answerBudgetKey{}).(*answerBudget)
	return b
}

// exceeded reports whether a charge went past the budget.
func (b *answerBudget) exceeded() bool { return b != nil && b.over.Load() }

// charge adds n bytes to ctx's budget; past it, it cancels the operation and fails. Without a
// budget (a subscription's events, each bounded by the event size) it accepts everything.
func charge(ctx context.Context, n int) error {
	b := budgetOf(ctx)
	if b == nil {
		return nil
	}
	if b.used.Add(int64(n)) > b.max {
		b.over.Store(true)
		b.cancel()
		return errResponseTooLarge
	}
	return nil
}

// holdFetch takes ctx's fetch slot until release is called: one page of large values is
// fetched and charged at a time per operation. Without a budget it holds nothing.
func holdFetch(ctx context.Context) (release func(), err error) {
	b := budgetOf(ctx)
	if b == nil {
		return func() {}, nil
	}
	select {
	case b.fetch <- struct{}{}:
		return func() { <-b.fetch }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// encodedSize bounds the bytes raw takes in the answer: graph-gophers writes a scalar with
// encoding/json, which compacts it (never longer) and escapes <, > and & as \u003c (6 bytes for
// 1) and U+2028, U+2029 as \u2028 (6 bytes for 3).
func encodedSize(raw []byte) int {
	n := len(raw)
	n += 5 * (bytes.Count(raw, []byte("<")) + bytes.Count(raw, []byte(">")) + bytes.Count(raw, []byte("&")))
	n += 3 * (bytes.Count(raw, []byte("\u2028")) + bytes.Count(raw, []byte("\u2029")))
	return n
}

// chargedJSON is optJSON for a large JSON field: it charges the value's size to ctx's budget.
func chargedJSON(ctx context.Context, raw json.RawMessage) (*JSON, error) {
	if err := charge(ctx, encodedSize(raw)); err != nil {
		return nil, err
	}
	return optJSON(raw), nil
}

// answerBudget returns ctx with the answer-size budget of one query or mutation. A caller
// whose API key is in debt with its answer rate (byterate.go) is refused at once (refused is the
// answer), before anything is fetched: a key in a loop gets its rate on average, and never more
// than one budget's worth ahead of it.
func (h *Handler) answerBudget(ctx context.Context) (_ context.Context, _ *answerBudget, cancel context.CancelFunc, refused *Response) {
	if avail, retry := h.answerRate.available(rateKey(ctx)); avail == 0 {
		return ctx, nil, nil, rateLimited(retry)
	}
	ctx, b, cancel := withAnswerBudget(ctx, h.maxResponse)
	return ctx, b, cancel, nil
}

// settle charges what an operation fetched to its key's answer rate (no more than the budget:
// the page that went past it was dropped).
func (h *Handler) settle(ctx context.Context, b *answerBudget) {
	h.answerRate.spend(rateKey(ctx), min(b.used.Load(), b.max))
}

// rateKey is the API key an operation's bytes are charged to (a JWT's parent key).
func rateKey(ctx context.Context) string {
	if p := access.From(ctx); p != nil {
		return p.KeyID
	}
	return ""
}

// rateLimited answers an operation whose key has fetched its answer rate's worth of large
// values: RATE_LIMITED, with when to try again.
func rateLimited(retry time.Duration) *Response {
	secs := max(1, int(math.Ceil(retry.Seconds())))
	e := queryError(CodeRateLimited, "this API key has fetched its rate of large values (payload, input, output, config) for now: retry after %d s, select fewer of them, or use the exports for bulk reads", secs)
	e.Extensions["retryAfter"] = secs
	return &Response{Errors: []*gqlerrors.QueryError{e}, Data: json.RawMessage("null")}
}

// tooLarge is the whole answer to an operation over the answer-size budget: data null and one
// error naming the budget, whatever else failed on the way (the cancellation's errors).
func tooLarge(max int64) *Response {
	e := queryError(CodeResponseTooLarge, "the answer would exceed %d bytes, the answer-size budget of one operation: select fewer large fields (payload, input, output, config), lower the limit arguments, or split it into several requests", max)
	e.Extensions["maxResponseBytes"] = max
	return &Response{Errors: []*gqlerrors.QueryError{e}, Data: json.RawMessage("null")}
}
