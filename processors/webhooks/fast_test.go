package webhooks

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"carehub/kernel/events"
	"carehub/kernel/ids"
)

// A healthy subscription's deliveries are attempted by the consumer and recorded once each,
// succeeded with their one attempt, without a lane.
func TestConsumerRecordsEachFirstAttemptOnce(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, nil)
	sub := f.create(rc.URL, "*")
	d := f.start()
	var sent []string
	for range 50 {
		sent = append(sent, f.publish("agent.run_completed", nil).ID)
	}
	for _, id := range sent {
		f.waitDeliveryStatus(sub.ID, id, DeliverySucceeded)
	}
	rows := f.deliveries(sub.ID)
	if len(rows) != len(sent) {
		t.Fatalf("%d deliveries, want %d", len(rows), len(sent))
	}
	for _, r := range rows {
		if r.AttemptCount != 1 || r.LeaseOwner != nil {
			t.Fatalf("delivery %+v, want one attempt and no lease", r)
		}
		if codes := f.attemptCodes(r.ID); !slices.Equal(codes, []int{http.StatusOK}) {
			t.Fatalf("delivery %s attempts %v, want one 200", r.ID, codes)
		}
	}
	var m dto.Metric
	if err := d.m.outcomeWrites.Write(&m); err != nil || m.GetHistogram().GetSampleCount() != 0 {
		t.Errorf("a lane wrote outcomes (%d writes, %v): every delivery should have been the consumer's", m.GetHistogram().GetSampleCount(), err)
	}
	got := requestIDs(rc.requests())
	slices.Sort(got)
	slices.Sort(sent)
	if !slices.Equal(got, sent) {
		t.Errorf("received %d requests, want each of %d events once", len(got), len(sent))
	}
}

// Events read again among new ones in a poll (a replay, a relay's second publish) are not sent
// again: the range of the poll's ids then holds every delivery recorded in between, more than the
// poll has, and pickFast probes the poll's deliveries one by one instead.
func TestConsumerDoesNotSendAnEventReadAgainAmongNewOnes(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, nil)
	sub := f.create(rc.URL, "*")
	d := f.start()
	var old []events.Event
	for range 30 {
		old = append(old, f.publish("agent.run_completed", nil))
	}
	for _, ev := range old {
		f.waitDeliveryStatus(sub.ID, ev.ID, DeliverySucceeded)
	}
	var fresh []events.Event
	for range 3 {
		ev, err := events.New("agent.run_completed", f.orgID, f.projectID, events.SourceIntegration, events.SeverityInfo, nil)
		if err != nil {
			t.Fatal(err)
		}
		fresh = append(fresh, ev)
	}
	f.produce(old[0], fresh[0], old[15], fresh[1], old[29], fresh[2])
	for _, ev := range fresh {
		f.waitDeliveryStatus(sub.ID, ev.ID, DeliverySucceeded)
	}
	quiet(t, d, rc, 3)
	want := []string{}
	for _, ev := range append(old, fresh...) {
		want = append(want, ev.ID)
	}
	got := requestIDs(rc.requests())
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("received %d requests, want each of %d events once", len(got), len(want))
	}
	if rows := f.deliveries(sub.ID); len(rows) != len(want) {
		t.Errorf("%d deliveries recorded, want %d", len(rows), len(want))
	}
}

// A first attempt that fails is recorded pending with its attempt, and the schedule retries it;
// the subscription is left to the schedule meanwhile.
func TestConsumerFirstAttemptFailureIsRetried(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	sub := f.create(rc.URL, "*")
	f.start()
	ev := f.publish("agent.run_completed", nil)
	row := f.waitDeliveryStatus(sub.ID, ev.ID, DeliverySucceeded)
	if row.AttemptCount != 2 {
		t.Errorf("attempt count %d, want 2", row.AttemptCount)
	}
	if codes := f.attemptCodes(row.ID); !slices.Equal(codes, []int{http.StatusServiceUnavailable, http.StatusNoContent}) {
		t.Errorf("attempts %v, want 503 then 204", codes)
	}
	if ids := requestIDs(rc.requests()); !slices.Equal(ids, []string{ev.ID, ev.ID}) {
		t.Errorf("requests %v, want %s twice (a retry, the same webhook-id)", ids, ev.ID)
	}
	if got := f.get(sub.ID); got.Status != StatusActive || got.FailureCount != 0 {
		t.Errorf("subscription %s with %d failures, want active with none after the success", got.Status, got.FailureCount)
	}
}

