package intake

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"

	"carehub/storage/kafka"
)

// Backpressure by time: intake admits a request while the records waiting to be stored (the
// writers' lag as last measured, plus what intake accepted since, less what the writers stored
// meanwhile at their measured rate, plus the requests in progress) stay under a limit, and holds a
// request up to maxHold (longHold while few are in progress) for room or refuses it (503,
// Retry-After). The limit is learnt from the latency itself: every measurement intake finds the
// oldest record it accepted that the writers have not yet committed (or just committed), and scales
// the limit by √(target ÷ that record's age) (Little's law: the wait is the queue over the rate, so
// a queue that makes records wait twice the target is too long; the root damps the answer, which
// comes a poll cycle late). So the overheads the rate alone does not see (the writers' poll cycle,
// the CPU they share with intake) are part of what the limit is fitted to.
const (
	// busyLag is the backlog (offsets) over which the writers are taken to be busy: an interval
	// that starts with more measures what they can store, not what arrives. Below it the backlog
	// is nothing to refuse for (each transaction leaves a control record per partition: a few
	// records of lag are noise).
	busyLag = 64
	// initialRate is the store rate assumed until one is measured (records/s): about what one
	// writer stores on a small machine; the limit starts at what it stores in targetShare of
	// the budget, so a cold writer is not handed a flood, and grows from there.
	initialRate = 10_000
	// rateWindow is how many busy intervals the store rate is measured over: writers commit a
	// poll at a time, so one interval often sees no commit and the next two polls' worth.
	rateWindow = 8
	// maxHold is the longest a request waits for room rather than being refused: a device
	// sent away waits a whole second (Retry-After counts seconds), so a short wait for room
	// keeps intake busy, and it is part of the request's accept → stored time.
	maxHold = 250 * time.Millisecond
	// longHold is the longest wait while few requests are in progress (their records at most
	// longHoldShare of the limit): a device sent away waits a second at least (Retry-After counts
	// seconds), so when only a few devices send, refusing them all at once would leave the
	// writers idle until they came back.
	longHold, longHoldShare = time.Second, 0.25
	// targetShare of the budget is what the oldest waiting record's age is steered to: its
	// age when measured is short of its wait by up to a writer's poll cycle.
	targetShare = 0.6
	// Bounds of one adaptation of the limit: it falls fast when records wait too long and grows
	// by a quarter per measurement at most.
	maxShrink, maxGrowth = 0.5, 1.25
	// minLimit is the smallest limit (records): a writer that stores nothing still lets one
	// small request in now and then, which keeps the age measurable.
	minLimit = 100
	// Retry-After of a refusal is the predicted wait, at least a second (the header counts
	// seconds) and at most twice the budget: the wait is predicted from a rate that lags a
	// writer starting or speeding up, the queue a refusal finds turns over within about the
	// budget while the writers store, and a device sent away for longer leaves intake idle.
	budgetsPerRetry = 2
)

// mark is the last offset a request committed on a partition and when the request arrived.
type mark struct {
	offset   int64
	received time.Time
}

// admission measures the observation writer group's lag and store rate every interval, and
// decides per request whether what intake accepts would be stored within the latency budget.
// Requests read cached values; they never wait for a measurement. Every method takes the
// current time, so that tests drive it with a clock of their own.
//
// The store rate is the advance of the group's committed offsets per second, averaged over the
// intervals that began with a backlog of this intake's records (busyLag): then it is what the
// writers can do, not what clients send. A stopped writer's rate falls towards zero, its
// records age, and the limit falls to minLimit.
//
// A measurement that fails keeps the last values; when no measurement has succeeded for
// staleAfter, intake stops refusing (fails open): a broken lag query must not stop ingest
// while the broker itself accepts records, and a broken broker fails produce anyway.
type admission struct {
	budget     time.Duration // <= 0: only the lag is measured (MaxLag), nothing refused by time
	staleAfter time.Duration

	mu        sync.Mutex
	measured  time.Time // of the last successful measurement; zero: none yet
	lag       int64     // at measured
	committed int64     // sum of the committed offsets at measured
	rate      float64   // records/s the writers store, over the busy intervals of window
	window    []busyInterval
	since     int64   // records accepted after the measurement at measured began
	reserved  float64 // records of admitted requests still in progress (estimated)
	request   float64 // records per accepted request, moving average
	limit     float64 // records that may wait to be stored
	age       time.Duration
	pending   map[int32][]mark // this intake's committed records not yet known stored, by partition
	backlog   int64            // offsets the writers had to pass at measured to store pending
}

