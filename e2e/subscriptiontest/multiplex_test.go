package subscriptiontest

import (
	"testing"
	"time"

	"carehub/kernel/access"
	"carehub/storage/demo"
)

// TestSharedSubscriptions: identical subscriptions of principals who see the same data share one
// execution (api/graphql multiplex.go), and nothing else is shared. Two live keys with the same
// scopes, three subscriptions between them, run one execution and one fan-out subscriber; a test
// key and a billing key with the same document run executions of their own, and see the event
// about a real patient without the patient, as they would alone. One member leaving leaves the
// others their stream; the last one leaving ends the execution.
func TestSharedSubscriptions(t *testing.T) {
	n := startNode(t)
	admin := n.DemoKey()
	project := n.projectID(t, admin, demo.DemoOrgSlug, demo.SepsisProjectName)
	vars := map[string]any{"p": project}
	const q = `subscription($p: ID!) { eventStream(projectId: $p) { id type payload redacted } }`
	n.ready(t, admin, project)

	liveA := n.Key(demo.DemoOrgSlug, access.Live, access.Scopes...)
	liveB := n.Key(demo.DemoOrgSlug, access.Live, access.Scopes...)
	test := n.Key(demo.DemoOrgSlug, access.Test, access.Scopes...)
	billing := n.Key(demo.DemoOrgSlug, access.Live, access.AdminBilling)
	baseMembers, baseExecutions := n.subscribers(t), n.metric(t, "carehub_graphql_subscription_executions")
	baseFanOut := n.metric(t, "carehub_fanout_subscribers")

	ca, cb := n.dial(t, protocols[0], liveA), n.dial(t, protocols[1], liveB)
	a1 := watch(subscribe(t, ca, "1", q, vars), "eventStream")
	a2ch := subscribe(t, ca, "2", q, vars)
	a2 := watch(a2ch, "eventStream")
	b := watch(subscribe(t, cb, "1", q, vars), "eventStream")
	tk := watch(subscribe(t, n.dial(t, protocols[0], test), "1", q, vars), "eventStream")
	bk := watch(subscribe(t, n.dial(t, protocols[0], billing), "1", q, vars), "eventStream")
	n.waitSubscribers(t, baseMembers+5)
	if got := n.metric(t, "carehub_graphql_subscription_executions") - baseExecutions; got != 3 {
		t.Fatalf("%v executions for five subscriptions of three classes (live, test, billing); want 3", got)
	}
	if got := n.metric(t, "carehub_fanout_subscribers") - baseFanOut; got != 3 {
		t.Fatalf("%v fan-out subscribers; want 3, one per execution", got)
	}

	sent := n.mustPublish(t, admin, project, "vitals.deteriorating", map[string]any{"patientId": demo.RealPatientID, "news2": 9})
	for name, arrivals := range map[string]<-chan arrival{"live A 1": a1, "live A 2": a2, "live B": b} {
		got := next(t, arrivals, 20*time.Second, name).ev
		if got.ID != sent.ID || got.Payload["patientId"] != demo.RealPatientID {
			t.Fatalf("%s: %+v; want event %s with its patient", name, got, sent.ID)
		}
	}
	for name, arrivals := range map[string]<-chan arrival{"test key": tk, "billing key": bk} {
		got := next(t, arrivals, 20*time.Second, name).ev
		if got.ID != sent.ID || got.Payload["patientId"] != nil {
			t.Fatalf("%s: %+v; want event %s without its patient", name, got, sent.ID)
		}
	}

	// One member leaves; the others keep their stream.
	if err := ca.Unsubscribe(t.Context(), "2"); err != nil {
		t.Fatal(err)
	}
	n.waitSubscribers(t, baseMembers+4)
	again := n.mustPublish(t, admin, project, "vitals.deteriorating", map[string]any{"patientId": demo.RealPatientID, "news2": 8})
	for name, arrivals := range map[string]<-chan arrival{"live A 1": a1, "live B": b} {
		if got := next(t, arrivals, 20*time.Second, name).ev; got.ID != again.ID {
			t.Fatalf("%s after a member left: %+v; want %s", name, got, again.ID)
		}
	}
	select {
	case a, ok := <-a2:
		if ok {
			t.Fatalf("the member that left was sent %+v", a.ev)
		}
	default:
	}

	// The last members leaving end the executions.
	for _, c := range []interface{ Close() }{ca, cb} {
		c.Close()
	}
	n.waitSubscribers(t, baseMembers+2)
	deadline := time.Now().Add(20 * time.Second)
	for n.metric(t, "carehub_graphql_subscription_executions")-baseExecutions != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%v executions after the live members left; want 2 (test, billing)",
				n.metric(t, "carehub_graphql_subscription_executions")-baseExecutions)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
