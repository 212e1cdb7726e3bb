package webhooks

import (
	"slices"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"carehub/internal/testenv"
)

// A subscription with a lane on the dispatcher gets its new deliveries straight from the
// consumer (recorded delivering, handed to the lane's inbox): each is delivered once, and a URL
// changed while the lane lives applies to the deliveries handed to it afterwards. (The consumer
// makes no first attempts itself here, so every delivery has a lane.)
func TestLaneTakesDeliveriesStraightFromTheStream(t *testing.T) {
	f := newFixture(t)
	first, second := newReceiver(t, nil), newReceiver(t, nil)
	sub := f.create(first.URL, "*")
	d := f.start(func(c *DispatcherConfig) { c.FastWait = -1 })
	sent := []string{f.publish("agent.run_completed", nil).ID}
	first.waitRequests(t, 1, 20*time.Second) // a lane is up, waiting laneIdle for more
	// Bursts close together, until some went straight to the lane (the first of a run may find
	// its lane gone on a loaded machine and be claimed instead).
	testenv.Eventually(t, 20*time.Second, "deliveries handed to a lane", func() bool {
		for range 10 {
			sent = append(sent, f.publish("agent.run_completed", nil).ID)
		}
		var m dto.Metric
		return d.m.handedOver.Write(&m) == nil && m.GetCounter().GetValue() > 0
	})
	testenv.Eventually(t, 20*time.Second, "every event delivered", func() bool { return first.count() >= len(sent) })
	got := requestIDs(first.requests())
	slices.Sort(got)
	slices.Sort(sent)
	if !slices.Equal(got, sent) {
		t.Fatalf("delivered %d (%d distinct), want each of %d once", len(got), len(slices.Compact(slices.Clone(got))), len(sent))
	}

	url := second.URL
	if _, err := f.svc.Update(f.admin, sub.ID, Update{URL: &url}); err != nil {
		t.Fatal(err)
	}
	before := first.count()
	later := f.publish("agent.run_completed", nil)
	if r := second.waitRequests(t, 1, 20*time.Second)[0]; r.id() != later.ID {
		t.Errorf("the new URL got %s, want %s", r.id(), later.ID)
	}
	if first.count() != before {
		t.Errorf("the old URL got %d more after the change", first.count()-before)
	}
}
