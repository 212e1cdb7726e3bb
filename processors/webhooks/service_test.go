package webhooks

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"carehub/kernel/access"
	"carehub/kernel/events"
	"carehub/kernel/fault"
	"carehub/kernel/whsig"
)

func TestCreateValidatesAndScopes(t *testing.T) {
	f := newFixture(t)
	otherOrg := f.addOrg("other")
	otherProject := f.addProject(otherOrg)
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		project string
		events  []string
		want    fault.Kind
	}{
		{"no events", f.admin, f.projectID, nil, fault.KindValidation},
		{"bad pattern", f.admin, f.projectID, []string{"agent.*.x"}, fault.KindValidation},
		{"bare prefix", f.admin, f.projectID, []string{"agent"}, fault.KindValidation},
		{"upper case", f.admin, f.projectID, []string{"Agent.run"}, fault.KindValidation},
		{"another org's project", f.admin, otherProject, []string{"*"}, fault.KindNotFound},
		{"no such project", f.admin, "prj_01jxxxxxxxxxxxxxxxxxxxxxxx", []string{"*"}, fault.KindNotFound},
		{"without admin:org", principal(f.orgID, access.ExecWorkflows), f.projectID, []string{"*"}, fault.KindInsufficientScope},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.svc.Create(tc.ctx, tc.project, "https://hooks.example.com/x", tc.events, Options{})
			if fault.KindOf(err) != tc.want {
				t.Errorf("err = %v (kind %d), want kind %d", err, fault.KindOf(err), tc.want)
			}
		})
	}
	sub, err := f.svc.Create(f.admin, f.projectID, "https://hooks.example.com/x", []string{"agent.*", "agent.*", "workflow.run.completed", "*"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sub.Events, []string{"agent.*", "workflow.run.completed", "*"}) {
		t.Errorf("events %v: want duplicates removed, order kept", sub.Events)
	}
	if !strings.HasPrefix(sub.ID, "wh_") || sub.Status != StatusActive || sub.FailureCount != 0 || sub.LastDeliveredAt != nil ||
		sub.ProjectID != f.projectID || len(sub.Secret) != len("whsec_")+44 {
		t.Errorf("created %+v", sub)
	}
}

func TestReadsMaskSecretsAndRespectTenancy(t *testing.T) {
	f := newFixture(t)
	sub := f.create("https://hooks.example.com/a", "*")
	masked := "whsec_…" + sub.Secret[len(sub.Secret)-4:]
	reader := principal(f.orgID) // any valid credential reads subscriptions
	got, err := f.svc.Get(reader, sub.ID)
	if err != nil || got.Secret != masked {
		t.Fatalf("Get: %+v, %v; want the secret masked as %s", got, err, masked)
	}
	list, err := f.svc.List(reader, f.projectID)
	if err != nil || len(list) != 1 || list[0].Secret != masked {
		t.Fatalf("List: %+v, %v", list, err)
	}
	byID, err := f.svc.ByIDs(reader, []string{sub.ID, "wh_missing"})
	if err != nil || len(byID) != 1 || byID[sub.ID].Secret != masked {
		t.Fatalf("ByIDs: %+v, %v", byID, err)
	}

	outsider := principal(f.addOrg("outsider"), access.AdminOrg)
	if _, err := f.svc.Get(outsider, sub.ID); fault.KindOf(err) != fault.KindNotFound {
		t.Errorf("another org's Get: %v, want NOT_FOUND", err)
	}
	if _, err := f.svc.List(outsider, f.projectID); fault.KindOf(err) != fault.KindNotFound {
		t.Errorf("another org's List: %v, want NOT_FOUND", err)
	}
	if m, err := f.svc.ByIDs(outsider, []string{sub.ID}); err != nil || len(m) != 0 {
		t.Errorf("another org's ByIDs: %v, %v", m, err)
	}
	stop := StatusPaused
	if _, err := f.svc.Update(outsider, sub.ID, Update{Status: &stop}); fault.KindOf(err) != fault.KindNotFound {
		t.Errorf("another org's Update: %v", err)
	}
	if _, err := f.svc.RotateSecret(outsider, sub.ID); fault.KindOf(err) != fault.KindNotFound {
		t.Errorf("another org's RotateSecret: %v", err)
	}
	if err := f.svc.Delete(outsider, sub.ID); fault.KindOf(err) != fault.KindNotFound {
		t.Errorf("another org's Delete: %v", err)
	}
	if _, err := f.svc.Deliveries(outsider, sub.ID, "", 0, 0); fault.KindOf(err) != fault.KindNotFound {
		t.Errorf("another org's Deliveries: %v", err)
	}
	if _, err := f.svc.Get(context.Background(), sub.ID); fault.KindOf(err) != fault.KindUnauthenticated {
		t.Errorf("no credential: %v", err)
	}
	platform := access.With(context.Background(), &access.Principal{Platform: true, Mode: access.Live})
	if got, err := f.svc.Get(platform, sub.ID); err != nil || got.Secret != masked {
		t.Errorf("platform operator Get: %+v, %v", got, err)
	}

	rotated, err := f.svc.RotateSecret(f.admin, sub.ID)
	if err != nil || rotated.Secret == sub.Secret || strings.Contains(rotated.Secret, "…") {
		t.Fatalf("RotateSecret: %+v, %v; want a new full secret", rotated, err)
	}
}

