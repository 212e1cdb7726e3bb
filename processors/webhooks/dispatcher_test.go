package webhooks

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/internal/testenv"
	"carehub/kernel/events"
	"carehub/kernel/whsig"
	"carehub/storage/kafka/consume"
	"carehub/storage/kafka/kafkatest"
)

func TestEventIsDeliveredOnceSignedWithTheSpecBody(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, nil)
	sub := f.create(rc.URL+"/hook", "workflow.run.completed")
	f.start()

	ev := f.publish("workflow.run.completed", events.WorkflowRunCompleted{RunID: "run_1", WorkflowID: "wf_1", Status: "COMPLETED",
		DurationMs: 1234, AlertGenerated: true, Severity: "HIGH"})
	req := rc.waitRequests(t, 1, 20*time.Second)[0]

	if got := req.id(); got != ev.ID {
		t.Errorf("webhook-id = %q, want the event id %q", got, ev.ID)
	}
	ts, err := strconv.ParseInt(req.Header.Get(whsig.HeaderTimestamp), 10, 64)
	if err != nil || time.Since(time.Unix(ts, 0)).Abs() > time.Minute {
		t.Errorf("webhook-timestamp = %q, want unix seconds of the attempt", req.Header.Get(whsig.HeaderTimestamp))
	}
	if !whsig.Verify(sub.Secret, req.id(), req.Header.Get(whsig.HeaderTimestamp), req.Body, req.Header.Get(whsig.HeaderSignature)) {
		t.Errorf("webhook-signature %q does not verify with the subscription secret", req.Header.Get(whsig.HeaderSignature))
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	if ua := req.Header.Get("User-Agent"); ua == "" || ua == "Go-http-client/1.1" {
		t.Errorf("User-Agent = %q, want carehub's", ua)
	}

	// The body is exactly the spec's delivered shape, fields in its order.
	want := `{"event":"workflow.run.completed","timestamp":"` + ev.CreatedAt.UTC().Format(time.RFC3339Nano) +
		`","org_id":"` + f.orgID + `","project_id":"` + f.projectID + `","payload":{"run_id":"run_1","workflow_id":"wf_1",` +
		`"status":"COMPLETED","duration_ms":1234,"alert_generated":true,"severity":"HIGH"}}`
	if string(req.Body) != want {
		t.Errorf("body\n got %s\nwant %s", req.Body, want)
	}
	var body struct {
		Timestamp time.Time `json:"timestamp"`
	}
	if err := json.Unmarshal(req.Body, &body); err != nil || !body.Timestamp.Equal(ev.CreatedAt) {
		t.Errorf("timestamp %v does not round-trip to the event's createdAt %v (%v)", body.Timestamp, ev.CreatedAt, err)
	}

	d := f.waitDeliveryStatus(sub.ID, ev.ID, DeliverySucceeded)
	if d.AttemptCount != 1 {
		t.Errorf("attempt count = %d, want 1", d.AttemptCount)
	}
	if codes := f.attemptCodes(d.ID); !slices.Equal(codes, []int{200}) {
		t.Errorf("attempts = %v, want [200]", codes)
	}
	got := f.get(sub.ID)
	if got.Status != StatusActive || got.FailureCount != 0 || got.LastDeliveredAt == nil {
		t.Errorf("subscription after success: status %s, failureCount %d, lastDeliveredAt %v", got.Status, got.FailureCount, got.LastDeliveredAt)
	}

	// A later event arrives after the first; by then a duplicate of the first would have too.
	second := f.publish("workflow.run.completed", events.WorkflowRunCompleted{RunID: "run_2"})
	f.waitDeliveryStatus(sub.ID, second.ID, DeliverySucceeded)
	if ids := requestIDs(rc.requests()); !slices.Equal(ids, []string{ev.ID, second.ID}) {
		t.Errorf("receiver got %v, want each event once: %v", ids, []string{ev.ID, second.ID})
	}
	if n := len(f.deliveries(sub.ID)); n != 2 {
		t.Errorf("%d deliveries recorded, want 2", n)
	}
}

