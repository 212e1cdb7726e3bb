package fhir_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/kernel/ids"
	"carehub/kernel/whsig"
	"carehub/processors/fhirsubs"
	"carehub/storage/demo"
)

// notification is what a test reads of a notification Bundle.
type notification struct {
	ResourceType string `json:"resourceType"`
	Type         string `json:"type"`
	Entry        []struct {
		FullURL  string          `json:"fullUrl"`
		Resource json.RawMessage `json:"resource"`
		Request  struct {
			Method, URL string
		} `json:"request"`
	} `json:"entry"`
}

// status reads the notification's SubscriptionStatus: its type, events since start, and the
// event numbers with their focus references.
func (n notification) status(t *testing.T) (typ string, since string, numbers, focus []string) {
	t.Helper()
	if n.ResourceType != "Bundle" || n.Type != "history" || len(n.Entry) == 0 {
		t.Fatalf("not a notification Bundle: %+v", n)
	}
	var p struct {
		ResourceType string
		Parameter    []struct {
			Name           string
			ValueCode      string
			ValueString    string
			ValueReference struct{ Reference string }
			Part           []struct {
				Name           string
				ValueString    string
				ValueReference struct{ Reference string }
			}
		}
	}
	if err := json.Unmarshal(n.Entry[0].Resource, &p); err != nil || p.ResourceType != "Parameters" {
		t.Fatalf("first entry is not a Parameters: %s", n.Entry[0].Resource)
	}
	for _, x := range p.Parameter {
		switch x.Name {
		case "type":
			typ = x.ValueCode
		case "events-since-subscription-start":
			since = x.ValueString
		case "notification-event":
			for _, part := range x.Part {
				switch part.Name {
				case "event-number":
					numbers = append(numbers, part.ValueString)
				case "focus":
					focus = append(focus, part.ValueReference.Reference)
				}
			}
		}
	}
	return typ, since, numbers, focus
}