func newAdmission(budget, staleAfter time.Duration) *admission {
	return &admission{budget: budget, staleAfter: staleAfter, rate: initialRate, request: minLimit,
		limit: max(targetShare*initialRate*budget.Seconds(), minLimit), pending: map[int32][]mark{}}
}

// busyInterval is one measurement interval that began with a backlog.
type busyInterval struct {
	seconds float64
	stored  int64
}

// ticket is an admitted request's reservation, returned to done.
type ticket struct{ reserved float64 }

// admit decides whether a request arriving at now may be accepted. Admitted, the request waits the
// returned duration (at most maxHold, or longHold while few requests are in progress) for its room
// before it goes on; refused, the duration is how long until there could be room (math.MaxInt64:
// unknown, the writers store nothing). Room is reserved at once, so requests held together are let
// in one after the other.
func (a *admission) admit(now time.Time) (ticket, time.Duration, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	wait := a.waitLocked(now)
	if wait > maxHold && (wait > longHold || a.reserved+a.request > longHoldShare*a.limit) {
		return ticket{}, wait, false
	}
	a.reserved += a.request
	return ticket{reserved: a.request}, wait, true
}

// wait is how long a request arriving at now would wait for the queue to fit the limit: 0
// when it is admitted.
func (a *admission) wait(now time.Time) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.waitLocked(now)
}

func (a *admission) waitLocked(now time.Time) time.Duration {
	q := a.queueLocked(now)
	if a.budget <= 0 || !a.freshLocked(now) || q == 0 || q+a.request <= a.limit {
		return 0
	}
	secs := (q + a.request - a.limit) / a.rate
	if a.rate < 1 || secs > math.MaxInt64/float64(time.Second) {
		return time.Duration(math.MaxInt64)
	}
	return max(time.Duration(secs*float64(time.Second)), 1)
}

// done ends an admitted request: accepted records were committed to Kafka, their last offsets
// by partition in offsets (nil when none were).
func (a *admission) done(t ticket, received time.Time, accepted int, offsets map[int32]int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reserved = max(a.reserved-t.reserved, 0)
	if accepted == 0 || len(offsets) == 0 { // nothing committed (a replayed answer commits nothing)
		return
	}
	a.since += int64(accepted)
	a.request += 0.1 * (float64(accepted) - a.request)
	for p, o := range offsets {
		a.pending[p] = append(a.pending[p], mark{offset: o, received: received})
	}
}

// queueLocked is the predicted number of records waiting at now: the lag as measured, plus
// what was accepted since, less what the writers stored since at their rate, plus what the
// requests in progress will add.
func (a *admission) queueLocked(now time.Time) float64 {
	stored := a.rate * max(now.Sub(a.measured).Seconds(), 0)
	return max(float64(a.lag+a.since)-stored, 0) + a.reserved
}

// begin is called as a measurement starts; observe is given its result.
func (a *admission) begin() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.since
}