func TestWildcardSubscriptionGetsOnlyItsNamespace(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, nil)
	sub := f.createWith(oneAtATime(), rc.URL, "agent.*")
	f.start()

	f.publish("agent.run_completed", nil)
	f.publish("workflow.run.completed", nil)
	f.publish("agents.run_completed", nil)
	f.publish("agent.run.failed", nil)
	f.publish("device.observation_received", nil)
	last := f.publish("agent.sentinel", nil)

	// Same project, same partition, one at a time: once the last arrives, everything before it
	// that matched has arrived too.
	f.waitDeliveryStatus(sub.ID, last.ID, DeliverySucceeded)
	types := rc.eventTypes()
	if want := []string{"agent.run_completed", "agent.run.failed", "agent.sentinel"}; !slices.Equal(types, want) {
		t.Errorf("delivered %v, want %v", types, want)
	}
	if n := len(f.deliveries(sub.ID)); n != 3 {
		t.Errorf("%d deliveries recorded, want 3", n)
	}
}

// TestEventsOfAnyShapeAreMatched: the dispatcher passes over events by their head
// (events.PeekHead) only when it can read it; an envelope written in another member order or
// case is decoded and matched as before, and a record that looks like a subscribed event but is
// not an envelope is skipped without holding its partition.
func TestEventsOfAnyShapeAreMatched(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, nil)
	sub := f.createWith(oneAtATime(), rc.URL, "agent.*")
	f.start()

	reordered, err := events.New("agent.reordered", f.orgID, f.projectID, events.SourceIntegration, events.SeverityInfo, map[string]any{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	v := fmt.Sprintf(`{"payload":{"n":1},"Type":%q,"orgId":%q,"projectId":%q,"id":%q,"source":"integration","severity":"info","createdAt":%q}`,
		reordered.Type, f.orgID, f.projectID, reordered.ID, reordered.CreatedAt.Format(time.RFC3339Nano))
	poison := fmt.Sprintf(`{"id":"evt_x","type":"agent.poison","orgId":%q,"projectId":%q,"payload":`, f.orgID, f.projectID)
	key := []byte(f.projectID)
	if err := f.prod.ProduceSync(context.Background(), &kgo.Record{Key: key, Value: []byte(poison)},
		&kgo.Record{Key: key, Value: []byte(v)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	f.publish("workflow.run.completed", nil)
	last := f.publish("agent.sentinel", nil)

	f.waitDeliveryStatus(sub.ID, last.ID, DeliverySucceeded)
	types := rc.eventTypes()
	if want := []string{"agent.reordered", "agent.sentinel"}; !slices.Equal(types, want) {
		t.Errorf("delivered %v, want %v", types, want)
	}
}

func TestFailureMakesFailingAndSuccessRestoresActive(t *testing.T) {
	f := newFixture(t)
	release := make(chan struct{})
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 0 {
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte(`{"error":"boom"}`))
			return
		}
		<-release
		w.WriteHeader(http.StatusNoContent)
	})
	sub := f.create(rc.URL, "*")
	f.start()
	ev := f.publish("diagnostic.result_ready", nil)

	// The retry is in flight (and held): the first failure is recorded by now.
	rc.waitRequests(t, 2, 20*time.Second)
	got := f.get(sub.ID)
	if got.Status != StatusFailing || got.FailureCount != 1 {
		t.Errorf("after one failure: status %s, failureCount %d; want failing, 1", got.Status, got.FailureCount)
	}
	close(release)
	d := f.waitDeliveryStatus(sub.ID, ev.ID, DeliverySucceeded)
	if codes := f.attemptCodes(d.ID); !slices.Equal(codes, []int{500, 204}) {
		t.Errorf("attempts = %v, want [500 204]", codes)
	}
	atts, _ := f.svc.Attempts(f.admin, []string{d.ID})
	if first := atts[d.ID][0]; first.ResponseBody == nil || *first.ResponseBody != `{"error":"boom"}` || first.Error == nil {
		t.Errorf("first attempt log: body %v, error %v", first.ResponseBody, first.Error)
	}
	got = f.get(sub.ID)
	if got.Status != StatusActive || got.FailureCount != 0 {
		t.Errorf("after success: status %s, failureCount %d; want active, 0", got.Status, got.FailureCount)
	}
	if rc.count() != 2 {
		t.Errorf("receiver got %d requests, want 2", rc.count())
	}
}

