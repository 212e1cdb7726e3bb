package pipelinetest_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	carehubnode "carehub/cmd/carehub/node"
	"carehub/e2e/servertest"
	"carehub/internal/testenv"
	"carehub/kernel/access"
	"carehub/kernel/whsig"
	"carehub/storage/demo"
)

// A hospital's receiver behind its own certificate authority: a node started with
// --webhooks-ca-file trusts it, delivers the project's events to it over HTTP/2 (which it
// offers), each signed, and its test send reaches it too. The receiver's certificate is
// httptest's, for 127.0.0.1, so the node allows loopback (as every test node does).
func TestWebhooksToAReceiverOfAPrivateCA(t *testing.T) {
	var mu sync.Mutex
	type got struct {
		proto, id, ts, sig string
		body               []byte
	}
	var reqs []got
	rcv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		reqs = append(reqs, got{r.Proto, r.Header.Get(whsig.HeaderID), r.Header.Get(whsig.HeaderTimestamp), r.Header.Get(whsig.HeaderSignature), body})
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	rcv.EnableHTTP2 = true
	rcv.StartTLS()
	defer rcv.Close()
	ca, _ := testenv.TLSFiles(t, rcv) // the hospital's authority

	s := servertest.Start(t, func(c *carehubnode.Config) { c.WebhooksCAFile = ca })
	admin := s.Key(demo.DemoOrgSlug, access.Live, access.AdminOrg, access.ExecWorkflows)
	project := s.ProjectID(demo.SepsisProjectName)
	typ := uniqueType(t, "tls")
	r := s.Do(http.MethodPost, "/v1/webhooks", admin, map[string]any{"projectId": project, "url": rcv.URL, "events": []string{typ}})
	var hook struct{ ID, Secret string }
	r.JSON(t, &hook)
	if r.Status != http.StatusCreated {
		t.Fatalf("create a webhook to %s: %d %s", rcv.URL, r.Status, r.Body)
	}

	var test struct {
		Success    bool
		StatusCode *int
		Error      *string
	}
	r = s.Do(http.MethodPost, "/api/v1/webhooks/test", admin, map[string]string{"webhookId": hook.ID})
	r.JSON(t, &test)
	if r.Status != http.StatusOK || !test.Success {
		t.Fatalf("test send over TLS: %d %s", r.Status, r.Body)
	}

	const n = 40
	evs := make([]map[string]any, n)
	for i := range evs {
		evs[i] = map[string]any{"projectId": project, "type": typ, "payload": map[string]any{"i": i}}
	}
	if r := s.Do(http.MethodPost, "/v1/events", admin, evs); r.Status != http.StatusAccepted {
		t.Fatalf("publish: %d %s", r.Status, r.Body)
	}
	servertest.Eventually(t, 60*time.Second, "the events at the receiver", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(reqs) >= n+1 // the test send and the events
	})
	mu.Lock()
	defer mu.Unlock()
	ids := map[string]bool{}
	for i, q := range reqs {
		if q.proto != "HTTP/2.0" {
			t.Errorf("request %d over %s, want HTTP/2.0 (the receiver offers it)", i, q.proto)
		}
		if !whsig.Verify(hook.Secret, q.id, q.ts, q.body, q.sig) {
			t.Errorf("request %d: the signature does not verify", i)
		}
		ids[q.id] = true
	}
	if len(ids) != n+1 {
		t.Errorf("%d distinct webhook-ids in %d requests, want %d", len(ids), len(reqs), n+1)
	}
}
