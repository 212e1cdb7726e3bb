package webhooks

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/internal/testenv"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/postgres"
)

// crashChildEnv marks the re-executed test binary that runs a dispatcher to be killed; the other
// crashChild* variables tell it where.
const (
	crashChildEnv     = "CAREHUB_WEBHOOKS_CRASH_CHILD"
	crashChildDSN     = "CAREHUB_WEBHOOKS_CRASH_DSN"
	crashChildBrokers = "CAREHUB_WEBHOOKS_CRASH_BROKERS"
	crashChildTopic   = "CAREHUB_WEBHOOKS_CRASH_TOPIC"
	crashChildGroup   = "CAREHUB_WEBHOOKS_CRASH_GROUP"
	crashChildWait    = "CAREHUB_WEBHOOKS_CRASH_FAST_WAIT"
)

// crashLease is the lease of the dispatchers in the crash test: short, so the test is quick.
const crashLease = 2 * time.Second

// crashClientOpts lets the group notice the killed member quickly (the broker's minimum), so
// the second dispatcher's join, and its shutdown, do not wait the default 45 s.
var crashClientOpts = []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(time.Second)}

// crashChild runs a dispatcher until it is killed.
func crashChild() int {
	ctx := context.Background()
	wait, err := time.ParseDuration(os.Getenv(crashChildWait))
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 2
	}
	pool, err := postgres.Connect(ctx, os.Getenv(crashChildDSN))
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 2
	}
	d, err := NewDispatcher(DispatcherConfig{
		Pool:         pool,
		Brokers:      strings.Split(os.Getenv(crashChildBrokers), ","),
		Topic:        os.Getenv(crashChildTopic),
		Group:        os.Getenv(crashChildGroup),
		Key:          testKey,
		AllowPrivate: true,
		Schedule:     fastSchedule,
		Lease:        crashLease,
		PollInterval: 20 * time.Millisecond,
		FastWait:     wait,
		ClientOpts:   crashClientOpts,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 2
	}
	if err := d.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 2
	}
	return 0
}

// TestKilledMidAttemptLosesNothing kills (SIGKILL) a dispatcher process while its attempt is at
// the receiver, then starts another: the delivery comes again, with the same webhook-id, and is
// recorded once, with one attempt. The attempt is the consumer's own, killed before it recorded
// anything (its event is read again) or after it recorded the delivery delivering (fast.go), or a
// lane's (the lease runs out).
func TestKilledMidAttemptLosesNothing(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fastWait  time.Duration
		delivered bool // the delivery is recorded delivering before the kill
	}{
		{"the consumer's attempt, unrecorded", time.Minute, false},
		{"the consumer's attempt, recorded delivering", time.Millisecond, true},
		{"a lane's attempt", -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) { testKilledMidAttempt(t, tc.fastWait, tc.delivered) })
	}
}

func testKilledMidAttempt(t *testing.T, fastWait time.Duration, delivering bool) {
	f := newFixture(t)
	held := make(chan struct{})
	rc := newReceiver(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 0 {
			<-held // the killed dispatcher's attempt: it never gets an answer
		}
		w.WriteHeader(http.StatusOK)
	})
	defer close(held)
	sub := f.create(rc.URL, "*")
	group := kafkatest.Group(t, "carehub-webhooks")
	ev := f.publish("workflow.run.completed", nil)

	child := testenv.StartChild(t,
		crashChildEnv+"=1",
		crashChildDSN+"="+f.dsn,
		crashChildBrokers+"="+strings.Join(f.brokers, ","),
		crashChildTopic+"="+f.topic,
		crashChildGroup+"="+group,
		crashChildWait+"="+fastWait.String(),
	)

	first := rc.waitRequests(t, 1, 30*time.Second)[0]
	var deadOwner string
	if delivering {
		testenv.Eventually(t, 20*time.Second, "the delivery recorded delivering", func() bool {
			rows := f.deliveries(sub.ID)
			return len(rows) == 1 && rows[0].Status == DeliveryDelivering
		})
	}
	if err := child.Kill(); err != nil { // SIGKILL: no deferred cleanup, no hand-back
		t.Fatal(err)
	}
	rows := f.deliveries(sub.ID)
	switch {
	case !delivering && len(rows) != 0:
		t.Fatalf("after the kill: %+v, want nothing recorded", rows)
	case delivering && (len(rows) != 1 || rows[0].Status != DeliveryDelivering || rows[0].LeaseOwner == nil || rows[0].AttemptCount != 0):
		t.Fatalf("after the kill: %+v, want one delivery left delivering under the dead dispatcher's lease", rows)
	case delivering:
		deadOwner = *rows[0].LeaseOwner
	}

	d := f.start(func(c *DispatcherConfig) { c.Group = group; c.Lease = crashLease; c.ClientOpts = crashClientOpts })
	again := rc.waitRequests(t, 2, 30*time.Second)[1]
	if again.id() != ev.ID || first.id() != ev.ID {
		t.Errorf("webhook-ids %q then %q, want the event id %q both times", first.id(), again.id(), ev.ID)
	}
	if string(again.Body) != string(first.Body) {
		t.Errorf("the resent body differs:\n%s\n%s", first.Body, again.Body)
	}
	row := f.waitDeliveryStatus(sub.ID, ev.ID, DeliverySucceeded)
	if row.AttemptCount != 1 {
		t.Errorf("attempt count %d, want 1 (the killed attempt was never recorded)", row.AttemptCount)
	}
	if n := len(f.deliveries(sub.ID)); n != 1 {
		t.Errorf("%d deliveries, want 1", n)
	}
	if d.node == deadOwner {
		t.Error("the new dispatcher reused the dead one's lease owner id")
	}
}