func TestTenFailuresPauseAndResumeDeliversEverythingInOrder(t *testing.T) {
	f := newFixture(t)
	var healthy = make(chan struct{})
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		select {
		case <-healthy:
			w.WriteHeader(http.StatusOK)
		default:
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	sub := f.createWith(oneAtATime(), rc.URL, "*")
	var evs []events.Event
	for i := range 15 {
		evs = append(evs, f.publish("device.observation_received", map[string]int{"n": i}))
	}
	d := f.start(func(c *DispatcherConfig) { c.Schedule = oneShotSchedule })

	testenv.Eventually(t, 20*time.Second, "the subscription to pause", func() bool { return f.get(sub.ID).Status == StatusPaused })
	got := f.get(sub.ID)
	if got.FailureCount != PauseAfter {
		t.Errorf("failureCount = %d, want %d", got.FailureCount, PauseAfter)
	}
	quiet(t, d, rc, 5)
	if n := rc.count(); n != PauseAfter {
		t.Fatalf("receiver got %d attempts before the pause, want %d", n, PauseAfter)
	}
	if ids := requestIDs(rc.requests()); !slices.Equal(ids, eventIDs(evs[:PauseAfter])) {
		t.Errorf("attempted %v, want the first ten in order", ids)
	}
	rows := f.deliveries(sub.ID)
	if len(rows) != 15 {
		t.Fatalf("%d deliveries, want 15", len(rows))
	}
	for i, r := range rows {
		wantAttempts := 0
		if i < PauseAfter {
			wantAttempts = 1
		}
		if r.Status != DeliveryPending || r.AttemptCount != wantAttempts {
			t.Errorf("delivery %d: %s after %d attempts, want pending after %d", i, r.Status, r.AttemptCount, wantAttempts)
		}
	}

	// Events that arrive while paused are kept too.
	for i := range 3 {
		evs = append(evs, f.publish("device.observation_received", map[string]int{"n": 15 + i}))
	}
	testenv.Eventually(t, 20*time.Second, "deliveries recorded while paused", func() bool { return len(f.deliveries(sub.ID)) == 18 })
	quiet(t, d, rc, 3)

	close(healthy)
	active := StatusActive
	if _, err := f.svc.Update(f.admin, sub.ID, Update{Status: &active}); err != nil {
		t.Fatal(err)
	}
	reqs := rc.waitRequests(t, PauseAfter+18, 20*time.Second)
	if ids := requestIDs(reqs[PauseAfter:]); !slices.Equal(ids, eventIDs(evs)) {
		t.Errorf("after resume delivered\n%v\nwant every event in order\n%v", ids, eventIDs(evs))
	}
	testenv.Eventually(t, 20*time.Second, "every delivery to succeed", func() bool {
		for _, r := range f.deliveries(sub.ID) {
			if r.Status != DeliverySucceeded {
				return false
			}
		}
		return true
	})
	got = f.get(sub.ID)
	if got.Status != StatusActive || got.FailureCount != 0 {
		t.Errorf("after resume: status %s, failureCount %d", got.Status, got.FailureCount)
	}
}

func TestGoneDisablesTheSubscription(t *testing.T) {
	f := newFixture(t)
	gone := newReceiver(t, status(http.StatusGone))
	other := newReceiver(t, nil)
	sub := f.createWith(oneAtATime(), gone.URL, "*")
	witness := f.create(other.URL, "*")
	// Both events are in the topic before the dispatcher starts, so it records both before the
	// first 410 disables the subscription.
	var evs []events.Event
	for range 2 {
		ev, err := events.New("agent.run_completed", f.orgID, f.projectID, events.SourceIntegration, events.SeverityInfo, nil)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	f.produce(evs...)
	first := evs[0]
	d := f.start()

	testenv.Eventually(t, 20*time.Second, "the subscription to be disabled", func() bool { return f.get(sub.ID).Status == StatusDisabled })
	quiet(t, d, gone, 5)
	if n := gone.count(); n != 1 {
		t.Errorf("a 410 receiver got %d requests, want 1", n)
	}
	// Nothing is dropped: the delivery stays pending, ready if the subscription is re-enabled.
	if rows := f.deliveries(sub.ID); len(rows) != 2 || rows[0].EventID != first.ID || rows[0].Status != DeliveryPending || rows[0].AttemptCount != 1 {
		t.Errorf("deliveries of the disabled subscription: %+v", rows)
	}
	// A disabled subscription records no new deliveries.
	later := f.publish("agent.run_completed", nil)
	f.waitDeliveryStatus(witness.ID, later.ID, DeliverySucceeded)
	if rows := f.deliveries(sub.ID); len(rows) != 2 {
		t.Errorf("disabled subscription got a delivery for a later event: %+v", rows)
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	for _, code := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			f := newFixture(t)
			rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 0 {
					w.Header().Set("Retry-After", "2")
					w.WriteHeader(code)
					return
				}
				w.WriteHeader(http.StatusOK)
			})
			sub := f.create(rc.URL, "*")
			f.start() // the schedule alone would retry after 20 ms
			ev := f.publish("agent.run.failed", nil)

			rc.waitRequests(t, 1, 20*time.Second)
			var next time.Time
			var last time.Time
			testenv.Eventually(t, 20*time.Second, "the first outcome", func() bool {
				return f.pool.QueryRow(context.Background(), `select next_attempt_at, last_attempt_at from webhook_deliveries
where webhook_id = $1 and attempt_count = 1 and status = 'pending'`, sub.ID).Scan(&next, &last) == nil
			})
			if gap := next.Sub(last); gap < 2*time.Second {
				t.Errorf("next attempt scheduled %s after the %d, want at least Retry-After (2s)", gap, code)
			}
			reqs := rc.waitRequests(t, 2, 20*time.Second)
			// On the wall clock, as Postgres schedules: the monotonic clock may run a few hundred
			// ppm apart from it on a VM whose time is being slewed (a retry measured 1.9996 s).
			if gap := reqs[1].At.Round(0).Sub(reqs[0].At.Round(0)); gap < 2*time.Second {
				t.Errorf("retried %s after a %d with Retry-After: 2", gap, code)
			}
			d := f.waitDeliveryStatus(sub.ID, ev.ID, DeliverySucceeded)
			if codes := f.attemptCodes(d.ID); !slices.Equal(codes, []int{code, 200}) {
				t.Errorf("attempts = %v", codes)
			}
		})
	}
}

