package auth

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/api/envelope"
	"carehub/internal/testenv"
	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
	"carehub/processors/audit"
	"carehub/storage"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

const patientName = "Ada Lovelace-Byron"

// patientAPI is a stand-in for the patient endpoints: it reads the caller's patient through
// access and touches it, as the patient service does.
func patientAPI(a *Authenticator, aud *Auditor) http.Handler {
	r := mux.NewRouter()
	r.Use(aud.Middleware(nil), a.Middleware(nil))
	r.HandleFunc("/v1/patients/{id}", func(w http.ResponseWriter, r *http.Request) {
		if _, err := access.Require(r.Context(), access.ReadPatients); err != nil {
			envelope.WriteError(w, r, err)
			return
		}
		id := mux.Vars(r)["id"]
		access.Touch(r.Context(), access.KindPatient, id)
		envelope.WriteJSON(w, http.StatusOK, map[string]any{"id": id, "name": patientName})
	}).Methods(http.MethodGet)
	// As observation intake answers while Kafka is down: it touched the patient, and failed.
	r.HandleFunc("/v1/observations", func(w http.ResponseWriter, r *http.Request) {
		access.Touch(r.Context(), access.KindPatient, "pat_1")
		envelope.WriteError(w, r, fault.Unavailable("%s", intakeDown))
	}).Methods(http.MethodPost)
	r.HandleFunc("/v1/organizations", func(w http.ResponseWriter, r *http.Request) {
		envelope.WriteJSON(w, http.StatusOK, map[string]any{"data": []any{}})
	}).Methods(http.MethodGet)
	r.HandleFunc("/graphql", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !bytes.Contains(body, []byte("patient")) {
			envelope.WriteError(w, r, io.ErrUnexpectedEOF)
			return
		}
		access.Touch(r.Context(), access.KindPatient, "pat_gql")
		access.Touch(r.Context(), access.KindObservation, "obs_gql")
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"data":{"patient":{"id":"pat_gql","name":[{"family":"`+patientName+`"}]}}}`)
	}).Methods(http.MethodPost)
	// The request id as the server's outer middleware sets it.
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		id := ids.New(ids.Request)
		w.Header().Set("Request-Id", id)
		r.ServeHTTP(w, req.WithContext(envelope.WithRequestID(req.Context(), id)))
	})
}

// intakeDown is the intake's own 503 message in patientAPI.
const intakeDown = "observation intake is unavailable: the Kafka broker cannot be reached"

// auditTopic returns a new audit topic on the test's broker and a publisher to it, closed when
// the test ends.
func auditTopic(t *testing.T) (string, *audit.Publisher) {
	t.Helper()
	topic := kafkatest.Topic(t, "audit")
	pub, err := audit.NewPublisher(audit.PublisherConfig{Brokers: kafkatest.Brokers(t), Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close(5 * time.Second) })
	return topic, pub
}

type call struct {
	status int
	header http.Header
	body   string
}

// do sends method url with key as its bearer (none when key is ""), and body (when not "") as
// contentType, from the User-Agent the audit tests look for.
func do(t *testing.T, method, url, key, contentType, body string) call {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, rd)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("User-Agent", "carehub-audit-test/1")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return call{resp.StatusCode, resp.Header, string(b)}
}

func storedRecord(t *testing.T, store storage.AuditLog, id string) storage.AuditRecord {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		page, err := store.QueryAudit(context.Background(), storage.AuditQuery{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			if r.ID == id {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit record %s not stored within 30s", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func recordsOf(t *testing.T, store storage.AuditLog, keyID string) []storage.AuditRecord {
	t.Helper()
	page, err := store.QueryAudit(context.Background(), storage.AuditQuery{KeyID: keyID, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return page.Records
}

// TestAuditThroughKafka follows live-key calls through the publisher, the audit topic and the
// audit writer into the Postgres audit store.
func TestAuditThroughKafka(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	org := pgtest.NewOrg(t, pool)
	live := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live, Scopes: []string{access.ReadPatients}})
	test := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Test, Scopes: []string{access.ReadPatients}})
	fenced := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live, Scopes: []string{access.ReadPatients}, IPAllowlist: []string{"10.0.0.0/8"}})
	noScope := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live})

	topic, pub := auditTopic(t)
	store := postgres.NewAuditLog(pool)
	w, err := audit.NewWriter(audit.WriterConfig{Brokers: kafkatest.Brokers(t), Topic: topic, Group: kafkatest.Group(t, "audit"), Store: store})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Run(t, w.Run)

	srv := httptest.NewServer(patientAPI(NewAuthenticator(keys, nil, AuthenticatorConfig{}), NewAuditor(pub, AuditorConfig{})))
	t.Cleanup(srv.Close)

	// A live-key patient read: exactly one record, naming the patient.
	c := do(t, http.MethodGet, srv.URL+"/v1/patients/pat_123", live.Secret, "", "")
	if c.status != http.StatusOK || !strings.Contains(c.body, patientName) || c.header.Get("RateLimit-Limit") == "" {
		t.Fatalf("live patient read: %d %v %s", c.status, c.header, c.body)
	}
	got := storedRecord(t, store, c.header.Get("Request-Id"))
	want := storage.AuditRecord{ID: c.header.Get("Request-Id"), OrgID: org, KeyID: live.ID, Mode: access.Live, ClientIP: "127.0.0.1",
		UserAgent: "carehub-audit-test/1", Operation: "GET /v1/patients/{id}", ResourceIDs: []string{"pat_123"},
		PatientIDs: []string{"pat_123"}, Outcome: "success", Status: 200}
	got.Time, got.LatencyMs = time.Time{}, 0
	if !sameAudit(got, want) {
		t.Fatalf("stored %+v\nwant   %+v", got, want)
	}

	// A test-key read leaves no record; a live call after it (same organization, so the same
	// partition) shows the writer got past it.
	if c := do(t, http.MethodGet, srv.URL+"/v1/patients/pat_123", test.Secret, "", ""); c.status != http.StatusOK {
		t.Fatalf("test-key read: %d %s", c.status, c.body)
	}
	marker := do(t, http.MethodGet, srv.URL+"/v1/organizations", live.Secret, "", "")
	if m := storedRecord(t, store, marker.header.Get("Request-Id")); m.Operation != "GET /v1/organizations" || len(m.PatientIDs) != 0 {
		t.Fatalf("non-patient record %+v", m)
	}
	if rs := recordsOf(t, store, test.ID); len(rs) != 0 {
		t.Fatalf("test-key calls were audited: %+v", rs)
	}
	if rs := recordsOf(t, store, live.ID); len(rs) != 2 {
		t.Fatalf("%d records of the live key, want exactly 2", len(rs))
	}

	// Refusals are recorded as denied, with the key that was refused.
	c = do(t, http.MethodGet, srv.URL+"/v1/patients/pat_123", fenced.Secret, "", "")
	if c.status != http.StatusForbidden {
		t.Fatalf("fenced key: %d %s", c.status, c.body)
	}
	if r := storedRecord(t, store, c.header.Get("Request-Id")); r.Outcome != "denied" || r.Status != 403 || r.KeyID != fenced.ID || len(r.PatientIDs) != 0 {
		t.Fatalf("refused call recorded as %+v", r)
	}
	c = do(t, http.MethodGet, srv.URL+"/v1/patients/pat_123", noScope.Secret, "", "")
	if c.status != http.StatusForbidden || strings.Contains(c.body, patientName) {
		t.Fatalf("key without read:patients: %d %s", c.status, c.body)
	}
	if r := storedRecord(t, store, c.header.Get("Request-Id")); r.Outcome != "denied" || r.KeyID != noScope.ID {
		t.Fatalf("scope refusal recorded as %+v", r)
	}

	// GraphQL calls are recorded by operation.
	c = do(t, http.MethodPost, srv.URL+"/graphql", live.Secret, "application/json", `{"query":"query P { patient(id: \"pat_gql\") { id name } }","operationName":"P"}`)
	if c.status != http.StatusOK || !strings.Contains(c.body, patientName) {
		t.Fatalf("graphql: %d %s", c.status, c.body)
	}
	if r := storedRecord(t, store, c.header.Get("Request-Id")); r.Operation != "graphql query patient" ||
		!slices.Equal(r.PatientIDs, []string{"pat_gql"}) || !slices.Equal(r.ResourceIDs, []string{"pat_gql", "obs_gql"}) {
		t.Fatalf("graphql recorded as %+v", r)
	}
}

func sameAudit(a, b storage.AuditRecord) bool {
	return a.ID == b.ID && a.OrgID == b.OrgID && a.KeyID == b.KeyID && a.Mode == b.Mode && a.ClientIP == b.ClientIP &&
		a.UserAgent == b.UserAgent && a.Operation == b.Operation && slices.Equal(a.ResourceIDs, b.ResourceIDs) &&
		slices.Equal(a.PatientIDs, b.PatientIDs) && a.Outcome == b.Outcome && a.Status == b.Status
}

// TestAuditBrokerUnreachable: patient data is never sent unaudited.
func TestAuditBrokerUnreachable(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	org := pgtest.NewOrg(t, pool)
	live := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live, Scopes: []string{access.ReadPatients}})
	test := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Test, Scopes: []string{access.ReadPatients}})

	// A broker of this test's own, so that it can go away in the middle.
	cluster, pub := ownBroker(t)
	srv := httptest.NewServer(patientAPI(NewAuthenticator(keys, nil, AuthenticatorConfig{}), NewAuditor(pub, AuditorConfig{AckTimeout: 500 * time.Millisecond})))
	t.Cleanup(srv.Close)

	if c := do(t, http.MethodGet, srv.URL+"/v1/patients/pat_1", live.Secret, "", ""); c.status != http.StatusOK {
		t.Fatalf("with the broker up: %d %s", c.status, c.body)
	}
	cluster.Close()

	c := do(t, http.MethodGet, srv.URL+"/v1/patients/pat_1", live.Secret, "", "")
	if c.status != http.StatusServiceUnavailable || errorCode(t, []byte(c.body)) != "UNAVAILABLE" || strings.Contains(c.body, patientName) {
		t.Fatalf("live patient read with the broker down: %d %s", c.status, c.body)
	}
	if c.header.Get("Request-Id") == "" || c.header.Get("RateLimit-Limit") == "" {
		t.Fatalf("the 503 lost the request id or rate-limit headers: %v", c.header)
	}
	c = do(t, http.MethodPost, srv.URL+"/graphql", live.Secret, "application/json", `{"query":"{ patient(id: \"pat_gql\") { id } }"}`)
	if c.status != http.StatusServiceUnavailable || strings.Contains(c.body, patientName) {
		t.Fatalf("live GraphQL patient read with the broker down: %d %s", c.status, c.body)
	}
	// A call that failed with its own cause keeps it: a 5xx carries no patient data to withhold,
	// and a device told "the audit log is unavailable" would not know that its post failed.
	c = do(t, http.MethodPost, srv.URL+"/v1/observations", live.Secret, "application/json", "{}")
	if c.status != http.StatusServiceUnavailable || !strings.Contains(c.body, intakeDown) {
		t.Fatalf("a failed live call with the broker down: %d %s, want its own cause", c.status, c.body)
	}
	// Calls without patient data, and test-key calls, are not held up.
	if c := do(t, http.MethodGet, srv.URL+"/v1/organizations", live.Secret, "", ""); c.status != http.StatusOK {
		t.Fatalf("live non-patient call with the broker down: %d %s", c.status, c.body)
	}
	if c := do(t, http.MethodGet, srv.URL+"/v1/patients/pat_1", test.Secret, "", ""); c.status != http.StatusOK {
		t.Fatalf("test-key read with the broker down: %d %s", c.status, c.body)
	}
}

// TestAuditBrokerNeverReachable starts with no broker at all behind the address.
func TestAuditBrokerNeverReachable(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	live := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: pgtest.NewOrg(t, pool), Mode: access.Live, Scopes: []string{access.ReadPatients}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	pub, err := audit.NewPublisher(audit.PublisherConfig{Brokers: []string{addr}, Topic: "audit"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close(0) })
	srv := httptest.NewServer(patientAPI(NewAuthenticator(keys, nil, AuthenticatorConfig{}), NewAuditor(pub, AuditorConfig{AckTimeout: 300 * time.Millisecond})))
	t.Cleanup(srv.Close)
	c := do(t, http.MethodGet, srv.URL+"/v1/patients/pat_1", live.Secret, "", "")
	if c.status != http.StatusServiceUnavailable || strings.Contains(c.body, patientName) {
		t.Fatalf("live patient read without a broker: %d %s", c.status, c.body)
	}
}

// TestAuditCall covers Audit, the entry point for operations outside the HTTP middleware.
func TestAuditCall(t *testing.T) {
	topic, pub := auditTopic(t)
	aud := NewAuditor(pub, AuditorConfig{})
	live := &access.Principal{OrgID: "org_1", KeyID: "key_live", Mode: access.Live, ClientIP: "192.0.2.9"}
	test := &access.Principal{OrgID: "org_1", KeyID: "key_test", Mode: access.Test}

	ctx, _ := access.WithRecorder(access.With(context.Background(), live))
	access.Touch(ctx, access.KindSession, "ses_1")
	access.Touch(ctx, access.KindPatient, "pat_9")
	start := time.Now()
	if err := aud.Audit(ctx, audit.Call{RequestID: "req_01jz0000000000000000000001", Start: start, UserAgent: "ws-client",
		Operation: GraphQLOperation(`subscription { agentSessionUpdated(agentId: "agt_1") { id } }`, "")}); err != nil {
		t.Fatal(err)
	}
	tctx, _ := access.WithRecorder(access.With(context.Background(), test))
	access.Touch(tctx, access.KindPatient, "pat_9")
	if err := aud.Audit(tctx, audit.Call{Start: start, Operation: "graphql query patient"}); err != nil {
		t.Fatal(err)
	}
	if err := aud.Audit(context.Background(), audit.Call{Start: start, Operation: "graphql query patient"}); err != nil {
		t.Fatal(err)
	}
	// A marker after them: when it arrives, anything recorded before it has arrived too.
	mctx := access.With(context.Background(), live)
	if err := aud.Audit(mctx, audit.Call{RequestID: "req_01jz0000000000000000000002", Start: start, Operation: "marker"}); err != nil {
		t.Fatal(err)
	}
	pub.Close(5 * time.Second)

	cl := kafkatest.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	got, _ := readAudit(t, cl, func(got []storage.AuditRecord) bool {
		return len(got) > 0 && got[len(got)-1].Operation == "marker"
	})
	if len(got) != 2 {
		t.Fatalf("%d records, want the live call and the marker: %+v", len(got), got)
	}
	want := storage.AuditRecord{ID: "req_01jz0000000000000000000001", OrgID: "org_1", KeyID: "key_live", Mode: access.Live,
		ClientIP: "192.0.2.9", UserAgent: "ws-client", Operation: "graphql subscription agentSessionUpdated",
		ResourceIDs: []string{"ses_1", "pat_9"}, PatientIDs: []string{"pat_9"}, Outcome: "success", Status: 200}
	if !sameAudit(got[0], want) || !got[0].Time.Equal(start.UTC().Truncate(time.Nanosecond)) {
		t.Fatalf("record %+v\nwant     %+v", got[0], want)
	}
}

// TestRefusedCredentialsAudited: 401s are audited as failed authentications, without the
// secret, filed under the key's organization when the key exists and under none otherwise; and
// a flood of them from one address is sampled, not written one record each.
func TestRefusedCredentialsAudited(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	tokens := NewTokens(postgres.NewSigningKeys(pool))
	org := pgtest.NewOrg(t, pool)
	live := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live, Scopes: []string{access.ReadPatients}})
	revoked := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live, Scopes: []string{access.ReadPatients}})
	if _, err := keys.Revoke(context.Background(), "", revoked.ID); err != nil {
		t.Fatal(err)
	}
	unknown := otherKey(live.Secret)

	topic, pub := auditTopic(t)
	reg := prometheus.NewRegistry()
	const burst = 4
	aud := NewAuditor(pub, AuditorConfig{Registerer: reg, RefusalLimits: RefusalLimits{PerSource: Rate{PerSecond: 0.001, Burst: burst}}})
	frozen := time.Now()
	aud.now = func() time.Time { return frozen } // no refill while the test runs
	srv := httptest.NewServer(patientAPI(NewAuthenticator(keys, tokens, AuthenticatorConfig{}), aud))
	t.Cleanup(srv.Close)

	type refused struct {
		name, key, reason, credential, keyID, orgID string
	}
	cases := []refused{
		{"revoked live key", revoked.Secret, ReasonRevoked, revoked.Masked, revoked.ID, org},
		{"unknown key", unknown, ReasonUnknownKey, maskKey(unknown), "", ""},
		{"bad JWT", "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJrZXlfMSJ9.c2ln", ReasonInvalidToken, "jwt", "", ""},
		{"malformed", "not a key", ReasonMalformed, "", "", ""},
	}
	ids := map[string]refused{}
	for _, tc := range cases {
		c := do(t, http.MethodGet, srv.URL+"/v1/patients/pat_123", tc.key, "", "")
		if c.status != http.StatusUnauthorized || strings.Contains(c.body, patientName) {
			t.Fatalf("%s: %d %s", tc.name, c.status, c.body)
		}
		ids[c.header.Get("Request-Id")] = tc
	}
	// The flood: one address, past its burst. None of these is recorded.
	for range 20 {
		if c := do(t, http.MethodGet, srv.URL+"/v1/patients/pat_123", unknown, "", ""); c.status != http.StatusUnauthorized {
			t.Fatalf("flood: %d %s", c.status, c.body)
		}
	}
	// Live calls are not sampled; this one marks the end.
	marker := do(t, http.MethodGet, srv.URL+"/v1/organizations", live.Secret, "", "")
	markerID := marker.header.Get("Request-Id")
	pub.Close(5 * time.Second) // flushes: every record is on the topic now

	got, raw := readAllAudit(t, topic)
	if len(got) != burst+1 {
		t.Fatalf("%d records, want the %d refusals within the burst and the marker: %+v", len(got), burst, got)
	}
	seen := map[string]bool{}
	for i, rec := range got {
		if rec.ID == markerID {
			if rec.AuthFailure != "" || rec.KeyID != live.ID {
				t.Errorf("marker %+v", rec)
			}
			continue
		}
		tc, ok := ids[rec.ID]
		if !ok || seen[rec.ID] {
			t.Fatalf("record %+v is not one of the first refusals", rec)
		}
		seen[rec.ID] = true
		if rec.AuthFailure != tc.reason || rec.Credential != tc.credential || rec.KeyID != tc.keyID || rec.OrgID != tc.orgID ||
			rec.Status != http.StatusUnauthorized || rec.Outcome != "denied" || rec.ClientIP != "127.0.0.1" ||
			rec.UserAgent != "carehub-audit-test/1" || rec.Operation != "GET /v1/patients/{id}" || len(rec.PatientIDs) != 0 {
			t.Errorf("%s recorded as %+v", tc.name, rec)
		}
		if strings.Contains(raw[i], tc.key) {
			t.Errorf("%s: the record carries the credential: %s", tc.name, raw[i])
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			counts[f.GetName()] += m.GetCounter().GetValue()
		}
	}
	if counts["carehub_audit_auth_failures_suppressed_total"] != 20 || counts["carehub_audit_auth_failures_recorded_total"] != burst {
		t.Fatalf("metrics %v, want 20 suppressed and %d recorded", counts, burst)
	}
}

// TestAuditStatesTruncation: a call that touched more ids than a record keeps (10,000 patient
// ids, 1,000 others) is recorded with what fits, and says it is incomplete and by how much.
func TestAuditStatesTruncation(t *testing.T) {
	topic, pub := auditTopic(t)
	aud := NewAuditor(pub, AuditorConfig{})
	live := &access.Principal{OrgID: "org_1", KeyID: "key_live", Mode: access.Live, ClientIP: "192.0.2.9"}
	// The test's broker, not a subtest's.
	cl := kafkatest.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	for _, tc := range []struct {
		name                           string
		patients, others               int
		truncated                      bool
		patientsOmitted, othersOmitted int
	}{
		{"within the caps", 10_000, 1_000, false, 0, 0},
		{"past both caps", 10_003, 1_002, true, 3, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, _ := access.WithRecorder(access.With(context.Background(), live))
			for i := range tc.patients {
				access.Touch(ctx, access.KindPatient, fmt.Sprintf("pat_%026d", i))
			}
			for i := range tc.others {
				access.Touch(ctx, access.KindObservation, fmt.Sprintf("obs_%026d", i))
			}
			id := ids.New(ids.Request)
			if err := aud.Audit(ctx, audit.Call{RequestID: id, Start: time.Now(), Operation: "graphql query patients"}); err != nil {
				t.Fatal(err)
			}
			got, _ := readAudit(t, cl, func(got []storage.AuditRecord) bool {
				return len(got) > 0 && got[len(got)-1].ID == id
			})
			rec := got[len(got)-1]
			if rec.Truncated != tc.truncated || rec.PatientIDsOmitted != tc.patientsOmitted || rec.ResourceIDsOmitted != tc.othersOmitted ||
				len(rec.PatientIDs) != 10_000 || len(rec.ResourceIDs) != 11_000 {
				t.Fatalf("record: truncated %v, omitted %d patients and %d others, %d patient ids, %d resource ids",
					rec.Truncated, rec.PatientIDsOmitted, rec.ResourceIDsOmitted, len(rec.PatientIDs), len(rec.ResourceIDs))
			}
		})
	}
}

// readAudit reads audit records from cl until done holds for those read so far, and returns
// them with their encoded form.
func readAudit(t *testing.T, cl *kgo.Client, done func([]storage.AuditRecord) bool) ([]storage.AuditRecord, []string) {
	t.Helper()
	var got []storage.AuditRecord
	var raw []string
	deadline := time.Now().Add(30 * time.Second)
	for !done(got) {
		if time.Now().After(deadline) {
			t.Fatalf("records on the topic after 30s: %+v", got)
		}
		fctx, cancel := context.WithTimeout(context.Background(), time.Second)
		cl.PollFetches(fctx).EachRecord(func(r *kgo.Record) {
			var a storage.AuditRecord
			if err := json.Unmarshal(r.Value, &a); err != nil {
				t.Fatal(err)
			}
			got, raw = append(got, a), append(raw, string(r.Value))
		})
		cancel()
	}
	return got, raw
}

// TestRateLimitedCallsSampled: a live key far past its rate gets its refusals (429) recorded up
// to the sampling burst and counted past it, so a key's flood of refused calls cannot become a
// flood of audit writes; the calls the limit admitted are all recorded.
func TestRateLimitedCallsSampled(t *testing.T) {
	pool := pgtest.New(t)
	keys := postgres.NewAPIKeys(pool)
	org := pgtest.NewOrg(t, pool)
	live := pgtest.NewKey(t, keys, apikeys.NewKey{OrgID: org, Mode: access.Live, Scopes: []string{access.ReadPatients}})

	topic, pub := auditTopic(t)
	reg := prometheus.NewRegistry()
	const burst, admitted, flood = 3, 2, 20
	aud := NewAuditor(pub, AuditorConfig{Registerer: reg, RefusalLimits: RefusalLimits{PerSource: Rate{PerSecond: 0.001, Burst: burst}}})
	frozen := time.Now()
	aud.now = func() time.Time { return frozen }
	authn := NewAuthenticator(keys, nil, AuthenticatorConfig{Clock: func() time.Time { return frozen },
		Limits: Limits{Default: Rate{PerSecond: 0.001, Burst: admitted}}})
	srv := httptest.NewServer(patientAPI(authn, aud))
	t.Cleanup(srv.Close)
	statuses := map[int]int{}
	for range admitted + flood {
		statuses[do(t, http.MethodGet, srv.URL+"/v1/organizations", live.Secret, "", "").status]++
	}
	if statuses[http.StatusOK] != admitted || statuses[http.StatusTooManyRequests] != flood {
		t.Fatalf("answers %v, want %d × 200 and %d × 429", statuses, admitted, flood)
	}
	pub.Close(5 * time.Second)

	got, _ := readAllAudit(t, topic)
	byStatus := map[int]int{}
	for _, rec := range got {
		byStatus[rec.Status]++
	}
	if byStatus[http.StatusOK] != admitted || byStatus[http.StatusTooManyRequests] != burst {
		t.Fatalf("records by status %v, want %d × 200 and %d × 429", byStatus, admitted, burst)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "carehub_audit_rate_limited_suppressed_total" {
			if v := f.GetMetric()[0].GetCounter().GetValue(); v != flood-burst {
				t.Fatalf("suppressed %v, want %d", v, flood-burst)
			}
			return
		}
	}
	t.Fatal("no carehub_audit_rate_limited_suppressed_total")
}

// readAllAudit reads every record on topic. Records are keyed by organization, so they sit in
// different partitions: it reads as many as the partitions' end offsets say there are.
func readAllAudit(t *testing.T, topic string) ([]storage.AuditRecord, []string) {
	t.Helper()
	cl := kafkatest.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ends, err := kadm.NewClient(cl).ListEndOffsets(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	ends.Each(func(o kadm.ListedOffset) { total += int(o.Offset) })
	return readAudit(t, cl, func(got []storage.AuditRecord) bool { return len(got) >= total })
}
