package rest_test

import (
	"context"
	"net/http"
	"testing"

	"carehub/api/envelope"
	"carehub/kernel/ids"
	"carehub/processors/webhooks"
)

// The delivery settings of a subscription (issue 55): ordered, maxInFlight, batchSize and
// rateLimit are taken on create and change, answered back, and listed.
func TestWebhookRoutesDeliverySettings(t *testing.T) {
	a := newWebhookAPI(t, webhooks.ServiceConfig{AllowPrivate: true})

	plain := a.create("https://hooks.example.com/plain")
	if plain.Ordered || plain.MaxInFlight != webhooks.DefaultMaxInFlightPerSubscription || plain.BatchSize != 1 || plain.RateLimit != 0 {
		t.Errorf("created without settings: %+v, want the defaults (concurrent, 16 in flight, batch 1, no limit)", plain.Settings)
	}

	r := a.do("POST", "/v1/webhooks", "admin", map[string]any{"projectId": a.project, "url": "https://hooks.example.com/ordered",
		"events": []string{"agent.*"}, "ordered": true, "batchSize": 50, "rateLimit": 100})
	var sub webhooks.Subscription
	r.decode(t, &sub)
	if want := (webhooks.Settings{Ordered: true, MaxInFlight: webhooks.DefaultMaxInFlightPerSubscription, BatchSize: 50, RateLimit: 100}); r.status != http.StatusCreated || sub.Settings != want {
		t.Fatalf("create with settings: %d %s, want %+v", r.status, r.body, want)
	}
	var got webhooks.Subscription
	a.do("GET", "/v1/webhooks/"+sub.ID, "reader", nil).decode(t, &got)
	if got.Settings != sub.Settings {
		t.Errorf("GET /v1/webhooks/{id}: %+v, want %+v", got.Settings, sub.Settings)
	}

	var list struct {
		Data []map[string]any `json:"data"`
	}
	r = a.do("GET", "/v1/webhooks?projectId="+a.project, "reader", nil)
	r.decode(t, &list)
	if r.status != http.StatusOK || len(list.Data) != 2 {
		t.Fatalf("GET /v1/webhooks: %d %s", r.status, r.body)
	}
	for _, w := range list.Data {
		want := map[string]any{"ordered": false, "maxInFlight": 16.0, "batchSize": 1.0, "rateLimit": 0.0}
		if w["id"] == sub.ID {
			want = map[string]any{"ordered": true, "maxInFlight": 16.0, "batchSize": 50.0, "rateLimit": 100.0}
		}
		for k, v := range want {
			if w[k] != v {
				t.Errorf("GET /v1/webhooks: %v has %s %v, want %v", w["id"], k, w[k], v)
			}
		}
	}

	r = a.do("PATCH", "/v1/webhooks/"+sub.ID, "admin", map[string]any{"maxInFlight": 4})
	var patched webhooks.Subscription
	r.decode(t, &patched)
	if want := (webhooks.Settings{Ordered: true, MaxInFlight: 4, BatchSize: 50, RateLimit: 100}); r.status != http.StatusOK || patched.Settings != want {
		t.Errorf("PATCH maxInFlight 4: %d %s, want %+v (the others unchanged)", r.status, r.body, want)
	}
	r = a.do("PATCH", "/v1/webhooks/"+sub.ID, "admin", map[string]any{"ordered": false, "rateLimit": 0})
	r.decode(t, &patched)
	if want := (webhooks.Settings{MaxInFlight: 4, BatchSize: 50}); r.status != http.StatusOK || patched.Settings != want {
		t.Errorf("PATCH ordered false, rateLimit 0: %d %s, want %+v", r.status, r.body, want)
	}

	for _, tc := range []struct {
		method, path string
		body         map[string]any
		field        string
	}{
		{"POST", "/v1/webhooks", map[string]any{"maxInFlight": 0}, "maxInFlight"},
		{"POST", "/v1/webhooks", map[string]any{"maxInFlight": 65}, "maxInFlight"},
		{"POST", "/v1/webhooks", map[string]any{"batchSize": 101}, "batchSize"},
		{"POST", "/v1/webhooks", map[string]any{"batchSize": 0}, "batchSize"},
		{"POST", "/v1/webhooks", map[string]any{"rateLimit": -1}, "rateLimit"},
		{"POST", "/v1/webhooks", map[string]any{"rateLimit": 10001}, "rateLimit"},
		{"PATCH", "/v1/webhooks/" + sub.ID, map[string]any{"maxInFlight": 0}, "maxInFlight"},
		{"PATCH", "/v1/webhooks/" + sub.ID, map[string]any{"batchSize": 101}, "batchSize"},
		{"PATCH", "/v1/webhooks/" + sub.ID, map[string]any{"rateLimit": -1}, "rateLimit"},
	} {
		body := tc.body
		if tc.method == "POST" {
			body = map[string]any{"projectId": a.project, "url": "https://hooks.example.com/bad", "events": []string{"agent.*"}}
			for k, v := range tc.body {
				body[k] = v
			}
		}
		wantFieldError(t, tc.method+" "+tc.path, a.do(tc.method, tc.path, "admin", body), tc.field)
	}
	for _, body := range []string{`{"maxInFlight":"4"}`, `{"ordered":1}`, `{"batchSize":1.5}`} {
		if r := a.do("PATCH", "/v1/webhooks/"+sub.ID, "admin", body); r.status != http.StatusBadRequest || r.code(t) != "INVALID_REQUEST" {
			t.Errorf("PATCH %s: %d %s, want 400 INVALID_REQUEST", body, r.status, r.body)
		}
	}
	var after webhooks.Subscription
	a.do("GET", "/v1/webhooks/"+sub.ID, "admin", nil).decode(t, &after)
	if want := (webhooks.Settings{MaxInFlight: 4, BatchSize: 50}); after.Settings != want {
		t.Errorf("after the refused changes: %+v, want %+v", after.Settings, want)
	}
}