func TestTimeoutIsAFailedAttempt(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 0 {
			<-r.Context().Done() // never answers; the dispatcher gives up
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	sub := f.create(rc.URL, "*")
	f.start(func(c *DispatcherConfig) { c.Timeout = 300 * time.Millisecond })
	ev := f.publish("agent.run.failed", nil)
	d := f.waitDeliveryStatus(sub.ID, ev.ID, DeliverySucceeded)
	atts, err := f.svc.Attempts(f.admin, []string{d.ID})
	if err != nil {
		t.Fatal(err)
	}
	a := atts[d.ID]
	if len(a) != 2 || a[0].StatusCode != nil || a[0].Error == nil || *a[0].Error != "timeout" || a[0].LatencyMs < 300 {
		t.Fatalf("attempts %+v: want a timeout (no status, error \"timeout\", ≥ 300 ms) then a success", a)
	}
	if a[1].StatusCode == nil || *a[1].StatusCode != 200 {
		t.Errorf("second attempt %+v, want 200", a[1])
	}
}

func TestSlowReceiverDoesNotDelayAnotherSubscription(t *testing.T) {
	f := newFixture(t)
	release := make(chan struct{})
	slow := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusOK)
	})
	fast := newReceiver(t, nil)
	slowSub := f.createWith(oneAtATime(), slow.URL, "*")
	fastSub := f.create(fast.URL, "*")
	f.start()
	var evs []events.Event
	for range 5 {
		evs = append(evs, f.publish("workflow.completed", nil))
	}
	// Every fast delivery completes while the slow receiver still holds its first request. The
	// slow subscription's first attempt comes through a claim, which may follow the fast one's
	// deliveries (sent by the consumer): it is waited for, not assumed.
	slow.waitRequests(t, 1, 10*time.Second)
	for _, ev := range evs {
		f.waitDeliveryStatus(fastSub.ID, ev.ID, DeliverySucceeded)
	}
	if n := slow.count(); n != 1 {
		t.Errorf("slow receiver has %d requests in flight, want 1 (one at a time per subscription)", n)
	}
	close(release)
	for _, ev := range evs {
		f.waitDeliveryStatus(slowSub.ID, ev.ID, DeliverySucceeded)
	}
	if ids := requestIDs(slow.requests()); !slices.Equal(ids, eventIDs(evs)) {
		t.Errorf("slow receiver got %v, want %v", ids, eventIDs(evs))
	}
}

func TestEventConsumedTwiceIsDeliveredOnce(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, nil)
	sub := f.createWith(oneAtATime(), rc.URL, "*")
	ev := f.publish("agent.run_completed", nil)
	f.produce(ev) // the same event again, as a relay retry would publish it
	first := f.start()
	sentinel := f.publish("agent.sentinel", nil)
	f.waitDeliveryStatus(sub.ID, sentinel.ID, DeliverySucceeded)
	first.stop(t)

	// A second group reads the whole topic again.
	group := kafkatest.Group(t, "replay")
	f.start(func(c *DispatcherConfig) { c.Group = group })
	testenv.Eventually(t, 30*time.Second, "the replay group to commit the end of the topic", func() bool {
		return f.committedAll(group)
	})
	if ids := requestIDs(rc.requests()); !slices.Equal(ids, []string{ev.ID, sentinel.ID}) {
		t.Errorf("receiver got %v, want each event once", ids)
	}
	if rows := f.deliveries(sub.ID); len(rows) != 2 {
		t.Errorf("%d deliveries recorded, want 2: %+v", len(rows), rows)
	}
}

