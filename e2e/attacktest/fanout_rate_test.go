package attacktest

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"carehub/api/ws/wstest"
	"carehub/cmd/carehub/node"
	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

// TestSubscriptionBytesPerOrg: the caps on sockets and operations bound how many subscribers an
// organization holds, not what they cost: a 100 KB event a second to the thousand operations an
// organization may hold was 100 MB a second to execute, encode and send, and took the CPU of
// every tenant's requests in issue 51's soak. An organization's subscriptions are sent at most
// --subscription-bytes-per-second of events (with a few seconds of burst); past it they wait,
// while another organization's subscriber is sent its event at once.
func TestSubscriptionBytesPerOrg(t *testing.T) {
	const rate = 64 << 10 // 256 KiB of burst
	s := servertest.Start(t, func(c *node.Config) { c.SubscriptionBytesPerSecond = rate })
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	url := "ws://" + s.Addr() + "/graphql"

	heavy := s.DemoKey()
	heavyProject := s.ProjectID(demo.SepsisProjectName)
	c := dialWS(ctx, t, wstest.Dial, url, "Bearer "+heavy)
	var received atomic.Int64
	const subs = 4
	for i := range subs {
		ch, err := c.Subscribe(ctx, fmt.Sprint(i), eventStream, map[string]any{"projectId": heavyProject})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for range ch {
				received.Add(1)
			}
		}()
	}

	otherSlug, otherProject, otherKey := otherTenant(t, s)
	o := dialWS(ctx, t, wstest.Dial, url, "Bearer "+otherKey)
	otherCh, err := o.Subscribe(ctx, "1", eventStream, map[string]any{"projectId": otherProject})
	if err != nil {
		t.Fatal(err)
	}
	s.WaitSubscribers(subs + 1)

	// Ten events of 100 KB to four subscribers: 4 MB, sixteen times the burst.
	pad := strings.Repeat("y", 100<<10)
	start := time.Now()
	for i := range 10 {
		body := map[string]any{"projectId": heavyProject, "type": "attack.fanout", "payload": map[string]any{"i": i, "pad": pad}}
		if r := s.Do(http.MethodPost, "/v1/events", heavy, body); r.Status != http.StatusAccepted && r.Status != http.StatusCreated {
			t.Fatalf("publish: %d %.300s", r.Status, r.Body)
		}
	}
	if r := s.Do(http.MethodPost, "/v1/events", otherKey, map[string]any{"projectId": otherProject, "type": "attack.fanout.other",
		"payload": map[string]any{"ok": true}}); r.Status/100 != 2 {
		t.Fatalf("%s publish: %d %.300s", otherSlug, r.Status, r.Body)
	}
	select {
	case <-otherCh:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s's subscriber was not sent its event while %s's subscriptions were over their rate", otherSlug, demo.DemoOrgSlug)
	}
	// What the rate allows by now: the burst and the rate since the first publish, in events of
	// 100 KB, and one more that started before the bucket ran dry.
	allowed := int64((4*rate+time.Since(start).Seconds()*rate)/(100<<10)) + 1
	if got := received.Load(); got > allowed {
		t.Fatalf("%s's subscriptions were sent %d events of 100 KB within %v; the rate allows %d", demo.DemoOrgSlug, got, time.Since(start), allowed)
	}
	// Waiting is not dropping: given time, the subscriptions are sent what they may.
	servertest.Eventually(t, 30*time.Second, "the waiting subscriptions sent more events as the rate refills", func() bool {
		return received.Load() > allowed
	})
}

// otherTenant returns a second organization's slug, a project of it and a key of it with every
// scope.
func otherTenant(t *testing.T, s *servertest.Server) (slug, project, key string) {
	t.Helper()
	var orgID string
	if err := s.Pool().QueryRow(context.Background(),
		`select o.slug, o.id, p.id from organizations o join projects p on p.org_id = o.id where o.slug <> $1 order by o.slug, p.id limit 1`,
		demo.DemoOrgSlug).Scan(&slug, &orgID, &project); err != nil {
		t.Fatal(err)
	}
	return slug, project, s.Key(slug, access.Live, access.Scopes...)
}