func TestUpdateChangesStatusURLAndEvents(t *testing.T) {
	f := newFixture(t)
	sub := f.create("https://hooks.example.com/a", "*")
	for _, bad := range []string{"failing", "deleted", ""} {
		if _, err := f.svc.Update(f.admin, sub.ID, Update{Status: &bad}); fault.KindOf(err) != fault.KindValidation {
			t.Errorf("status %q: %v", bad, err)
		}
	}
	if _, err := f.svc.Update(f.admin, sub.ID, Update{Events: []string{}}); fault.KindOf(err) != fault.KindValidation {
		t.Errorf("empty events: %v", err)
	}
	url := "https://hooks.example.com/b"
	paused := StatusPaused
	got, err := f.svc.Update(f.admin, sub.ID, Update{URL: &url, Events: []string{"agent.*"}, Status: &paused})
	if err != nil || got.URL != url || !slices.Equal(got.Events, []string{"agent.*"}) || got.Status != StatusPaused {
		t.Fatalf("Update: %+v, %v", got, err)
	}
	if _, err := f.pool.Exec(t.Context(), `update webhooks set failure_count = 7, status = 'paused' where id = $1`, sub.ID); err != nil {
		t.Fatal(err)
	}
	active := StatusActive
	got, err = f.svc.Update(f.admin, sub.ID, Update{Status: &active})
	if err != nil || got.Status != StatusActive || got.FailureCount != 0 || got.URL != url {
		t.Fatalf("resume: %+v, %v; want active with failureCount 0", got, err)
	}
	if err := f.svc.Delete(f.admin, sub.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Delete(f.admin, sub.ID); fault.KindOf(err) != fault.KindNotFound {
		t.Errorf("second delete: %v", err)
	}
	if list, err := f.svc.List(f.admin, f.projectID); err != nil || len(list) != 0 {
		t.Errorf("List after delete: %v, %v", list, err)
	}
}

func TestFailedDeliveriesCanBeRedeliveredAndRecovered(t *testing.T) {
	f := newFixture(t)
	var healthy atomic.Bool
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		if healthy.Load() {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusInternalServerError)
	})
	sub := f.create(rc.URL, "*")
	f.start(func(c *DispatcherConfig) { c.Schedule = []time.Duration{0, 10 * time.Millisecond} })
	var evs []events.Event
	for range 3 {
		evs = append(evs, f.publish("agent.run.failed", nil))
	}
	for _, ev := range evs {
		f.waitDeliveryStatus(sub.ID, ev.ID, DeliveryFailed)
	}
	failed, err := f.svc.Deliveries(f.admin, sub.ID, DeliveryFailed, 0, 0)
	if err != nil || len(failed) != 3 {
		t.Fatalf("failed deliveries: %v, %v", failed, err)
	}
	// Newest delivery first. (The consumer begins a poll's deliveries before it records the poll
	// before, so deliveries of events a poll apart may be recorded in either order.)
	listed := map[string]bool{}
	for i, d := range failed {
		listed[d.EventID] = true
		if i > 0 && d.CreatedAt.After(failed[i-1].CreatedAt) || d.AttemptCount != 2 || d.NextAttemptAt != nil {
			t.Errorf("listing %+v", failed)
		}
	}
	if !listed[evs[0].ID] || !listed[evs[1].ID] || !listed[evs[2].ID] {
		t.Errorf("listing %+v, want the deliveries of %s, %s and %s", failed, evs[0].ID, evs[1].ID, evs[2].ID)
	}
	if page, err := f.svc.Deliveries(f.admin, sub.ID, "", 1, 1); err != nil || len(page) != 1 || page[0].ID != failed[1].ID {
		t.Errorf("limit 1 offset 1: %+v, %v", page, err)
	}
	for _, tc := range []struct {
		status        string
		limit, offset int
	}{{"weird", 0, 0}, {"", 101, 0}, {"", -1, 0}, {"", 0, -1}} {
		if _, err := f.svc.Deliveries(f.admin, sub.ID, tc.status, tc.limit, tc.offset); fault.KindOf(err) != fault.KindValidation {
			t.Errorf("Deliveries(%q, %d, %d): %v", tc.status, tc.limit, tc.offset, err)
		}
	}
	one, err := f.svc.Delivery(f.admin, failed[0].ID)
	if err != nil || !strings.Contains(string(one.Body), `"event":"agent.run.failed"`) {
		t.Fatalf("Delivery: %+v, %v", one, err)
	}

	healthy.Store(true)
	d, err := f.svc.Redeliver(f.admin, failed[2].ID)
	if err != nil || d.Status != DeliveryPending {
		t.Fatalf("Redeliver: %+v, %v", d, err)
	}
	f.waitDeliveryStatus(sub.ID, failed[2].EventID, DeliverySucceeded)
	if codes := f.attemptCodes(failed[2].ID); !slices.Equal(codes, []int{500, 500, 200}) {
		t.Errorf("attempts after redelivery: %v", codes)
	}
	// A succeeded delivery can be sent again too.
	if d, err := f.svc.Redeliver(f.admin, failed[2].ID); err != nil || d.Status != DeliveryPending {
		t.Errorf("Redeliver succeeded: %+v, %v", d, err)
	}
	f.waitDeliveryStatus(sub.ID, failed[2].EventID, DeliverySucceeded)

	n, err := f.svc.Recover(f.admin, sub.ID, time.Now().Add(-time.Hour), false)
	if err != nil || n != 2 {
		t.Fatalf("Recover: %d, %v; want the 2 still failed", n, err)
	}
	for _, d := range failed[:2] {
		f.waitDeliveryStatus(sub.ID, d.EventID, DeliverySucceeded)
	}
	if n, err := f.svc.Recover(f.admin, sub.ID, time.Now().Add(-time.Hour), false); err != nil || n != 0 {
		t.Errorf("second Recover: %d, %v", n, err)
	}
	outsider := principal(f.addOrg("outsider"), access.AdminOrg)
	if _, err := f.svc.Redeliver(outsider, failed[0].ID); fault.KindOf(err) != fault.KindNotFound {
		t.Errorf("another org's Redeliver: %v", err)
	}
	if _, err := f.svc.Recover(outsider, sub.ID, time.Now(), false); fault.KindOf(err) != fault.KindNotFound {
		t.Errorf("another org's Recover: %v", err)
	}
	if _, err := f.svc.Delivery(outsider, failed[0].ID); fault.KindOf(err) != fault.KindNotFound {
		t.Errorf("another org's Delivery: %v", err)
	}
	if m, err := f.svc.Attempts(outsider, []string{failed[0].ID}); err != nil || len(m) != 0 {
		t.Errorf("another org's Attempts: %v, %v", m, err)
	}
	if _, err := f.svc.Recover(f.admin, sub.ID, time.Time{}, false); fault.KindOf(err) != fault.KindValidation {
		t.Errorf("Recover without since: %v", err)
	}
	// Too old to redeliver.
	if _, err := f.pool.Exec(t.Context(), `update webhook_deliveries set status = 'failed', created_at = now() - interval '31 days' where id = $1`, failed[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Redeliver(f.admin, failed[0].ID); fault.KindOf(err) != fault.KindConflict {
		t.Errorf("Redeliver after 30 days: %v, want CONFLICT", err)
	}
	if err := f.svc.Delete(f.admin, sub.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Redeliver(f.admin, failed[1].ID); fault.KindOf(err) != fault.KindNotFound {
		t.Errorf("Redeliver of a deleted subscription's delivery: %v", err)
	}
}

func TestTestSendSignsTheSampleEvent(t *testing.T) {
	f := newFixture(t)
	rc := newReceiver(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		w.Write([]byte(strings.Repeat("x", 5000)))
	})
	sub := f.create(rc.URL, "agent.*")
	res, err := f.svc.Test(f.admin, TestRequest{WebhookID: sub.ID})
	if err != nil {
		t.Fatal(err)
	}
	req := rc.waitRequests(t, 1, 10*time.Second)[0]
	if !res.Success || res.StatusCode == nil || *res.StatusCode != 202 || res.Secret != "" ||
		res.ResponseBody == nil || len(*res.ResponseBody) != responseBodyLimit || res.Request.URL != rc.URL {
		t.Errorf("result %+v", res)
	}
	if res.Request.Body != string(req.Body) || res.Request.Headers["Webhook-Id"] != req.id() ||
		!whsig.Verify(sub.Secret, req.id(), req.Header.Get(whsig.HeaderTimestamp), req.Body, req.Header.Get(whsig.HeaderSignature)) {
		t.Errorf("the reported request is not what was sent, or it is not signed with the subscription's secret")
	}
	for _, field := range []string{`"event":"workflow.run.completed"`, `"project_id":"` + f.projectID, `"org_id":"` + f.orgID,
		`"run_id":"run_`, `"workflow_id":"wf_`, `"status":"COMPLETED"`, `"duration_ms":`, `"alert_generated":true`, `"severity":"HIGH"`} {
		if !strings.Contains(string(req.Body), field) {
			t.Errorf("sample body %s lacks %s", req.Body, field)
		}
	}
	if n := len(f.deliveries(sub.ID)); n != 0 {
		t.Errorf("a test send recorded %d deliveries", n)
	}
	if _, err := f.svc.Test(f.admin, TestRequest{}); fault.KindOf(err) != fault.KindValidation {
		t.Errorf("neither webhookId nor url: %v", err)
	}
	if _, err := f.svc.Test(principal(f.addOrg("x"), access.AdminOrg), TestRequest{WebhookID: sub.ID}); fault.KindOf(err) != fault.KindNotFound {
		t.Errorf("another org's webhook: %v", err)
	}
	// A receiver that is down is an answer, not an error.
	rc.Close()
	res, err = f.svc.Test(f.admin, TestRequest{URL: rc.URL})
	if err != nil || res.Success || res.StatusCode != nil || res.Error == nil || !strings.HasPrefix(res.Secret, whsig.SecretPrefix) {
		t.Errorf("test to a closed port: %+v, %v", res, err)
	}
}
