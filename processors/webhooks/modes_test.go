package webhooks

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"carehub/internal/testenv"
	"carehub/kernel/events"
	"carehub/kernel/whsig"
)

// An ordered subscription with batches gets its events in one signed POST per batch, a JSON
// array in the order they were consumed, each element with the webhook-id and body the event has
// alone; a failed batch is sent again before anything after it.
func TestOrderedBatchesKeepOrderAcrossAFailure(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 { // the second batch fails once
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	sub := f.createWith(Options{Ordered: ptr(true), BatchSize: ptr(10)}, rc.URL, "*")
	var evs []events.Event
	for i := range 35 {
		evs = append(evs, f.publish("device.observation_received", map[string]int{"n": i}))
	}
	f.start(func(c *DispatcherConfig) { c.Schedule = []time.Duration{0, 200 * time.Millisecond, time.Second} })
	for _, ev := range evs {
		f.waitDeliveryStatus(sub.ID, ev.ID, DeliverySucceeded)
	}
	var got []string
	var sizes []int
	for i, req := range rc.requests() {
		if !whsig.Verify(sub.Secret, req.id(), req.Header.Get(whsig.HeaderTimestamp), req.Body, req.Header.Get(whsig.HeaderSignature)) {
			t.Errorf("request %d: the signature does not verify", i)
		}
		if !strings.HasPrefix(req.id(), BatchIDPrefix) {
			t.Errorf("request %d: webhook-id %q, want a batch id", i, req.id())
		}
		var batch []struct {
			ID   string          `json:"id"`
			Body json.RawMessage `json:"body"`
		}
		if err := json.Unmarshal(req.Body, &batch); err != nil {
			t.Fatalf("request %d: %v: %s", i, err, req.Body)
		}
		if i == 1 {
			continue // the failed one: its events come again next
		}
		sizes = append(sizes, len(batch))
		for _, e := range batch {
			var body struct{ Event string }
			if json.Unmarshal(e.Body, &body) != nil || body.Event != "device.observation_received" {
				t.Errorf("element %s: body %s", e.ID, e.Body)
			}
			got = append(got, e.ID)
		}
	}
	if !slices.Equal(got, eventIDs(evs)) {
		t.Errorf("received (successful POSTs)\n%v\nwant every event once, in order\n%v", got, eventIDs(evs))
	}
	for _, n := range sizes {
		if n > 10 {
			t.Errorf("batches of %v, want at most 10", sizes)
		}
	}
	// The failed batch comes again first, whole (a batch sent again may carry more events, up to
	// batchSize, when more were recorded meanwhile: receivers deduplicate by each element's id).
	reqs := rc.requests()
	failed, again := elementIDs(t, reqs[1].Body), elementIDs(t, reqs[2].Body)
	if len(again) < len(failed) || !slices.Equal(again[:len(failed)], failed) {
		t.Errorf("after the failed batch %v the next POST carried %v, want it first", failed, again)
	}
}

func elementIDs(t *testing.T, body []byte) []string {
	t.Helper()
	var batch []struct{ ID string }
	if err := json.Unmarshal(body, &batch); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	var out []string
	for _, e := range batch {
		out = append(out, e.ID)
	}
	return out
}

// A rate limit paces a subscription's deliveries; another subscription is not held back by it.
func TestRateLimitPacesOnlyItsSubscription(t *testing.T) {
	f := newFixture(t)
	slow, fast := newReceiver(t, nil), newReceiver(t, nil)
	limited := f.createWith(Options{RateLimit: ptr(20)}, slow.URL, "*")
	free := f.create(fast.URL, "*")
	var evs []events.Event
	for range 40 {
		evs = append(evs, f.publish("agent.run_completed", nil))
	}
	f.start()
	start := time.Now()
	for _, ev := range evs {
		f.waitDeliveryStatus(free.ID, ev.ID, DeliverySucceeded)
	}
	freeDone := time.Since(start)
	for _, ev := range evs {
		f.waitDeliveryStatus(limited.ID, ev.ID, DeliverySucceeded)
	}
	reqs := slow.requests()
	span := reqs[len(reqs)-1].At.Sub(reqs[0].At)
	// 40 events at 20/s with a burst of one: the last is sent about 1.95 s after the first.
	if span < 1500*time.Millisecond {
		t.Errorf("40 deliveries at 20/s took %v from first to last, want about 2 s", span)
	}
	if freeDone > span {
		t.Errorf("the unlimited subscription took %v, longer than the limited one's %v", freeDone, span)
	}
}

// Recover with all schedules succeeded deliveries again too, each with its own webhook-id.
func TestRecoverAllSendsSucceededAgain(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, nil)
	sub := f.create(rc.URL, "*")
	f.start()
	a, b := f.publish("agent.run_completed", nil), f.publish("agent.run_completed", nil)
	f.waitDeliveryStatus(sub.ID, a.ID, DeliverySucceeded)
	f.waitDeliveryStatus(sub.ID, b.ID, DeliverySucceeded)
	if n, err := f.svc.Recover(f.admin, sub.ID, time.Now().Add(-time.Hour), false); err != nil || n != 0 {
		t.Fatalf("recover failed only: %d, %v; want 0", n, err)
	}
	n, err := f.svc.Recover(f.admin, sub.ID, time.Now().Add(-time.Hour), true)
	if err != nil || n != 2 {
		t.Fatalf("recover all: %d, %v; want 2", n, err)
	}
	testenv.Eventually(t, 20*time.Second, "both sent again", func() bool { return rc.count() == 4 })
	ids := requestIDs(rc.requests()[2:])
	slices.Sort(ids)
	want := []string{a.ID, b.ID}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("sent again %v, want %v", ids, want)
	}
}