// receiver is a rest-hook endpoint: it checks each notification's signature and keeps it; while
// down it answers 503.
type receiver struct {
	t      *testing.T
	srv    *httptest.Server
	secret atomic.Value // string
	down   atomic.Bool
	mu     sync.Mutex
	got    []notification
	raw    [][]byte
	auth   []string
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{t: t}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if rc.down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		secret, _ := rc.secret.Load().(string)
		if !whsig.Verify(secret, r.Header.Get(whsig.HeaderID), r.Header.Get(whsig.HeaderTimestamp), body, r.Header.Get(whsig.HeaderSignature)) {
			t.Errorf("a notification's signature does not verify")
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var n notification
		if err := json.Unmarshal(body, &n); err != nil {
			t.Errorf("notification: %v", err)
		}
		rc.mu.Lock()
		rc.got = append(rc.got, n)
		rc.raw = append(rc.raw, body)
		rc.auth = append(rc.auth, r.Header.Get("Authorization"))
		rc.mu.Unlock()
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// events returns the event numbers received so far, with their focus references, in order.
func (rc *receiver) events() (numbers, focus []string, handshakes int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, n := range rc.got {
		typ, _, nums, fs := n.status(rc.t)
		if typ == fhirsubs.TypeHandshake {
			handshakes++
		}
		numbers, focus = append(numbers, nums...), append(focus, fs...)
	}
	return numbers, focus, handshakes
}

// subscription is an R4 backport Subscription to topic for patient, on channel.
func subscription(topic, patient, channel, endpoint, content string) map[string]any {
	ch := map[string]any{"type": channel, "payload": "application/fhir+json",
		"_payload": map[string]any{"extension": []any{map[string]any{"url": "http://hl7.org/fhir/uv/subscriptions-backport/StructureDefinition/backport-payload-content", "valueCode": content}}}}
	if endpoint != "" {
		ch["endpoint"] = endpoint
		ch["header"] = []string{"Authorization: Bearer receiver-token"}
	}
	return map[string]any{"resourceType": "Subscription", "status": "requested", "reason": "test",
		"criteria": fhirsubs.TopicBase + topic,
		"_criteria": map[string]any{"extension": []any{map[string]any{"url": "http://hl7.org/fhir/uv/subscriptions-backport/StructureDefinition/backport-filter-criteria",
			"valueString": "Observation?patient=Patient/" + ids.FHIR(patient)}}},
		"channel": ch}
}

// createSubscription creates one and returns its id and signing secret.
func createSubscription(t *testing.T, s *servertest.Server, key string, sub map[string]any) (id, secret string) {
	t.Helper()
	r := s.Do(http.MethodPost, "/fhir/R4/Subscription", key, sub)
	var got struct {
		ID        string
		Status    string
		Extension []struct{ URL, ValueString string }
	}
	r.JSON(t, &got)
	if r.Status != http.StatusCreated || got.ID == "" {
		t.Fatalf("create subscription: %d %s", r.Status, r.Body)
	}
	for _, e := range got.Extension {
		if e.URL == fhirsubs.ExtSigningSecret {
			secret = e.ValueString
		}
	}
	return got.ID, secret
}

// TestSubscriptionRestHook: a rest-hook subscription's handshake makes it active; observations
// posted through /v1/observations and through the FHIR base each reach the receiver, signed, in
// order, once, with the receiver's header; a receiver down for a minute misses nothing: $events
// reads what it missed meanwhile, and the deliveries resume where they stopped.
func TestSubscriptionRestHook(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	rc := newReceiver(t)
	patient := demo.DeterioratingPatientID

	// The receiver is down at first: the handshake fails, the subscription is in error and says
	// why; once the receiver answers, the handshake is tried again and makes it active.
	rc.down.Store(true)
	id, secret := createSubscription(t, s, key, subscription("observation-created", patient, "rest-hook", rc.srv.URL, "full-resource"))
	if !strings.HasPrefix(secret, whsig.SecretPrefix) {
		t.Fatalf("no signing secret in the create answer")
	}
	rc.secret.Store(secret)
	status := func() (string, string) {
		var st struct{ Status, Error string }
		s.Do(http.MethodGet, "/fhir/R4/Subscription/"+id, key, nil).JSON(t, &st)
		return st.Status, st.Error
	}
	servertest.Eventually(t, 30*time.Second, "a failed handshake puts the subscription in error", func() bool { st, _ := status(); return st == "error" })
	if _, why := status(); !strings.Contains(why, "503") {
		t.Errorf("Subscription.error %q does not say the receiver answered 503", why)
	}
	rc.down.Store(false)
	servertest.Eventually(t, 30*time.Second, "the handshake again makes the subscription active", func() bool { st, _ := status(); return st == "active" })
	if read := s.Do(http.MethodGet, "/fhir/R4/Subscription/"+id, key, nil); strings.Contains(string(read.Body), "receiver-token") ||
		strings.Contains(string(read.Body), secret) {
		t.Errorf("a read shows the channel's header value or the secret: %s", read.Body)
	}

	if r := s.Do(http.MethodPost, "/v1/observations", key, heartRate(ids.FHIR(patient), 72, "")); r.Status != http.StatusAccepted {
		t.Fatalf("/v1/observations: %d %s", r.Status, r.Body)
	}
	fhirObs := heartRate(ids.FHIR(patient), 73, "")
	if r := s.Do(http.MethodPost, "/fhir/R4/Observation", key, fhirObs); r.Status != http.StatusCreated {
		t.Fatalf("/fhir/R4/Observation: %d %s", r.Status, r.Body)
	}
	// Another patient's observation is not this subscription's.
	s.Do(http.MethodPost, "/v1/observations", key, heartRate(ids.FHIR(demo.StablePatientID), 70, ""))
	servertest.Eventually(t, 30*time.Second, "two notifications", func() bool { n, _, _ := rc.events(); return len(n) >= 2 })
	numbers, focus, handshakes := rc.events()
	if strings.Join(numbers, ",") != "1,2" || handshakes != 1 {
		t.Fatalf("event numbers %v (handshakes %d), want 1,2 after one handshake", numbers, handshakes)
	}
	for _, f := range focus {
		if !strings.Contains(f, "/fhir/R4/Observation/obs-") {
			t.Errorf("focus %q is not an Observation of the base", f)
		}
	}
	rc.mu.Lock()
	var resources []string
	for _, n := range rc.got {
		for _, e := range n.Entry[1:] {
			resources = append(resources, string(e.Resource))
		}
	}
	auth := rc.auth[len(rc.auth)-1]
	rc.mu.Unlock()
	if len(resources) != 2 {
		t.Fatalf("full-resource notifications carry %d resources, want 2", len(resources))
	}
	for i, r := range resources {
		if !strings.Contains(r, `"resourceType":"Observation"`) || !strings.Contains(r, `"id":"obs-`) ||
			!strings.Contains(r, `"reference":"Patient/`+ids.FHIR(patient)+`"`) {
			t.Errorf("notified resource %d is not the Observation as the FHIR base serves it: %s", i, r)
		}
	}
	if auth != "Bearer receiver-token" {
		t.Errorf("the channel's header was not sent: %q", auth)
	}

	// Down for a minute, as the subscriber is: three observations arrive over it, the
	// deliverer's retries back off, and $events reads what was missed meanwhile.
	rc.down.Store(true)
	downFor := time.Minute
	if testing.Short() {
		downFor = 5 * time.Second
	}
	for v := range 3 {
		s.Do(http.MethodPost, "/v1/observations", key, heartRate(ids.FHIR(patient), float64(80+v), ""))
		time.Sleep(downFor / 3)
	}
	var missed notification
	servertest.Eventually(t, 30*time.Second, "$events lists the three events missed", func() bool {
		s.Do(http.MethodGet, "/fhir/R4/Subscription/"+id+"/$events?eventsSinceNumber=3", key, nil).JSON(t, &missed)
		_, _, nums, _ := missed.status(t)
		return len(nums) == 3
	})
	if typ, since, nums, _ := missed.status(t); typ != "query-event" || since != "5" || strings.Join(nums, ",") != "3,4,5" {
		t.Errorf("$events: type %s since %s numbers %v", typ, since, nums)
	}
	var st struct {
		Entry []struct{ Resource json.RawMessage }
	}
	s.Do(http.MethodGet, "/fhir/R4/Subscription/"+id+"/$status", key, nil).JSON(t, &st)
	if len(st.Entry) != 1 || !strings.Contains(string(st.Entry[0].Resource), `"query-status"`) {
		t.Errorf("$status: %+v", st)
	}
	rc.down.Store(false)
	back := time.Now()
	servertest.Eventually(t, time.Minute, "the missed events delivered once the receiver is back", func() bool { n, _, _ := rc.events(); return len(n) >= 5 })
	t.Logf("down for %s: the missed events delivered %s after the receiver was back", downFor, time.Since(back).Round(time.Millisecond))
	if numbers, _, _ := rc.events(); strings.Join(numbers, ",") != "1,2,3,4,5" {
		t.Fatalf("event numbers %v, want 1..5 in order, each once", numbers)
	}

	// Every notification, $events and $status answer and the Subscription itself is valid R4 to
	// HAPI's validator.
	dir := t.TempDir()
	rc.mu.Lock()
	docs := append([][]byte(nil), rc.raw...)
	rc.mu.Unlock()
	for _, path := range []string{"/$events?eventsSinceNumber=1", "/$events?content=full-resource", "/$status", ""} {
		r := s.Do(http.MethodGet, "/fhir/R4/Subscription/"+id+path, key, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, r.Status, r.Body)
		}
		docs = append(docs, r.Body)
	}
	for i, d := range docs {
		d = withoutBackportProfiles(t, d)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("doc%02d.json", i)), d, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	synValidate(t, dir, len(docs))

	// Another organization sees nothing of it; deleting ends it.
	other := s.Key("northwind-health", access.Live, access.Scopes...)
	if r := s.Do(http.MethodGet, "/fhir/R4/Subscription/"+id, other, nil); r.Status != http.StatusNotFound {
		t.Errorf("another organization reads the subscription: %d", r.Status)
	}
	if r := s.Do(http.MethodDelete, "/fhir/R4/Subscription/"+id, key, nil); r.Status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.Status, r.Body)
	}
	if r := s.Do(http.MethodGet, "/fhir/R4/Subscription/"+id, key, nil); r.Status != http.StatusNotFound {
		t.Errorf("a deleted subscription reads %d", r.Status)
	}
}