func TestRotationSignsWithBothSecrets(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, nil)
	sub := f.create(rc.URL, "*")
	rotated, err := f.svc.RotateSecret(f.admin, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rotated.Secret == sub.Secret || len(rotated.Secret) != len(sub.Secret) {
		t.Fatalf("rotation returned %q", rotated.Secret)
	}
	f.start()
	f.publish("agent.run_completed", nil)
	req := rc.waitRequests(t, 1, 20*time.Second)[0]
	sigs := bytes.Fields([]byte(req.Header.Get(whsig.HeaderSignature)))
	if len(sigs) != 2 {
		t.Fatalf("webhook-signature %q: want two signatures during the rotation", req.Header.Get(whsig.HeaderSignature))
	}
	ts := req.Header.Get(whsig.HeaderTimestamp)
	for i, secret := range []string{rotated.Secret, sub.Secret} {
		if !whsig.Verify(secret, req.id(), ts, req.Body, string(sigs[i])) {
			t.Errorf("signature %d does not verify with its secret", i)
		}
		if whsig.Verify(secret, req.id(), ts, req.Body, string(sigs[1-i])) {
			t.Errorf("signature %d verifies with the other secret", 1-i)
		}
	}

	// After the overlap the old secret stops signing.
	if _, err := f.pool.Exec(context.Background(), `update webhooks set previous_secret_expires_at = now() - interval '1 second' where id = $1`, sub.ID); err != nil {
		t.Fatal(err)
	}
	f.publish("agent.run_completed", nil)
	req = rc.waitRequests(t, 2, 20*time.Second)[1]
	if sigs := bytes.Fields([]byte(req.Header.Get(whsig.HeaderSignature))); len(sigs) != 1 ||
		!whsig.Verify(rotated.Secret, req.id(), req.Header.Get(whsig.HeaderTimestamp), req.Body, string(sigs[0])) {
		t.Errorf("after the overlap: webhook-signature %q, want only the new secret's", req.Header.Get(whsig.HeaderSignature))
	}
}

func TestDeletedSubscriptionCancelsPendingDeliveries(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, status(http.StatusInternalServerError))
	sub := f.create(rc.URL, "*")
	f.start(func(c *DispatcherConfig) { c.Schedule = oneShotSchedule })
	ev := f.publish("agent.run_completed", nil)
	testenv.Eventually(t, 20*time.Second, "a failed attempt", func() bool {
		rows := f.deliveries(sub.ID)
		return len(rows) == 1 && rows[0].AttemptCount == 1
	})
	if err := f.svc.Delete(f.admin, sub.ID); err != nil {
		t.Fatal(err)
	}
	if rows := f.deliveries(sub.ID); rows[0].Status != DeliveryCancelled || rows[0].EventID != ev.ID {
		t.Errorf("after delete: %+v, want cancelled", rows)
	}
	if _, err := f.svc.Get(f.admin, sub.ID); err == nil {
		t.Error("a deleted subscription is still visible")
	}
}

func TestMaxInFlightBoundsConcurrentAttempts(t *testing.T) {
	f := newFixture(t)
	var mu sync.Mutex
	inFlight, most := 0, 0
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		// Hold each request a while so that concurrent ones overlap.
		time.Sleep(50 * time.Millisecond)
		mu.Lock()
		inFlight--
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})
	sub := f.createWith(Options{MaxInFlight: ptr(4)}, rc.URL, "*")
	var evs []events.Event
	for range 16 {
		evs = append(evs, f.publish("agent.run_completed", nil))
	}
	f.start()
	for _, ev := range evs {
		f.waitDeliveryStatus(sub.ID, ev.ID, DeliverySucceeded)
	}
	mu.Lock()
	defer mu.Unlock()
	if most > 4 || most < 2 {
		t.Errorf("at most %d attempts were in flight at once, want 2..4 with maxInFlight 4", most)
	}
}

