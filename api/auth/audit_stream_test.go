package auth

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/mux"
	"github.com/twmb/franz-go/pkg/kfake"

	"carehub/api/envelope"
	"carehub/internal/testenv"
	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/kernel/ids"
	"carehub/processors/audit"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

// streamAPI serves GET /v1/stream: parts parts, each touching patient pat_<i>, writing a line
// naming it and flushing, as an export does per chunk. Before each part after the first it
// waits for next (when not nil), so a test can act between parts.
func streamAPI(a *Authenticator, aud *Auditor, parts int, next <-chan struct{}) http.Handler {
	r := mux.NewRouter()
	r.Use(aud.Middleware(nil), a.Middleware(nil))
	r.HandleFunc("/v1/stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for i := range parts {
			if i > 0 && next != nil {
				<-next
			}
			access.Touch(r.Context(), access.KindPatient, fmt.Sprintf("pat_%d", i))
			if _, err := fmt.Fprintf(w, "{\"patient\":\"pat_%d\",\"name\":%q}\n", i, patientName); err != nil {
				return // the part before was not sent: stop, as an export does
			}
			w.(http.Flusher).Flush()
		}
	}).Methods(http.MethodGet)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		id := ids.New(ids.Request)
		w.Header().Set("Request-Id", id)
		r.ServeHTTP(w, req.WithContext(envelope.WithRequestID(req.Context(), id)))
	})
}

// TestAuditStreamedInParts: a live-key response that flushes (an export) goes out part by
// part, each part once the record of the patients it carries is stored, instead of being held
// whole until the call ends: the client reads the first part while the handler still waits, and
// the audit log holds one record per part (the request id and ".n") naming that part's patient.
func TestAuditStreamedInParts(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	org := pgtest.NewOrg(t, pool)
	live := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live, Scopes: []string{access.ReadPatients}})
	topic, pub := auditTopic(t)
	store := postgres.NewAuditLog(pool)
	w, err := audit.NewWriter(audit.WriterConfig{Brokers: kafkatest.Brokers(t), Topic: topic, Group: kafkatest.Group(t, "audit"), Store: store})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Run(t, w.Run)
	next := make(chan struct{})
	srv := httptest.NewServer(streamAPI(NewAuthenticator(keys, nil, AuthenticatorConfig{}), NewAuditor(pub, AuditorConfig{}), 3, next))
	t.Cleanup(srv.Close)

	resp := openStream(t, srv.URL+"/v1/stream", live.Secret)
	id := resp.Header.Get("Request-Id")
	lines := bufio.NewReader(resp.Body)
	for i := range 3 {
		line, err := lines.ReadString('\n')
		if err != nil || !strings.Contains(line, fmt.Sprintf("pat_%d", i)) {
			t.Fatalf("part %d: %q, %v", i, line, err)
		}
		// The part is out while the handler waits: its record was stored before it was sent.
		rec := storedRecord(t, store, fmt.Sprintf("%s.%d", id, i+1))
		if !slices.Equal(rec.PatientIDs, []string{fmt.Sprintf("pat_%d", i)}) || rec.Operation != "GET /v1/stream" || rec.KeyID != live.ID {
			t.Fatalf("record of part %d: %+v", i, rec)
		}
		if i < 2 {
			next <- struct{}{}
		}
	}
	if rest, err := io.ReadAll(lines); err != nil || len(rest) != 0 {
		t.Fatalf("after the last part: %q, %v", rest, err)
	}
	// The call's own record: nothing touched after the last part.
	if rec := storedRecord(t, store, id); len(rec.PatientIDs) != 0 || rec.Status != http.StatusOK {
		t.Fatalf("the call's record: %+v", rec)
	}
}

// TestAuditStreamCutWhenUnaudited: when a part's record cannot be acknowledged (the broker went
// away mid-download), that part is never sent, and the download is cut so the client knows it is
// incomplete.
func TestAuditStreamCutWhenUnaudited(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	live := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: pgtest.NewOrg(t, pool), Mode: access.Live, Scopes: []string{access.ReadPatients}})
	cluster, pub := ownBroker(t)
	next := make(chan struct{})
	srv := httptest.NewServer(streamAPI(NewAuthenticator(keys, nil, AuthenticatorConfig{}), NewAuditor(pub, AuditorConfig{AckTimeout: 300 * time.Millisecond}), 3, next))
	t.Cleanup(srv.Close)

	resp := openStream(t, srv.URL+"/v1/stream", live.Secret)
	lines := bufio.NewReader(resp.Body)
	if line, err := lines.ReadString('\n'); err != nil || !strings.Contains(line, "pat_0") {
		t.Fatalf("first part: %q, %v", line, err)
	}
	cluster.Close()
	close(next)
	rest, err := io.ReadAll(lines)
	if err == nil {
		t.Errorf("the download ended cleanly after an unaudited part; want it cut")
	}
	if strings.Contains(string(rest), "pat_1") || strings.Contains(string(rest), "pat_2") {
		t.Fatalf("unaudited parts were sent: %q", rest)
	}
}

// TestAuditStreamUnauditedFirstPart: when the first part's record fails, nothing has been sent
// and the call is answered 503 as a whole response would be.
func TestAuditStreamUnauditedFirstPart(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	live := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: pgtest.NewOrg(t, pool), Mode: access.Live, Scopes: []string{access.ReadPatients}})
	cluster, pub := ownBroker(t)
	cluster.Close()
	srv := httptest.NewServer(streamAPI(NewAuthenticator(keys, nil, AuthenticatorConfig{}), NewAuditor(pub, AuditorConfig{AckTimeout: 300 * time.Millisecond}), 3, nil))
	t.Cleanup(srv.Close)
	c := do(t, http.MethodGet, srv.URL+"/v1/stream", live.Secret, "", "")
	if c.status != http.StatusServiceUnavailable || strings.Contains(c.body, patientName) {
		t.Fatalf("stream with no broker: %d %s", c.status, c.body)
	}
}

// ownBroker starts a broker of the test's own with the audit topic, and a publisher to it, for
// tests in which the broker goes away.
func ownBroker(t *testing.T) (*kfake.Cluster, *audit.Publisher) {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "audit"))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := audit.NewPublisher(audit.PublisherConfig{Brokers: cluster.ListenAddrs(), Topic: "audit"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close(time.Second) })
	return cluster, pub
}

// openStream starts GET url with key as its bearer and returns the response, its body to be read; it is
// closed when the test ends.
func openStream(t *testing.T, url, key string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}