// An attempt that outruns FastWait is recorded delivering while it goes on, so the consumer
// moves on: a fast subscription beside it is delivered meanwhile, and the slow one's delivery
// ends succeeded with one attempt.
func TestConsumerLeavesASlowAttemptBehind(t *testing.T) {
	f := newFixture(t)
	release := make(chan struct{})
	slow := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		<-release
		w.WriteHeader(http.StatusNoContent)
	})
	fast := newReceiver(t, nil)
	slowSub, fastSub := f.create(slow.URL, "agent.*"), f.create(fast.URL, "agent.*")
	f.start(func(c *DispatcherConfig) { c.FastWait = 50 * time.Millisecond })
	first := f.publish("agent.run_completed", nil)
	slow.waitRequests(t, 1, 20*time.Second)
	f.waitDeliveryStatus(slowSub.ID, first.ID, DeliveryDelivering)
	second := f.publish("agent.run_completed", nil)
	f.waitDeliveryStatus(fastSub.ID, second.ID, DeliverySucceeded)
	close(release)
	for _, ev := range []string{first.ID, second.ID} {
		if row := f.waitDeliveryStatus(slowSub.ID, ev, DeliverySucceeded); row.AttemptCount != 1 {
			t.Errorf("slow delivery of %s: %d attempts, want 1", ev, row.AttemptCount)
		}
	}
	var n int
	if err := f.pool.QueryRow(context.Background(), `select count(*) from webhook_attempt_log where webhook_id = $1`, slowSub.ID).Scan(&n); err != nil || n != 2 {
		t.Errorf("%d attempts recorded for the slow subscription (%v), want 2", n, err)
	}
}

// The consumer's write copies its deliveries; a delivery another consumer of the partition
// recorded meanwhile (a rebalance) fails the copy, and the write then skips it and records the
// rest, each with its first attempt, as the attempt log serves it.
func TestRecordFastSkipsADeliveryRecordedMeanwhile(t *testing.T) {
	f := newFixture(t)
	sub := f.create("http://127.0.0.1:9/hook", "*")
	d := f.start()
	ctx := context.Background()
	at := time.Now().Add(-time.Second).UTC().Truncate(time.Microsecond)
	row := func(eventID string) fastRow {
		fl := &fastLane{l: &lane{webhookID: sub.ID, orgID: sub.OrgID}}
		it := &fastItem{fl: fl, row: newDelivery{id: ids.New(ids.Delivery), orgID: sub.OrgID, webhookID: sub.ID,
			ev: events.Event{ID: eventID, Type: "agent.run_completed", CreatedAt: at}, body: []byte(`{"n":1}`)}}
		out := outcome{AttemptedAt: at, Latency: 7 * time.Millisecond, StatusCode: http.StatusAccepted, ResponseBody: "queued"}
		return fastRow{it: it, status: DeliverySucceeded, res: fastResult{out: out, sent: true}}
	}
	first := row("evt_b")
	if n, err := d.recordFast(ctx, []fastRow{first}, true); err != nil || n != 1 {
		t.Fatalf("recordFast of one: %d, %v", n, err)
	}
	rows := []fastRow{row("evt_a"), row("evt_b"), row("evt_c")}
	if n, err := d.recordFast(ctx, rows, true); err != nil || n != 2 {
		t.Fatalf("recordFast with one recorded meanwhile: %d, %v; want 2 inserted", n, err)
	}
	got := f.deliveries(sub.ID)
	if len(got) != 3 || got[0].ID != first.it.row.id || got[1].ID != rows[0].it.row.id || got[2].ID != rows[2].it.row.id {
		t.Fatalf("deliveries %+v, want evt_b's first delivery, then evt_a's and evt_c's in order", got)
	}
	atts, err := f.svc.Attempts(f.admin, []string{rows[2].it.row.id})
	if err != nil {
		t.Fatal(err)
	}
	a := atts[rows[2].it.row.id]
	if len(a) != 1 || a[0].ID != ids.Attempt+strings.TrimPrefix(rows[2].it.row.id, ids.Delivery) || *a[0].StatusCode != http.StatusAccepted ||
		a[0].LatencyMs != 7 || *a[0].ResponseBody != "queued" || a[0].Error != nil || !a[0].AttemptedAt.Equal(at) {
		t.Errorf("attempts %+v, want the one first attempt as sent", a)
	}
}

// Polls start small and are sized by how long their first attempts took: halved past half of
// fastCap, doubled under an eighth of it, within minPollRecords..pollRecords.
func TestSizePolls(t *testing.T) {
	d := &Dispatcher{cfg: DispatcherConfig{FastWait: 250 * time.Millisecond}, polls: &atomic.Int64{}}
	d.polls.Store(minPollRecords)
	limit := fastCap(d.cfg.FastWait)
	for _, step := range []struct {
		took time.Duration
		want int64
	}{
		{limit / 10, 2 * minPollRecords},
		{limit / 10, 4 * minPollRecords},
		{limit / 4, 4 * minPollRecords}, // between: as it was
		{0, pollRecords},
		{0, pollRecords},
		{limit, pollRecords / 2},
		{limit, pollRecords / 4},
		{limit, minPollRecords},
		{limit, minPollRecords},
	} {
		d.sizePolls(step.took)
		if got := d.polls.Load(); got != step.want {
			t.Fatalf("after a poll of %v: the next takes %d, want %d", step.took, got, step.want)
		}
	}
}

// Without first attempts in the consumer (FastWait negative) polls stay at their largest.
func TestSizePollsWithoutFirstAttempts(t *testing.T) {
	d := &Dispatcher{cfg: DispatcherConfig{FastWait: -1}, polls: &atomic.Int64{}}
	d.polls.Store(pollRecords)
	for range 3 {
		d.sizePolls(0)
	}
	if got := d.polls.Load(); got != pollRecords {
		t.Errorf("polls of %d, want %d", got, pollRecords)
	}
}
