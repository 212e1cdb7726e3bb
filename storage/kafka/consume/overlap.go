package consume

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Begin begins the effect of a poll's records. Overlap calls the next poll's Begin before the
// previous poll's End, from one goroutine, so a Begin sees the effects of the polls before it
// begun, not ended.
type Begin func(ctx context.Context, recs []*kgo.Record) (Effect, error)

// Effect is a poll's effect, begun.
type Effect struct {
	// End waits for the effect to be done and returns nil only when the effect of every record
	// is durable, as a Handler does.
	End func() error
	// Ready, when set, is closed once End would not wait for long; until then Overlap waits for
	// Next and the next poll's records rather than for End. Nil: End is called at once.
	Ready <-chan struct{}
	// Next, when set, is closed once the next poll's effect had best be begun (what is left of
	// this one takes about as long as beginning the next): Overlap polls the next records then,
	// or when Ready is closed. Nil: at once. Polling later rather than at once lets records
	// gather into larger polls.
	Next <-chan struct{}
}

// Overlapped is what Runner.Overlap needs besides the handler.
type Overlapped struct {
	// Begin begins a poll's effect. Required.
	Begin Begin
	// Commit commits a poll's offsets once its effect has ended. Required.
	Commit Committer
	// Rebalancing tells that a rebalance waits for the polls in hand; its Opt must be among the
	// client's options. Required: without it a busy member would hold rebalances off for as
	// long as records keep coming.
	Rebalancing *Rebalancing
}

// Rebalancing is raised by the client when a rebalance waits for the polls in hand
// (kgo.OnPartitionsCallbackBlocked), and lowered by Overlap once it has let it through.
type Rebalancing struct {
	waiting atomic.Bool
	raised  chan struct{} // signalled when raised, for a poll waiting with a poll in hand
}

// Opt is the client option that raises r. Call it once per Rebalancing.
func (r *Rebalancing) Opt() kgo.Opt {
	r.raised = make(chan struct{}, 1)
	return kgo.OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) {
		r.waiting.Store(true)
		select {
		case r.raised <- struct{}{}:
		default:
		}
	})
}

// begun is a poll whose effect was begun and has not ended.
type begun struct {
	recs  []*kgo.Record
	eff   Effect
	start time.Time
}

// ready reports whether b's effect is ready to end.
func (b *begun) ready() bool {
	if b.eff.Ready == nil {
		return true
	}
	select {
	case <-b.eff.Ready:
		return true
	default:
		return false
	}
}

// pollContext is ctx for a poll made while b is in hand: it ends when b's effect is ready to end
// or a rebalance waits, so that b is ended then and not when the next records come.
func pollContext(ctx context.Context, b *begun, rb *Rebalancing) (context.Context, context.CancelFunc) {
	pctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-b.eff.Ready:
		case <-rb.raised:
		case <-pctx.Done():
		}
		cancel()
	}()
	return pctx, cancel
}

// Overlap runs like Run, except that a poll's effect is begun (o.Begin) before the previous
// poll's is ended: a consumer whose effect is mostly waiting (a webhook's attempts) keeps that
// waiting going while it pays what each poll costs besides (a look-up before, the last write and
// the commit after), instead of adding one to the other. At most two polls are in hand: with one
// in hand, the runner polls again once the effect asks for the next (Effect.Next), until the
// effect is ready to end (Effect.Ready) or a rebalance waits; then it ends the poll in hand and
// commits it, and lets rebalances through, before it polls again. Polls are ended and committed
// in the order they were taken.
//
// When a poll's effect cannot be begun or ended, every poll in hand is rewound (the other one's
// effect ended, not committed) and read again through h, wrapped in mw as in Run (Commit and
// DeadLetter among them), one poll at a time, until one succeeds. So the failures are handled
// exactly as Run handles them, and the effects a consumer begins must be idempotent, as a
// Handler's are. Config.Drain applies to the polls in hand when ctx ends: they are ended and
// committed within it, or, without a Drain, ended with ctx and left uncommitted. A poll's
// carehub_consumer_handler_seconds run from its Begin to the end of its End.
func (r *Runner) Overlap(ctx context.Context, o Overlapped, h Handler, mw ...Middleware) error {
	if o.Begin == nil || o.Commit == nil || o.Rebalancing == nil {
		return errors.New("consume: Overlap needs a Begin, a Committer and a Rebalancing")
	}
	if o.Rebalancing.raised == nil {
		return errors.New("consume: Overlap needs its Rebalancing's Opt among the client's options")
	}
	h = r.wrap(h, mw)
	hctx, stop := r.drainContext(ctx)
	defer stop()
	defer r.src.AllowRebalance()
	var held *begun
	defer func() {
		if held != nil {
			_ = r.end(hctx, o, held) // committed only within a Drain: hctx ends with ctx otherwise
		}
	}()
	failures, serial := 0, false
	for ctx.Err() == nil {
		if held != nil && held.eff.Next != nil {
			select {
			case <-held.eff.Next:
			case <-held.eff.Ready:
			case <-o.Rebalancing.raised:
			case <-ctx.Done():
			}
		}
		if held != nil && (held.ready() || o.Rebalancing.waiting.Load()) {
			prev := held
			held = nil
			if err := r.end(hctx, o, prev); err != nil {
				if r.stopped(ctx, err, len(prev.recs)) {
					return nil
				}
				failures, serial = r.retry(ctx, err, prev.recs, failures+1), true
				continue
			}
			failures = 0
			o.Rebalancing.waiting.Store(false)
			r.src.AllowRebalance()
		}
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if held != nil {
			pctx, cancel = pollContext(ctx, held, o.Rebalancing)
		}
		recs, fetchFailed, closed := r.poll(pctx)
		cancel()
		if closed {
			return nil
		}
		switch {
		case len(recs) == 0:
			if held == nil {
				r.src.AllowRebalance()
				if fetchFailed {
					sleep(ctx, idleWait)
				}
			}
			continue
		case ctx.Err() != nil && r.cfg.Drain <= 0:
			continue // stopping: this poll is left uncommitted for the next owner
		case serial: // nothing is in hand after a failure
			if err := h(hctx, recs); err != nil {
				if r.stopped(ctx, err, len(recs)) {
					return nil
				}
				failures = r.retry(ctx, err, recs, failures+1)
				continue
			}
			failures, serial = 0, false
			r.src.AllowRebalance()
			continue
		}
		next := &begun{recs: recs, start: time.Now()}
		var err error
		next.eff, err = o.Begin(hctx, recs)
		if err != nil {
			r.m.observe(next.start, len(recs), err)
		}
		if held != nil { // the poll before comes first
			prev := held
			held = nil
			if perr := r.end(hctx, o, prev); perr != nil {
				if err == nil {
					_ = next.eff.End() // its effect ended, not committed: it is read again after prev
				}
				recs, err = slices.Concat(prev.recs, recs), perr
			}
		}
		if err == nil {
			held = next
			continue
		}
		if r.stopped(ctx, err, len(recs)) {
			return nil
		}
		failures, serial = r.retry(ctx, err, recs, failures+1), true
	}
	return nil
}

// end ends b's effect and, when it ended well, commits its offsets (a failed commit is logged
// and not returned, as Commit does).
func (r *Runner) end(ctx context.Context, o Overlapped, b *begun) error {
	end := func(context.Context, []*kgo.Record) error {
		err := b.eff.End()
		r.m.observe(b.start, len(b.recs), err)
		return err
	}
	return Commit(o.Commit, r.log)(end)(ctx, b.recs)
}