// observe records a measurement taken at now: the lag of every partition; since is what
// begin returned (records accepted before the measurement began are in its lag).
func (a *admission) observe(now time.Time, lags []kafka.PartitionLag, since int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	lag, committed, backlog := kafka.TotalLag(lags), int64(0), int64(0)
	var done time.Duration
	for _, p := range lags {
		c := max(p.Committed, p.Start, 0)
		committed += c
		marks := a.pending[p.Partition]
		i := 0
		for i < len(marks) && marks[i].offset < c {
			i++
		}
		if i > 0 { // stored since the last measurement: waited at most until now
			done = max(done, now.Sub(marks[i-1].received))
		}
		if marks = marks[i:]; len(marks) > 0 {
			backlog += marks[len(marks)-1].offset + 1 - c
		}
		a.pending[p.Partition] = marks
	}
	if !a.measured.IsZero() {
		// Busy: a backlog before this intake's last committed records, which the writers must
		// pass to store them. Not the group's lag: records no writer will ever commit past sit
		// after them (a transaction aborted at a partition's tail, a device gone mid-request,
		// stays in the high watermark until records follow it, and an open transaction is in
		// it too). Counted as busy, its intervals would store nothing, or the one record a
		// writer was committing, and the rate would fall to nearly zero and every request be
		// refused, so that nothing ever followed.
		if dt := now.Sub(a.measured).Seconds(); dt > 0 && a.backlog > busyLag {
			a.window = append(a.window, busyInterval{seconds: dt, stored: max(committed-a.committed, 0)})
			if len(a.window) > rateWindow {
				a.window = a.window[1:]
			}
			var secs float64
			var stored int64
			for _, b := range a.window {
				secs, stored = secs+b.seconds, stored+b.stored
			}
			a.rate = float64(stored) / secs
		}
	}
	a.age = done
	for _, marks := range a.pending {
		if len(marks) > 0 {
			a.age = max(a.age, now.Sub(marks[0].received))
		}
	}
	a.lag, a.committed, a.backlog, a.measured = lag, committed, backlog, now
	a.since = max(a.since-since, 0)
	if a.budget > 0 {
		a.adaptLocked()
	}
}

// adaptLocked scales the limit by the square root of target ÷ the oldest waiting record's age
// (damped: the age answers a change a poll cycle late): down whenever records wait longer than
// the target, up otherwise, by at most a quarter per measurement and never past what the
// writers store in twice the budget. It grows while nothing waits too: a limit that shrank
// while the writers stalled (a rebalance, a group joining) must not keep turning devices away
// once they store again.
func (a *admission) adaptLocked() {
	target := float64(a.budget) * targetShare
	age := float64(a.age)
	switch {
	case age > target:
		a.limit *= max(math.Sqrt(target/age), maxShrink)
	default:
		a.limit *= min(math.Sqrt(target/max(age, 1)), maxGrowth)
	}
	// The limit never passes what the writers store in twice the budget: a queue longer than
	// that cannot be stored in time whatever the ages said.
	a.limit = min(max(a.limit, minLimit), max(2*a.rate*a.budget.Seconds(), minLimit))
}

// current returns the lag as last measured and whether it is fresh enough to act on.
func (a *admission) current(now time.Time) (int64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lag, a.freshLocked(now)
}

func (a *admission) freshLocked(now time.Time) bool {
	return !a.measured.IsZero() && now.Sub(a.measured) <= a.staleAfter
}

// state is a snapshot for logs and tests.
type admissionState struct {
	Queue, Limit, Rate float64
	Age                time.Duration
}

func (a *admission) state(now time.Time) admissionState {
	a.mu.Lock()
	defer a.mu.Unlock()
	return admissionState{Queue: a.queueLocked(now), Limit: a.limit, Rate: a.rate, Age: a.age}
}

// lagWatch measures the writer group's lag every interval for an admission.
type lagWatch struct {
	adm      *kadm.Client
	group    string
	topic    string
	interval time.Duration
	logger   *slog.Logger
	gauge    prometheus.Gauge
	a        *admission
}

func (l *lagWatch) run(ctx context.Context) {
	tick := time.NewTicker(l.interval)
	defer tick.Stop()
	failing := false
	for {
		since := l.a.begin()
		mctx, cancel := context.WithTimeout(ctx, max(l.interval*4, 2*time.Second))
		lags, err := kafka.Lag(mctx, l.adm, l.group, l.topic)
		cancel()
		switch {
		case err == nil:
			l.a.observe(time.Now(), lags, since)
			n := kafka.TotalLag(lags)
			l.gauge.Set(float64(n))
			if failing {
				l.logger.Info("observation writer lag measurable again", "lag", n)
				failing = false
			}
		case ctx.Err() == nil && !failing:
			l.logger.Warn("cannot measure observation writer lag; backpressure uses the last value", "err", err)
			failing = true
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// seconds formats a wait for an error message.
func seconds(d time.Duration) string {
	if d <= 0 || d == time.Duration(math.MaxInt64) {
		return "an unknown time (the writers store nothing now)"
	}
	return d.Round(100 * time.Millisecond).String()
}
