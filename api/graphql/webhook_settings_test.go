package graphql_test

import (
	"context"
	"testing"
	"time"

	"carehub/kernel/ids"
	"carehub/storage/demo"
)

// webhookSettings is the delivery settings of a WebhookSubscription as the tests select them.
type webhookSettings struct {
	Ordered                           bool
	MaxInFlight, BatchSize, RateLimit int
}

// TestWebhookDeliverySettings: createWebhook and updateWebhook take ordered, maxInFlight,
// batchSize and rateLimit (issue 55), the subscription answers them, and
// recoverWebhookDeliveries(all: true) queues every finished delivery.
func TestWebhookDeliverySettings(t *testing.T) {
	s := start(t)
	key := s.DemoKey()
	sepsis := s.ProjectID(demo.SepsisProjectName)
	const settings = `ordered maxInFlight batchSize rateLimit`

	create := `mutation($p: ID!, $u: String!, $o: Boolean, $m: Int, $b: Int, $r: Int) {
		createWebhook(projectId: $p, url: $u, events: ["agent.*"], ordered: $o, maxInFlight: $m, batchSize: $b, rateLimit: $r) { id ` + settings + ` } }`
	var c struct {
		CreateWebhook struct {
			ID string
			webhookSettings
		}
	}
	s.MustGraphQL(t, key, create, map[string]any{"p": sepsis, "u": "https://hooks.example.org/plain"}, &c)
	if want := (webhookSettings{MaxInFlight: 16, BatchSize: 1}); c.CreateWebhook.webhookSettings != want {
		t.Errorf("created without settings: %+v, want the defaults %+v", c.CreateWebhook.webhookSettings, want)
	}
	s.MustGraphQL(t, key, create, map[string]any{"p": sepsis, "u": "https://hooks.example.org/ordered", "o": true, "b": 50, "r": 100}, &c)
	id := c.CreateWebhook.ID
	if want := (webhookSettings{Ordered: true, MaxInFlight: 16, BatchSize: 50, RateLimit: 100}); c.CreateWebhook.webhookSettings != want {
		t.Fatalf("created: %+v, want %+v", c.CreateWebhook.webhookSettings, want)
	}

	var list struct {
		Webhooks []struct {
			ID string
			webhookSettings
		}
	}
	s.MustGraphQL(t, key, `query($p: ID!) { webhooks(projectId: $p) { id `+settings+` } }`, map[string]any{"p": sepsis}, &list)
	listed := false
	for _, w := range list.Webhooks {
		if w.ID == id {
			listed = w.webhookSettings == c.CreateWebhook.webhookSettings
		}
	}
	if !listed {
		t.Errorf("webhooks: %+v, want %s with %+v", list.Webhooks, id, c.CreateWebhook.webhookSettings)
	}

	update := `mutation($id: ID!, $o: Boolean, $m: Int, $b: Int, $r: Int, $s: String) {
		updateWebhook(id: $id, ordered: $o, maxInFlight: $m, batchSize: $b, rateLimit: $r, status: $s) { status ` + settings + ` } }`
	var u struct {
		UpdateWebhook struct {
			Status string
			webhookSettings
		}
	}
	// Paused, so that the node's dispatcher sends nothing the recovery below queues.
	s.MustGraphQL(t, key, update, map[string]any{"id": id, "m": 4, "s": "paused"}, &u)
	if want := (webhookSettings{Ordered: true, MaxInFlight: 4, BatchSize: 50, RateLimit: 100}); u.UpdateWebhook.webhookSettings != want || u.UpdateWebhook.Status != "paused" {
		t.Errorf("updated maxInFlight: %+v, want %+v (the others unchanged)", u.UpdateWebhook, want)
	}
	s.MustGraphQL(t, key, update, map[string]any{"id": id, "o": false, "r": 0}, &u)
	if want := (webhookSettings{MaxInFlight: 4, BatchSize: 50}); u.UpdateWebhook.webhookSettings != want {
		t.Errorf("updated ordered and rateLimit: %+v, want %+v", u.UpdateWebhook.webhookSettings, want)
	}

	for _, tc := range []struct {
		vars  map[string]any
		field string
	}{
		{map[string]any{"m": 0}, "maxInFlight"},
		{map[string]any{"m": 65}, "maxInFlight"},
		{map[string]any{"b": 101}, "batchSize"},
		{map[string]any{"b": 0}, "batchSize"},
		{map[string]any{"r": -1}, "rateLimit"},
		{map[string]any{"r": 10001}, "rateLimit"},
	} {
		for name, q := range map[string]string{"createWebhook": create, "updateWebhook": update} {
			vars := map[string]any{"p": sepsis, "u": "https://hooks.example.org/bad", "id": id}
			for k, v := range tc.vars {
				vars[k] = v
			}
			if name == "updateWebhook" {
				delete(vars, "p")
				delete(vars, "u")
			} else {
				delete(vars, "id")
			}
			res := fails(t, s, key, q, vars, "BAD_USER_INPUT")
			fields, _ := res.Errors[0].Extensions["fields"].(map[string]any)
			if _, ok := fields[tc.field]; !ok || len(fields) != 1 {
				t.Errorf("%s %v: %+v, want the error to name %s alone", name, tc.vars, res.Errors, tc.field)
			}
		}
	}
	fails(t, s, key, update, map[string]any{"id": id, "m": "4"}, "BAD_USER_INPUT")
	fails(t, s, key, update, map[string]any{"id": id, "m": 1 << 40}, "BAD_USER_INPUT")
	var after struct {
		Webhooks []struct {
			ID string
			webhookSettings
		}
	}
	s.MustGraphQL(t, key, `query($p: ID!) { webhooks(projectId: $p) { id `+settings+` } }`, map[string]any{"p": sepsis}, &after)
	for _, w := range after.Webhooks {
		if want := (webhookSettings{MaxInFlight: 4, BatchSize: 50}); w.ID == id && w.webhookSettings != want {
			t.Errorf("after the refused changes: %+v, want %+v", w.webhookSettings, want)
		}
	}

	// One delivery of each finished status: all: false queues the failed one, all: true the rest.
	for _, status := range []string{"succeeded", "failed", "cancelled"} {
		if _, err := s.Pool().Exec(context.Background(), `insert into webhook_deliveries
	(id, org_id, webhook_id, event_id, event_type, event_created_at, body, status, attempt_count, completed_at)
select $1, org_id, id, $2, 'workflow.completed', now(), '{}', $3, 1, now() from webhooks where id = $4`,
			ids.New(ids.Delivery), ids.New(ids.Event), status, id); err != nil {
			t.Fatal(err)
		}
	}
	recoverQ := `mutation($id: ID!, $since: DateTime!, $all: Boolean) { recoverWebhookDeliveries(webhookId: $id, since: $since, all: $all) }`
	since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	for _, tc := range []struct {
		all  any
		want int
	}{{false, 1}, {nil, 0}, {true, 2}, {true, 0}} {
		vars := map[string]any{"id": id, "since": since}
		if tc.all != nil {
			vars["all"] = tc.all
		}
		var rec struct{ RecoverWebhookDeliveries int }
		s.MustGraphQL(t, key, recoverQ, vars, &rec)
		if rec.RecoverWebhookDeliveries != tc.want {
			t.Errorf("recoverWebhookDeliveries(all: %v) = %d, want %d", tc.all, rec.RecoverWebhookDeliveries, tc.want)
		}
	}
	if n := s.count(`select count(*) from webhook_deliveries where webhook_id = $1 and status = 'pending'`, id); n != 3 {
		t.Errorf("%d deliveries pending, want all 3", n)
	}
}