// POST /v1/webhooks/{id}/recover takes status failed (the default) or all.
func TestWebhookRoutesRecoverStatus(t *testing.T) {
	a := newWebhookAPI(t, webhooks.ServiceConfig{AllowPrivate: true})
	sub := a.create("https://hooks.example.com/in")
	for _, status := range []string{"succeeded", "failed", "cancelled", "succeeded"} {
		if _, err := a.pool.Exec(context.Background(), `insert into webhook_deliveries
	(id, org_id, webhook_id, event_id, event_type, event_created_at, body, status, attempt_count, completed_at)
values ($1, $2, $3, $4, 'workflow.completed', now(), '{}', $5, 1, now())`,
			ids.New(ids.Delivery), a.orgID, sub.ID, ids.New(ids.Event), status); err != nil {
			t.Fatal(err)
		}
	}
	recoverWith := func(body map[string]string) (response, int) {
		t.Helper()
		body["since"] = "2020-01-01T00:00:00Z"
		r := a.do("POST", "/v1/webhooks/"+sub.ID+"/recover", "admin", body)
		var out struct {
			Recovered int `json:"recovered"`
		}
		if r.status == http.StatusAccepted {
			r.decode(t, &out)
		}
		return r, out.Recovered
	}
	for _, tc := range []struct {
		body map[string]string
		want int
	}{
		{map[string]string{"status": "failed"}, 1},
		{map[string]string{}, 0}, // the failed one is pending again
		{map[string]string{"status": "all"}, 3},
		{map[string]string{"status": "all"}, 0},
	} {
		if r, n := recoverWith(tc.body); r.status != http.StatusAccepted || n != tc.want {
			t.Errorf("recover %v: %d %s, want 202 with %d recovered", tc.body, r.status, r.body, tc.want)
		}
	}
	for _, status := range []string{"bogus", "succeeded", "FAILED"} {
		r, _ := recoverWith(map[string]string{"status": status})
		wantFieldError(t, "recover status "+status, r, "status")
	}
	if pending := a.count(`select count(*) from webhook_deliveries where webhook_id = $1 and status = 'pending'`, sub.ID); pending != 4 {
		t.Errorf("%d deliveries pending, want all 4", pending)
	}
}

// wantFieldError checks a validation answer (422 VALIDATION_FAILED, the way the webhook routes
// report bad input) whose details name field.
func wantFieldError(t *testing.T, what string, r response, field string) {
	t.Helper()
	if r.status != http.StatusUnprocessableEntity || r.code(t) != "VALIDATION_FAILED" {
		t.Errorf("%s: %d %s, want 422 VALIDATION_FAILED", what, r.status, r.body)
		return
	}
	var e envelope.ErrorBody
	r.decode(t, &e)
	fields, _ := e.Error.Details["fields"].(map[string]any)
	if _, ok := fields[field]; !ok || len(fields) != 1 {
		t.Errorf("%s: %s, want the details to name %s alone", what, r.body, field)
	}
}

func (a *webhookAPI) count(sql string, args ...any) int {
	a.t.Helper()
	var n int
	if err := a.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		a.t.Fatal(err)
	}
	return n
}