// TestSubscriptionWebSocket: a websocket subscription binds with a token from
// $get-ws-binding-token, hears its handshake, then an observation's notification.
func TestSubscriptionWebSocket(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	patient := demo.StablePatientID
	id, _ := createSubscription(t, s, key, subscription("observation-created", patient, "websocket", "", "id-only"))

	var p struct {
		Parameter []struct{ Name, ValueString, ValueURL string }
	}
	r := s.Do(http.MethodPost, "/fhir/R4/Subscription/"+id+"/$get-ws-binding-token", key, nil)
	r.JSON(t, &p)
	var token, wsURL string
	for _, x := range p.Parameter {
		switch x.Name {
		case "token":
			token = x.ValueString
		case "websocket-url":
			wsURL = x.ValueURL
		}
	}
	if r.Status != http.StatusOK || token == "" || !strings.HasPrefix(wsURL, "ws://") {
		t.Fatalf("$get-ws-binding-token: %d %s", r.Status, r.Body)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	// A token altered is refused with 4403.
	bad, _, err := websocket.Dial(ctx, wsURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = bad.Write(ctx, websocket.MessageText, []byte("bind-with-token "+token+"x"))
	if _, _, err := bad.Read(ctx); websocket.CloseStatus(err) != 4403 {
		t.Errorf("an altered token: %v, want close 4403", err)
	}

	c, _, err := websocket.Dial(ctx, wsURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := c.Write(ctx, websocket.MessageText, []byte("bind-with-token "+token)); err != nil {
		t.Fatal(err)
	}
	read := func() notification {
		t.Helper()
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		var n notification
		if err := json.Unmarshal(b, &n); err != nil {
			t.Fatalf("%v: %s", err, b)
		}
		return n
	}
	if typ, _, _, _ := read().status(t); typ != fhirsubs.TypeHandshake {
		t.Fatalf("first message %s, want handshake", typ)
	}
	if r := s.Do(http.MethodPost, "/v1/observations", key, heartRate(ids.FHIR(patient), 64, "")); r.Status != http.StatusAccepted {
		t.Fatalf("/v1/observations: %d %s", r.Status, r.Body)
	}
	n := read()
	typ, _, numbers, focus := n.status(t)
	if typ != fhirsubs.TypeNotification || strings.Join(numbers, ",") != "1" || len(focus) != 1 || len(n.Entry) != 2 || n.Entry[1].Resource != nil {
		t.Fatalf("notification %s %v %v: %+v", typ, numbers, focus, n)
	}
	// The same through the FHIR base.
	r = s.Do(http.MethodPost, "/fhir/R4/Observation", key, heartRate(ids.FHIR(patient), 65, ""))
	var created struct{ ID string }
	r.JSON(t, &created)
	if r.Status != http.StatusCreated {
		t.Fatalf("/fhir/R4/Observation: %d %s", r.Status, r.Body)
	}
	typ, _, numbers, focus = read().status(t)
	if typ != fhirsubs.TypeNotification || strings.Join(numbers, ",") != "2" || len(focus) != 1 || !strings.HasSuffix(focus[0], "/Observation/"+created.ID) {
		t.Fatalf("notification %s %v %v, want event 2 about %s", typ, numbers, focus, created.ID)
	}
}

// withoutBackportProfiles removes the Subscriptions backport IG's profiles from doc's meta: the
// IG's StructureDefinitions are published only on packages.fhir.org, which this machine cannot
// reach, and HAPI's validator refuses a profile it cannot load. What is validated is R4 itself
// (Bundle history rules, Parameters, Subscription); the profiles' own constraints (a
// SubscriptionStatus first, its parameters) are the assertions above.
func withoutBackportProfiles(t *testing.T, doc []byte) []byte {
	t.Helper()
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Fatal(err)
	}
	var walk func(any)
	walk = func(x any) {
		switch x := x.(type) {
		case map[string]any:
			if m, ok := x["meta"].(map[string]any); ok {
				if ps, ok := m["profile"].([]any); ok && len(ps) == 1 && strings.Contains(fmt.Sprint(ps[0]), "/subscriptions-backport/") {
					delete(m, "profile")
				}
				if len(m) == 0 {
					delete(x, "meta")
				}
			}
			for _, y := range x {
				walk(y)
			}
		case []any:
			for _, y := range x {
				walk(y)
			}
		}
	}
	walk(v)
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// eventsOf reads a subscription's numbered events with $events: their focus references.
func eventsOf(t *testing.T, s *servertest.Server, key, id string) []string {
	t.Helper()
	var n notification
	r := s.Do(http.MethodGet, "/fhir/R4/Subscription/"+id+"/$events", key, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("$events: %d %s", r.Status, r.Body)
	}
	r.JSON(t, &n)
	_, _, _, focus := n.status(t)
	return focus
}

// TestSubscriptionTopics: each topic of the catalogue numbers what it says and nothing else, a
// test key's subscription hears only of synthetic patients, and a bad Subscription is refused
// with an OperationOutcome naming the element.
func TestSubscriptionTopics(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	testKey := s.Key(demo.DemoOrgSlug, access.Test, access.ReadPatients, access.ReadObservations)
	sick, stable := demo.DeterioratingPatientID, demo.StablePatientID
	ws := func(key, topic, criteria string) string {
		sub := subscription(topic, sick, "websocket", "", "id-only")
		if criteria == "" {
			delete(sub, "_criteria")
		} else {
			sub["_criteria"] = map[string]any{"extension": []any{map[string]any{
				"url": "http://hl7.org/fhir/uv/subscriptions-backport/StructureDefinition/backport-filter-criteria", "valueString": criteria}}}
		}
		id, _ := createSubscription(t, s, key, sub)
		return id
	}
	outOfRange := ws(key, "vital-out-of-range", "Observation?code=http://loinc.org|8867-4")
	testAll := ws(testKey, "observation-created", "")
	created := ws(key, "risk-assessment-created", "RiskAssessment?patient=Patient/"+ids.FHIR(sick))
	rising := ws(key, "risk-rising", "RiskAssessment?patient=Patient/"+ids.FHIR(sick)+"&code=news2")

	post := func(patient string, hr float64) string {
		t.Helper()
		r := s.Do(http.MethodPost, "/v1/observations", key, heartRate(ids.FHIR(patient), hr, ""))
		var a struct{ IDs []string }
		r.JSON(t, &a)
		if r.Status != http.StatusAccepted || len(a.IDs) != 1 {
			t.Fatalf("/v1/observations: %d %s", r.Status, r.Body)
		}
		return a.IDs[0]
	}
	post(stable, 72)          // in range
	high := post(stable, 140) // out of range: heart rate scores 3
	realObs := post(demo.RealPatientID, 150)
	servertest.Eventually(t, 30*time.Second, "the out-of-range reading numbered", func() bool { return len(eventsOf(t, s, key, outOfRange)) >= 2 })
	// Numbered in the order the notifier read them: one patient's in order, two patients' in either.
	got := eventsOf(t, s, key, outOfRange)
	slices.Sort(got)
	want := []string{s.URL + "/fhir/R4/Observation/" + ids.FHIR(high), s.URL + "/fhir/R4/Observation/" + ids.FHIR(realObs)}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("vital-out-of-range numbered %v, want %v", got, want)
	}
	// The test key's subscription: the synthetic patient's readings, not the real one's.
	servertest.Eventually(t, 30*time.Second, "the test subscription numbered", func() bool { return len(eventsOf(t, s, testKey, testAll)) >= 2 })
	for _, f := range eventsOf(t, s, testKey, testAll) {
		if strings.HasSuffix(f, ids.FHIR(realObs)) {
			t.Errorf("a test key's subscription heard of a real patient's observation %s", f)
		}
	}
	if r := s.Do(http.MethodGet, "/fhir/R4/Subscription/"+outOfRange, testKey, nil); r.Status != http.StatusNotFound {
		t.Errorf("a test key reads a live key's subscription: %d", r.Status)
	}

	// Two NEWS2 assessments of the same severity: both created, the first one rising only.
	var agent string
	if err := s.Pool().QueryRow(t.Context(), `select id from agents where name = $1`, demo.Ward7AgentName).Scan(&agent); err != nil {
		t.Fatal(err)
	}
	var before int
	if err := s.Pool().QueryRow(t.Context(), `select count(*) from reports where patient_id = $1`, sick).Scan(&before); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		g := s.GraphQL(key, `mutation($a: ID!, $p: String!) { runAgent(agentId: $a, patientId: $p) { status } }`,
			map[string]any{"a": agent, "p": sick})
		if !strings.Contains(string(g.Data), "COMPLETED") {
			t.Fatalf("runAgent: %s %v", g.Data, g.Errors)
		}
	}
	var reports int
	if err := s.Pool().QueryRow(t.Context(), `select count(*) from reports where patient_id = $1`, sick).Scan(&reports); err != nil || reports < before+2 {
		t.Fatalf("reports %d after two runs (%d before): %v", reports, before, err)
	}
	servertest.Eventually(t, 30*time.Second, "both assessments numbered", func() bool { return len(eventsOf(t, s, key, created)) >= reports-before })
	if got := eventsOf(t, s, key, created); len(got) != reports-before || !strings.Contains(got[0], "/RiskAssessment/") {
		t.Errorf("risk-assessment-created numbered %v, want the %d new reports", got, reports-before)
	}
	if got := eventsOf(t, s, key, rising); before == 0 && len(got) != 1 {
		t.Errorf("risk-rising numbered %v, want the first assessment only (the second is no higher)", got)
	}

	// Refusals name the element.
	for name, c := range map[string]struct {
		edit func(map[string]any)
		path string
	}{
		"unknown topic": {func(m map[string]any) { m["criteria"] = fhirsubs.TopicBase + "nope" }, "Subscription.criteria"},
		"unknown filter": {func(m map[string]any) {
			m["_criteria"] = map[string]any{"extension": []any{map[string]any{"url": "http://hl7.org/fhir/uv/subscriptions-backport/StructureDefinition/backport-filter-criteria",
				"valueString": "Observation?status=final"}}}
		}, "Subscription.criteria.extension"},
		"no channel type": {func(m map[string]any) { m["channel"] = map[string]any{} }, "Subscription.channel.type"},
		"header injection": {func(m map[string]any) {
			m["channel"].(map[string]any)["header"] = []string{"X-A: b\r\nHost: evil"}
		}, "Subscription.channel.header"},
		"bad content": {func(m map[string]any) {
			m["channel"].(map[string]any)["_payload"] = map[string]any{"extension": []any{map[string]any{
				"url": "http://hl7.org/fhir/uv/subscriptions-backport/StructureDefinition/backport-payload-content", "valueCode": "everything"}}}
		}, "Subscription.channel.payload.extension"},
	} {
		sub := subscription("observation-created", sick, "rest-hook", "https://93.184.215.14/hook", "id-only")
		c.edit(sub)
		r := s.Do(http.MethodPost, "/fhir/R4/Subscription", key, sub)
		if r.Status/100 != 4 || !strings.Contains(string(r.Body), c.path) || !strings.Contains(string(r.Body), `"OperationOutcome"`) {
			t.Errorf("%s: %d %s, want a 4xx OperationOutcome naming %s", name, r.Status, r.Body, c.path)
		}
	}
	if r := s.Do(http.MethodPost, "/fhir/R4/Subscription", s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients),
		subscription("observation-created", sick, "websocket", "", "id-only")); r.Status != http.StatusForbidden {
		t.Errorf("a key without read:observations creates a subscription: %d %s", r.Status, r.Body)
	}
}
