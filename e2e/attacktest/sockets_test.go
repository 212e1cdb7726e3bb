package attacktest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/coder/websocket"

	"carehub/api/ws"
	"carehub/api/ws/wstest"
	"carehub/cmd/carehub/node"
	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

const eventStream = `subscription($projectId: ID!) { eventStream(projectId: $projectId) { id type payload } }`

// TestSubscriptionsCappedPerKey: finding 10 of issue 51. Twenty billing keys held 6,000
// subscriptions, and one 100 KB event then took the node from 349 MB to 2.3 GB. A key past its
// sockets is closed with 4013 (both protocols), past its operations gets an error message
// RATE_LIMITED per "key"; another key still subscribes.
func TestSubscriptionsCappedPerKey(t *testing.T) {
	s := servertest.Start(t, func(c *node.Config) {
		c.SocketLimits = ws.Limits{SocketsPerKey: 2, OperationsPerKey: 3}
	})
	project := s.ProjectID(demo.SepsisProjectName)
	attacker := "Bearer " + s.Key(demo.DemoOrgSlug, access.Live, access.AdminBilling)
	other := "Bearer " + s.Key(demo.DemoOrgSlug, access.Live, access.AdminBilling)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	url := "ws://" + s.Addr() + "/graphql"
	base := s.Subscribers()

	a1, a2 := dialWS(ctx, t, wstest.Dial, url, attacker), dialWS(ctx, t, wstest.Dial, url, attacker)
	for name, dial := range map[string]func(context.Context, string, string) (*wstest.Client, error){
		"graphql-transport-ws": wstest.Dial, "graphql-ws": wstest.DialLegacy} {
		c, err := dial(ctx, url, attacker)
		if err == nil {
			c.Close()
			t.Fatalf("%s: a third socket of a key limited to 2 was accepted", name)
		}
		if code := websocket.CloseStatus(err); code != ws.CloseTooManySockets {
			t.Fatalf("%s: third socket: close %d (%v), want %d", name, code, err, ws.CloseTooManySockets)
		}
	}

	subscribeOK(ctx, t, a1, "1", project)
	subscribeOK(ctx, t, a1, "2", project)
	subscribeOK(ctx, t, a2, "3", project)
	s.WaitSubscribers(base + 3) // all three counted
	wantRefused(ctx, t, a2, "4", project, "key")

	b := dialWS(ctx, t, wstest.Dial, url, other)
	subscribeOK(ctx, t, b, "1", project)
	s.WaitSubscribers(base + 4)
	if err := b.Err("1"); err != nil {
		t.Fatalf("another key's subscription ended: %v", err)
	}
}

// TestSubscriptionsCappedPerNode: finding 10 of issue 51. However many keys share them, the
// node runs at most its limit of operations; one ended makes room for another.
func TestSubscriptionsCappedPerNode(t *testing.T) {
	s := servertest.Start(t, func(c *node.Config) { c.SocketLimits = ws.Limits{Operations: 3} })
	project := s.ProjectID(demo.SepsisProjectName)
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	url := "ws://" + s.Addr() + "/graphql"
	base := s.Subscribers()

	a := dialWS(ctx, t, wstest.Dial, url, "Bearer "+s.Key(demo.DemoOrgSlug, access.Live, access.AdminBilling))
	b := dialWS(ctx, t, wstest.DialLegacy, url, "Bearer "+s.Key(demo.DemoOrgSlug, access.Live, access.AdminBilling))
	subscribeOK(ctx, t, a, "1", project)
	subscribeOK(ctx, t, a, "2", project)
	subscribeOK(ctx, t, b, "1", project)
	s.WaitSubscribers(base + 3)
	wantRefused(ctx, t, b, "2", project, "node")

	if err := a.Unsubscribe(ctx, "1"); err != nil {
		t.Fatal(err)
	}
	// The operation's end is counted once its goroutines are gone: retry until it is.
	attempt := 0
	servertest.Eventually(t, patience, "a subscription accepted once another ended", func() bool {
		attempt++
		id := fmt.Sprint("retry", attempt)
		ch, err := b.Subscribe(ctx, id, eventStream, map[string]any{"projectId": project})
		if err != nil {
			t.Fatal(err)
		}
		refused := false
		servertest.Eventually(t, patience, "subscription "+id+" refused or running", func() bool {
			select {
			case _, ok := <-ch:
				refused = !ok
				return refused
			default:
			}
			return s.Subscribers() == base+3
		})
		return !refused
	})
}

func dialWS(ctx context.Context, t *testing.T, dial func(context.Context, string, string) (*wstest.Client, error), url, auth string) *wstest.Client {
	t.Helper()
	c, err := dial(ctx, url, auth)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func subscribeOK(ctx context.Context, t *testing.T, c *wstest.Client, id, project string) {
	t.Helper()
	if _, err := c.Subscribe(ctx, id, eventStream, map[string]any{"projectId": project}); err != nil {
		t.Fatal(err)
	}
}

// wantRefused subscribes id and wants the error message of a limit per "key" or "node".
func wantRefused(ctx context.Context, t *testing.T, c *wstest.Client, id, project, per string) {
	t.Helper()
	ch, err := c.Subscribe(ctx, id, eventStream, map[string]any{"projectId": project})
	if err != nil {
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	select { // a refused operation ends at once, with no result
	case _, ok := <-ch:
		if ok {
			t.Fatalf("subscription %s past the %s limit yielded a result", id, per)
		}
	case <-wait.Done():
		t.Fatalf("subscription %s past the %s limit is running", id, per)
	}
	var oe *wstest.OperationError
	if !errors.As(c.Err(id), &oe) || len(oe.Errors) != 1 {
		t.Fatalf("subscription %s past the %s limit ended with %v, want one error message", id, per, c.Err(id))
	}
	var e struct {
		Extensions struct {
			Code string `json:"code"`
			Per  string `json:"per"`
		} `json:"extensions"`
	}
	if err := json.Unmarshal(oe.Errors[0], &e); err != nil || e.Extensions.Code != "RATE_LIMITED" || e.Extensions.Per != per {
		t.Fatalf("subscription %s: error %s, want RATE_LIMITED per %s", id, oe.Errors[0], per)
	}
}
