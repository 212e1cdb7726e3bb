package subscriptiontest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"carehub/kernel/access"
	"carehub/storage/demo"
)

// TestEventStreamDelivery: a subscriber in each protocol sees every event of publishEvent, in
// order, as the Event the mutation returned, in messages of the spec's shape. The latency
// distribution (publish call start → message received, and the event's timestamp → received) is
// logged, never asserted: a loaded machine makes any bound a coin toss, and loadtest/cmd/wsload
// measures it properly.
func TestEventStreamDelivery(t *testing.T) {
	n := startNode(t)
	key := n.DemoKey()
	project := n.projectID(t, key, demo.DemoOrgSlug, demo.SepsisProjectName)
	n.ready(t, key, project)

	arrivals := map[string]<-chan arrival{}
	for _, p := range protocols {
		c := n.dial(t, p, key)
		arrivals[p.name] = watch(subscribe(t, c, "events", eventStreamQuery, map[string]any{"projectId": project}), "eventStream")
	}
	n.waitSubscribers(t, len(protocols))

	const events = 50
	fromCall := map[string][]time.Duration{}
	fromCreated := map[string][]time.Duration{}
	for i := range events {
		start := time.Now()
		pub := n.mustPublish(t, key, project, "lab.result_ready", map[string]any{"seq": i, "test": t.Name()})
		for _, p := range protocols {
			a := nextOf(t, arrivals[p.name], "lab.result_ready", 10*time.Second, fmt.Sprintf("%s: event %d", p.name, i))
			ev := a.ev
			if ev.ID != pub.ID || ev.Type != "lab.result_ready" || ev.ProjectID != project || ev.Source != "integration" ||
				ev.Severity != "info" || ev.seq() != i || !ev.Timestamp.Equal(pub.Timestamp) {
				t.Fatalf("%s: event %d arrived as %s; published %+v", p.name, i, a.obj, pub)
			}
			d := a.at.Sub(start)
			fromCall[p.name] = append(fromCall[p.name], d)
			fromCreated[p.name] = append(fromCreated[p.name], a.at.Sub(ev.Timestamp))
		}
	}
	for _, p := range protocols {
		t.Logf("%s: publishEvent call start → received: %s", p.name, latencies(fromCall[p.name]))
		t.Logf("%s: event timestamp → received:          %s", p.name, latencies(fromCreated[p.name]))
	}
}

// TestEventStreamTypes: the types argument delivers only the listed types (exact, prefix.* and
// *) and leaves other subscriptions of the same project alone; a malformed pattern is rejected
// at subscribe time with BAD_USER_INPUT.
func TestEventStreamTypes(t *testing.T) {
	n := startNode(t)
	key := n.DemoKey()
	project := n.projectID(t, key, demo.DemoOrgSlug, demo.SepsisProjectName)
	n.ready(t, key, project)

	published := []string{"lab.result_ready", "lab.result_amended", "device.observation_received", "devices.paired",
		"device.battery.low", "alert.raised"}
	cases := []struct {
		name  string
		types []string // nil: argument omitted
		want  []string
	}{
		{"omitted", nil, published},
		{"exact", []string{"lab.result_ready"}, []string{"lab.result_ready"}},
		{"prefix", []string{"device.*"}, []string{"device.observation_received", "device.battery.low"}},
		{"exact and prefix", []string{"alert.raised", "lab.*"}, []string{"lab.result_ready", "lab.result_amended", "alert.raised"}},
		{"star", []string{"*"}, published},
	}
	// A sentinel every subscription takes ends each stream: the project's events share a
	// partition, so whatever was to be delivered before it has been.
	const sentinel = "zz.sentinel"

	type sub struct {
		proto    string
		name     string
		want     []string
		arrivals <-chan arrival
	}
	var subs []sub
	for _, p := range protocols {
		c := n.dial(t, p, key)
		for i, tc := range cases {
			vars := map[string]any{"projectId": project}
			want := tc.want
			if tc.types != nil {
				vars["types"] = append(slices.Clone(tc.types), sentinel)
			}
			ch := subscribe(t, c, fmt.Sprint("t", i), eventStreamQuery, vars)
			subs = append(subs, sub{p.name, tc.name, want, watch(ch, "eventStream")})
		}
		for _, bad := range []string{"Lab.Result", "lab.*.x", "lab", "*.ready"} {
			id := "bad " + bad
			ch := subscribe(t, c, id, eventStreamQuery, map[string]any{"projectId": project, "types": []string{bad}})
			if codes := rejection(t, c, id, ch); !slices.Equal(codes, []string{"BAD_USER_INPUT"}) {
				t.Errorf("%s: types [%q] rejected with %v, want BAD_USER_INPUT", p.name, bad, codes)
			}
		}
	}
	n.waitSubscribers(t, len(subs))

	for _, typ := range append(published, sentinel) {
		n.mustPublish(t, key, project, typ, map[string]any{"test": t.Name()})
	}
	for _, s := range subs {
		var got []string
		for {
			a := next(t, s.arrivals, 10*time.Second, s.proto+" "+s.name)
			if a.ev.Type == sentinel {
				break
			}
			if a.ev.Payload["test"] == t.Name() { // not the project's own platform events
				got = append(got, a.ev.Type)
			}
		}
		if !slices.Equal(got, s.want) {
			t.Errorf("%s: types %s delivered %q, want %q", s.proto, s.name, got, s.want)
		}
	}
}

// TestEventStreamAnyCredential: eventStream needs no scope (DECISIONS §2): a key without any
// scope subscribes and receives what a key with exec:workflows publishes.
func TestEventStreamAnyCredential(t *testing.T) {
	n := startNode(t)
	publisher := n.Key(demo.DemoOrgSlug, access.Live, access.ExecWorkflows)
	reader := n.Key(demo.DemoOrgSlug, access.Test)
	project := n.projectID(t, publisher, demo.DemoOrgSlug, demo.RPMProjectName)
	n.ready(t, publisher, project)
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			c := n.dial(t, p, reader)
			arrivals := watch(subscribe(t, c, "e", eventStreamQuery, map[string]any{"projectId": project}), "eventStream")
			n.waitSubscribers(t, 1)
			pub := n.mustPublish(t, publisher, project, "device.observation_received", map[string]any{"deviceType": "wearable"})
			if a := nextOf(t, arrivals, "device.observation_received", 10*time.Second, "event"); a.ev.ID != pub.ID {
				t.Fatalf("received %s, want %s", a.obj, pub.ID)
			}
			c.Close()
			n.waitSubscribers(t, 0)
		})
	}
}