// An event whose delivery row Postgres refuses goes to the dead-letter topic and the events
// behind it are delivered: it never stalls the dispatcher's partition. Replayed once its cause
// is mended, it is delivered once, and an event delivered before and read again is not sent
// twice (one delivery per subscription and event).
//
// Nothing an event carries into its delivery row can be refused today (the payload is stored
// as bytea, the id and type are checked at decode, the organization is the subscription's), so
// a check constraint makes Postgres refuse this one event's row, as it would a value it cannot
// hold: an integrity error (class 23), which postgres.Refused classifies with data exceptions.
func TestRefusedDeliveryIsDeadLettered(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, nil)
	sub := f.create(rc.URL+"/hook", "workflow.run.completed")
	bad, err := events.New("workflow.run.completed", f.orgID, f.projectID, events.SourceIntegration, events.SeverityInfo,
		events.WorkflowRunCompleted{RunID: "run_0"})
	if err != nil {
		t.Fatal(err)
	}
	// What the event log's store refuses (the doors do too) passes the dispatcher's decode.
	bad.Payload = json.RawMessage(`{"n":1e999999,"s":"\ud800"}`)
	good, err := events.New("workflow.run.completed", f.orgID, f.projectID, events.SourceIntegration, events.SeverityInfo,
		events.WorkflowRunCompleted{RunID: "run_1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, `alter table webhook_deliveries add constraint refuse_one check (event_id <> '`+bad.ID+`')`); err != nil {
		t.Fatal(err)
	}
	dlq := kafkatest.Topic(t, "webhooks-dlq")
	f.produce(bad, good) // one project, one partition: good is behind bad
	d := f.start(func(c *DispatcherConfig) { c.DeadLetterTopic = dlq })
	f.waitDeliveryStatus(sub.ID, good.ID, DeliverySucceeded)

	recs := kafkatest.ReadAll(t, dlq)
	if len(recs) != 1 {
		t.Fatalf("%d records on the dead-letter topic, want 1", len(recs))
	}
	dead, err := consume.ReadDeadLettered(recs[0])
	if err != nil || dead.SourceTopic != f.topic || dead.Consumer != "webhooks" || dead.Error != "the store refuses the data (SQLSTATE 23514)" ||
		!bytes.Equal(recs[0].Value, eventRecord(t, bad).Value) {
		t.Fatalf("dead-lettered %+v, %v", dead, err)
	}

	// Mended and replayed, with the good event read again too (a redelivery).
	if _, err := f.pool.Exec(ctx, `alter table webhook_deliveries drop constraint refuse_one`); err != nil {
		t.Fatal(err)
	}
	replay := dead.ReplayRecord()
	if err := f.prod.ProduceSync(ctx, replay, eventRecord(t, good)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	f.waitDeliveryStatus(sub.ID, bad.ID, DeliverySucceeded)
	quiet(t, d, rc, 3)
	// The consumer attempted both before Postgres refused one: the attempts are kept, and
	// recorded when their events are handled again, not made again (fast.go).
	ids := requestIDs(rc.requests())
	slices.Sort(ids)
	if want := []string{good.ID, bad.ID}; !slices.Equal(ids, slices.Sorted(slices.Values(want))) {
		t.Errorf("requests for %v, want each event once: %v", ids, want)
	}
}

// Retention deletes a finished delivery with its attempts, and nothing newer.
func TestRetentionDeletesAttemptsWithTheirDelivery(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, nil)
	sub := f.create(rc.URL, "*")
	d := f.start()
	old, recent := f.publish("agent.run_completed", nil), f.publish("agent.run_completed", nil)
	f.waitDeliveryStatus(sub.ID, old.ID, DeliverySucceeded)
	f.waitDeliveryStatus(sub.ID, recent.ID, DeliverySucceeded)
	ctx := context.Background()
	if _, err := f.pool.Exec(ctx, `update webhook_deliveries set completed_at = now() - interval '2 hours'
where webhook_id = $1 and event_id = $2`, sub.ID, old.ID); err != nil {
		t.Fatal(err)
	}
	if n, err := d.purge(ctx, time.Hour, 1000); err != nil || n != 1 {
		t.Fatalf("purge: %d, %v; want 1", n, err)
	}
	var deliveries, attempts int
	if err := f.pool.QueryRow(ctx, `select (select count(*) from webhook_deliveries where webhook_id = $1),
	(select count(*) from webhook_attempt_log where webhook_id = $1)`, sub.ID).Scan(&deliveries, &attempts); err != nil {
		t.Fatal(err)
	}
	if deliveries != 1 || attempts != 1 {
		t.Errorf("after the purge: %d deliveries and %d attempts, want the recent one's 1 and 1", deliveries, attempts)
	}
}
