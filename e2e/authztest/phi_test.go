package authztest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"carehub/api/ws/wstest"
	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/kernel/clinical"
	"carehub/kernel/events"
	"carehub/kernel/phi"
	"carehub/storage"
	"carehub/storage/demo"
)

// The patient-data matrix (DECISIONS §2, kernel/phi). Records naming a real and a synthetic
// patient — one event of every catalogued type, a free-form event, the events a live agent run
// and an ingested observation emit, agent sessions, workflow runs and invoke results — are read
// through every path that serves them, with every kind of credential. The records and what must
// be removed from them come from the classification (phi.Events, phi.Records) and the event
// catalogue, so a new event type or field is crossed with every path without a new line here.

// credKind is a kind of credential the matrix crosses with every path; a path adds the scopes
// its operation needs (phiPath.scopes), which bear on no patient data.
type credKind struct {
	name     string
	slug     string
	mode     string
	scopes   []string
	platform bool
}

var credKinds = []credKind{
	{name: "live read:patients+read:observations", slug: demo.DemoOrgSlug, mode: access.Live, scopes: sc(access.ReadPatients, access.ReadObservations)},
	{name: "live read:patients", slug: demo.DemoOrgSlug, mode: access.Live, scopes: sc(access.ReadPatients)},
	{name: "live without patient scopes", slug: demo.DemoOrgSlug, mode: access.Live, scopes: sc(access.WritePatients, access.WriteObservations,
		access.ExecAgents, access.ExecWorkflows, access.AdminOrg, access.AdminBilling, access.PublishAssets)},
	{name: "live admin:billing only", slug: demo.DemoOrgSlug, mode: access.Live, scopes: sc(access.AdminBilling)},
	{name: "test read:patients+read:observations", slug: demo.DemoOrgSlug, mode: access.Test, scopes: sc(access.ReadPatients, access.ReadObservations)},
	{name: "other organization", slug: otherSlug, mode: access.Live, scopes: sc(access.ReadPatients, access.ReadObservations)},
	{name: "platform", platform: true},
}

func (k credKind) foreign() bool { return !k.platform && k.slug != demo.DemoOrgSlug }

// sees reports whether k must be served r's patient data.
func (k credKind) sees(r *phiRecord) bool {
	switch {
	case k.foreign():
		return false
	case r.need == 0 || k.platform:
		return true
	}
	holds := slices.Contains(k.scopes, access.ReadPatients) && (r.need < phi.NeedObservations || slices.Contains(k.scopes, access.ReadObservations))
	return holds && (k.mode == access.Live || r.synthetic)
}

// phiRecord is one record naming one patient (or, need 0, none: a control that nobody may lose).
type phiRecord struct {
	name      string
	class     string // "event", "session", "run", "invoke"
	id        string
	project   string
	patient   string
	synthetic bool
	need      phi.Need
	typ       string         // event type
	published map[string]any // the payload of an event the test published; nil for emitted ones
	sample    bool           // read by the paths that make a record per call (mutations)
}

// recordClasses maps the matrix's record classes other than events to the classification; every
// phi.Records entry must have one (TestPatientDataOnEveryPath checks).
var recordClasses = map[string]phi.RecordClass{"session": phi.AgentSession, "run": phi.WorkflowRun, "invoke": phi.InvokeResult}

// phiFields returns the fields of r that are patient data, from the classification.
func (r *phiRecord) phiFields() []string {
	if rc, ok := recordClasses[r.class]; ok {
		return rc.Fields
	}
	if c, ok := phi.EventClassOf(r.typ); ok {
		return c.Fields
	}
	var out []string // free-form: every field the catalogue does not vouch for
	et, _ := events.Lookup(r.typ)
	for k := range r.published {
		if !slices.ContainsFunc(et.Payload, func(f events.Field) bool { return f.Name == k }) || phi.IsPatientKey(k) {
			out = append(out, k)
		}
	}
	return out
}

// kept returns the published fields a redacted event must keep.
func (r *phiRecord) kept() []string {
	var keep []string
	if c, ok := phi.EventClassOf(r.typ); ok {
		keep = c.Keep
	} else {
		et, _ := events.Lookup(r.typ)
		for _, f := range et.Payload {
			if !phi.IsPatientKey(f.Name) {
				keep = append(keep, f.Name)
			}
		}
	}
	var out []string
	for _, k := range keep {
		if _, ok := r.published[k]; ok {
			out = append(out, k)
		}
	}
	return out
}

// got is what one credential got of one record through one path.
type got struct {
	objs    []map[string]json.RawMessage // the record as served (a stream may push it several times)
	refused string                       // why it was not served: NOT_FOUND, absent, …
}

// phiPath is one way the API serves a class of records.
type phiPath struct {
	name   string
	class  string
	scopes []string // the operation's own scopes
	// sample: the path makes a record per call, so it is read for sample records only.
	sample bool
	// refuseReal: a test credential is refused (NOT_FOUND) a real patient's record instead of
	// getting it redacted: the call names the patient (runAgent, invoke, …).
	refuseReal bool
	get        func(e *phiEnv, k credKind, r *phiRecord) got
}

var phiPaths = []phiPath{
	{name: "GET /v1/events", class: "event", get: (*phiEnv).restEvents},
	{name: "query events", class: "event", get: (*phiEnv).gqlEvents},
	{name: "subscription eventStream", class: "event", scopes: streamScopes, get: streamed("eventStream")},
	{name: "webhook delivery", class: "event", scopes: sc(access.AdminOrg), get: (*phiEnv).webhookBodies},
	{name: "GET /v1/webhooks/deliveries/{id}", class: "event", scopes: sc(access.AdminOrg), sample: true, get: (*phiEnv).deliveryRead},
	{name: "mutation publishEvent", class: "event", scopes: sc(access.ExecWorkflows), sample: true, refuseReal: true, get: (*phiEnv).publishAs},
	{name: "query agent.sessions", class: "session", get: (*phiEnv).agentSessions},
	{name: "subscription agentSessionUpdated", class: "session", scopes: streamScopes, get: streamed("agentSessionUpdated")},
	{name: "mutation runAgent", class: "session", scopes: sc(access.ExecAgents), refuseReal: true, get: (*phiEnv).runAgentAs},
	{name: "query workflowRun", class: "run", get: (*phiEnv).workflowRun},
	{name: "query workflow.runs", class: "run", get: (*phiEnv).workflowRuns},
	{name: "GET /v1/workflow-runs/{id}", class: "run", get: (*phiEnv).restRun},
	{name: "subscription workflowRunUpdated", class: "run", scopes: streamScopes, get: streamed("workflowRunUpdated")},
	{name: "mutation runWorkflow", class: "run", scopes: sc(access.ExecWorkflows), refuseReal: true, get: (*phiEnv).runWorkflowAs},
	{name: "POST /api/v1/workflows/runs", class: "run", scopes: sc(access.ExecWorkflows), refuseReal: true, get: (*phiEnv).startRunAs},
	{name: "POST /v1/deployments/{id}/invoke", class: "invoke", scopes: sc(access.ExecAgents), refuseReal: true, get: (*phiEnv).invokeAs},
}

// streamScopes are held by every subscription connection: one connection per credential kind
// carries the three subscriptions.
var streamScopes = sc(access.ExecAgents, access.ExecWorkflows)

// TestPatientDataOnEveryPath crosses every path with every credential kind and every record.
func TestPatientDataOnEveryPath(t *testing.T) {
	for _, rc := range phi.Records {
		if !slices.ContainsFunc(slices.Collect(maps.Values(recordClasses)), func(c phi.RecordClass) bool { return c.Object == rc.Object }) {
			t.Fatalf("phi.Records classifies %s, which no record class of the matrix stands for", rc.Object)
		}
	}
	s := servertest.Start(t)
	e := newPHIEnv(t, s)
	e.listen()
	e.produce()
	for _, p := range phiPaths {
		t.Run(p.name, func(t *testing.T) {
			e.t = t
			n := 0
			for _, k := range credKinds {
				for _, r := range e.records {
					if r.class != p.class || (p.sample && !r.sample) {
						continue
					}
					n++
					e.judge(p, k, r, p.get(e, k, r))
				}
			}
			if n == 0 {
				t.Fatalf("no record crosses %s", p.name)
			}
			t.Logf("%d records × credentials judged", n)
		})
	}
	e.t = t
	t.Run("audit", func(t *testing.T) { e.t = t; e.checkAudit() })
}

// judge checks what k got of r through p.
func (e *phiEnv) judge(p phiPath, k credKind, r *phiRecord, g got) {
	t := e.t
	t.Helper()
	where := fmt.Sprintf("%s, %s, %s", k.name, r.name, p.name)
	for _, o := range g.objs {
		if k.foreign() {
			t.Errorf("%s: another organization got the record: %s", where, show(o))
		}
	}
	if len(g.objs) == 0 {
		switch {
		case k.foreign():
		case p.refuseReal && k.mode == access.Test && !r.synthetic && g.refused == "NOT_FOUND":
		default:
			t.Errorf("%s: not served (%s); the record must stay visible, redacted when its patient data is not", where, g.refused)
		}
		return
	}
	for _, o := range g.objs {
		if k.sees(r) {
			e.served(where, r, o)
		} else {
			e.redacted(where, r, o)
		}
	}
}

// served checks a record served with its patient data.
func (e *phiEnv) served(where string, r *phiRecord, o map[string]json.RawMessage) {
	t := e.t
	t.Helper()
	if isTrue(o["redacted"]) {
		t.Errorf("%s: redacted, but the credential may read it: %s", where, show(o))
		return
	}
	if r.class != "event" {
		var named bool
		for _, f := range r.phiFields() {
			named = named || bytes.Contains(o[f], []byte(r.patient))
		}
		if !named {
			t.Errorf("%s: served without its patient (%s): %s", where, r.patient, show(o))
		}
		return
	}
	payload := o["payload"]
	if r.published != nil {
		var have map[string]any
		want, _ := json.Marshal(r.published)
		var w map[string]any
		_ = json.Unmarshal(want, &w)
		if json.Unmarshal(payload, &have) != nil || !reflect.DeepEqual(have, w) {
			t.Errorf("%s: payload %s, want it as published: %s", where, payload, want)
		}
		return
	}
	if r.patient != "" && !slices.Contains(phi.Patients(payload).IDs, r.patient) {
		t.Errorf("%s: payload %s does not name %s", where, payload, r.patient)
	}
}

// redacted checks a record served without its patient data: marked redacted, no classified field,
// and the patient named nowhere in it, whatever the field.
func (e *phiEnv) redacted(where string, r *phiRecord, o map[string]json.RawMessage) {
	t := e.t
	t.Helper()
	raw := show(o)
	if !isTrue(o["redacted"]) {
		t.Errorf("%s: not marked redacted: %s", where, raw)
	}
	if strings.Contains(raw, r.patient) || strings.Contains(raw, strings.Replace(r.patient, "_", "-", 1)) {
		t.Errorf("%s: names the patient %s: %s", where, r.patient, raw)
	}
	if r.class != "event" {
		for _, f := range r.phiFields() {
			if v := strings.TrimSpace(string(o[f])); v != "" && v != "null" && v != `""` {
				t.Errorf("%s: %s is %s; patient data must be removed", where, f, v)
			}
		}
		return
	}
	var payload map[string]json.RawMessage
	if err := json.Unmarshal(o["payload"], &payload); err != nil {
		t.Errorf("%s: payload %s: %v", where, o["payload"], err)
		return
	}
	for _, f := range r.phiFields() {
		if _, ok := payload[f]; ok {
			t.Errorf("%s: payload keeps %s: %s", where, f, o["payload"])
		}
	}
	if phi.Patients(o["payload"]).Named {
		t.Errorf("%s: payload still names a patient: %s", where, o["payload"])
	}
	for _, f := range r.kept() {
		want, _ := json.Marshal(r.published[f])
		if !jsonEqual(payload[f], want) {
			t.Errorf("%s: payload lost %s, which is no patient data: %s", where, f, o["payload"])
		}
	}
}

func isTrue(raw json.RawMessage) bool { return strings.TrimSpace(string(raw)) == "true" }

func jsonEqual(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

func show(o map[string]json.RawMessage) string {
	b, _ := json.Marshal(o)
	return string(b)
}

// phiEnv is the node, its fixture and what every credential kind collected from the streams.
type phiEnv struct {
	t       *testing.T
	s       *servertest.Server
	f       *fixture
	since   time.Time
	project string // the agent's and workflow's project (events are published here)
	devices string // the organization's oldest project, where device events land
	agent   string
	flow    string // a workflow of one load_patient step
	invoke  string // the invoke path of a RUNNING NEWS2 deployment
	records []*phiRecord
	log     storage.EventLog // the node's, opened by logged

	mu       sync.Mutex
	pushed   map[string][]map[string]json.RawMessage // "<field>/<kind>/<record id>" → pushes
	hooks    map[string]string                       // kind name → webhook id
	cache    map[string]any
	receiver *httptest.Server
}

func newPHIEnv(t *testing.T, s *servertest.Server) *phiEnv {
	// Only the credential cache of the matrix's fixture: its spare webhook would send to a
	// public address.
	f := &fixture{t: t, s: s, org: demo.DemoOrgID, keys: map[string]string{}}
	e := &phiEnv{t: t, s: s, f: f, pushed: map[string][]map[string]json.RawMessage{}, hooks: map[string]string{}, cache: map[string]any{}}
	for _, q := range []struct {
		dst   *string
		query string
		arg   string
	}{
		{&e.project, `select id from projects where org_id = $1 and name = $2`, demo.SepsisProjectName},
		{&e.agent, `select id from agents where org_id = $1 and name = $2`, demo.Ward7AgentName},
		{&e.devices, `select id from projects where org_id = $1 and $2 <> '' order by created_at, id limit 1`, "oldest"},
	} {
		if err := s.Pool().QueryRow(context.Background(), q.query, f.org, q.arg).Scan(q.dst); err != nil {
			t.Fatalf("%s: %v", q.query, err)
		}
	}
	var flow struct{ CreateWorkflow struct{ ID string } }
	e.gqlOK(f.platformKey(), `mutation($p: ID!) { createWorkflow(name: "phi matrix", projectId: $p, steps: ["load_patient"]) { id } }`,
		map[string]any{"p": e.project}, &flow)
	e.flow = flow.CreateWorkflow.ID

	var installation string
	if err := s.Pool().QueryRow(context.Background(), `select i.id from installations i join assets a on a.id = i.asset_id
where i.project_id = $1 and a.name = $2`, e.project, demo.NEWS2ModelName).Scan(&installation); err != nil {
		t.Fatal(err)
	}
	var dep struct{ CreateDeployment struct{ ID string } }
	e.gqlOK(f.platformKey(), `mutation($i: ID!) { createDeployment(installationId: $i, environment: "production", replicas: 2) { id } }`,
		map[string]any{"i": installation}, &dep)
	servertest.Eventually(t, 30*time.Second, "the NEWS2 deployment to run", func() bool {
		var d struct{ Status string }
		s.Do(http.MethodGet, "/v1/deployments/"+dep.CreateDeployment.ID, f.platformKey(), nil).JSON(t, &d)
		return d.Status == "RUNNING"
	})
	e.invoke = "/v1/deployments/" + dep.CreateDeployment.ID + "/invoke"
	return e
}

// key returns a credential of kind k holding also extra.
func (e *phiEnv) key(k credKind, extra ...string) string {
	if k.platform {
		return e.f.platformKey()
	}
	scopes := slices.Clone(k.scopes)
	for _, s := range extra {
		if !slices.Contains(scopes, s) {
			scopes = append(scopes, s)
		}
	}
	slices.Sort(scopes)
	return e.f.key(k.slug, k.mode, scopes...)
}

// do sends a request, waiting out rate limits.
func (e *phiEnv) do(method, path, key string, body any) *servertest.Response {
	e.t.Helper()
	for range 10 {
		r := e.s.Do(method, path, key, body)
		if r.Status != http.StatusTooManyRequests {
			return r
		}
		time.Sleep(time.Second)
	}
	e.t.Fatalf("%s %s: rate limited ten times in a row", method, path)
	return nil
}

// gql runs a GraphQL operation and returns its data and first error code ("" when none).
func (e *phiEnv) gql(key, query string, vars map[string]any) (json.RawMessage, string) {
	e.t.Helper()
	r := e.do(http.MethodPost, "/graphql", key, map[string]any{"query": query, "variables": vars})
	var g servertest.GraphQLResponse
	if err := json.Unmarshal(r.Body, &g); err != nil {
		e.t.Fatalf("graphql: %d %s", r.Status, r.Body)
	}
	if len(g.Errors) > 0 {
		if g.Errors[0].Code() == "" || g.Errors[0].Code() == "INTERNAL" || g.Errors[0].Code() == "BAD_USER_INPUT" {
			e.t.Fatalf("graphql %s: %+v", query, g.Errors)
		}
		return g.Data, g.Errors[0].Code()
	}
	return g.Data, ""
}

func (e *phiEnv) gqlOK(key, query string, vars map[string]any, out any) {
	e.t.Helper()
	data, code := e.gql(key, query, vars)
	if code != "" {
		e.t.Fatalf("graphql %s: %s", query, code)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			e.t.Fatalf("graphql %s: %s: %v", query, data, err)
		}
	}
}

// field returns data.<name> as an object, or nil when it is null or absent.
func field(data json.RawMessage, name string) map[string]json.RawMessage {
	var d map[string]json.RawMessage
	var o map[string]json.RawMessage
	if json.Unmarshal(data, &d) != nil || json.Unmarshal(d[name], &o) != nil {
		return nil
	}
	return o
}

// listen opens, for every credential kind, the three subscriptions on one connection and a
// webhook subscription per project, before any record exists.
func (e *phiEnv) listen() {
	t := e.t
	e.receiver = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var o map[string]json.RawMessage
		if json.Unmarshal(body, &o) == nil {
			e.push("webhook/"+strings.TrimPrefix(r.URL.Path, "/"), r.Header.Get("webhook-id"), o)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(e.receiver.Close)

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	wsURL := "ws" + strings.TrimPrefix(e.s.URL, "http") + "/graphql"
	subscribers := 0
	for _, k := range credKinds {
		c, err := wstest.Dial(ctx, wsURL, "Bearer "+e.key(k, streamScopes...))
		if err != nil {
			t.Fatalf("%s: dial: %v", k.name, err)
		}
		t.Cleanup(c.Close)
		type subscription struct {
			field, query string
			vars         map[string]any
		}
		subs := []subscription{
			{"agentSessionUpdated", `subscription($a: ID!) { agentSessionUpdated(agentId: $a) { id patientId status input output error redacted } }`,
				map[string]any{"a": e.agent}},
			{"workflowRunUpdated", `subscription($w: ID!) { workflowRunUpdated(workflowId: $w) { id status input output redacted } }`,
				map[string]any{"w": e.flow}},
		}
		for _, p := range slices.Compact([]string{e.project, e.devices}) {
			subs = append(subs, subscription{"eventStream", `subscription($p: ID!) { eventStream(projectId: $p) { id type payload redacted } }`,
				map[string]any{"p": p}})
		}
		for j, sub := range subs {
			ch, err := c.Subscribe(ctx, strconv.Itoa(j), sub.query, sub.vars)
			if err != nil {
				t.Fatalf("%s: subscribe %s: %v", k.name, sub.field, err)
			}
			go func() {
				for m := range ch {
					if o := field(dataOf(m), sub.field); o != nil {
						var id string
						_ = json.Unmarshal(o["id"], &id)
						e.push(sub.field+"/"+k.name, id, o)
					}
				}
			}()
			if !k.foreign() {
				subscribers++
			}
		}
		if k.foreign() {
			continue
		}
		for _, p := range slices.Compact([]string{e.project, e.devices}) {
			var hook struct{ CreateWebhook struct{ ID string } }
			e.gqlOK(e.key(k, access.AdminOrg), `mutation($p: ID!, $u: String!) { createWebhook(projectId: $p, url: $u, events: ["*"]) { id } }`,
				map[string]any{"p": p, "u": e.receiver.URL + "/" + url.PathEscape(k.name)}, &hook)
			if p == e.project {
				e.hooks[k.name] = hook.CreateWebhook.ID
			}
		}
	}
	e.s.WaitSubscribers(subscribers)
	// The fan-out reads from the tail of the events topic once its partitions are assigned: probe
	// until an event published now reaches the streams.
	probe := e.key(credKinds[0], access.ExecWorkflows)
	for _, p := range slices.Compact([]string{e.project, e.devices}) {
		servertest.Eventually(t, 60*time.Second, "a probe event on the streams of "+p, func() bool {
			var ev struct{ PublishEvent struct{ ID string } }
			e.gqlOK(probe, `mutation($p: ID!) { publishEvent(type: "phi.probe", payload: {}, projectId: $p) { id } }`, map[string]any{"p": p}, &ev)
			deadline := time.Now().Add(250 * time.Millisecond)
			for time.Now().Before(deadline) {
				if len(e.pushes("eventStream/"+credKinds[0].name, ev.PublishEvent.ID)) > 0 {
					return true
				}
				time.Sleep(20 * time.Millisecond)
			}
			return false
		})
	}
}

func dataOf(m json.RawMessage) json.RawMessage {
	var p struct{ Data json.RawMessage }
	_ = json.Unmarshal(m, &p)
	return p.Data
}

func (e *phiEnv) push(stream, id string, o map[string]json.RawMessage) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pushed[stream+"/"+id] = append(e.pushed[stream+"/"+id], o)
}

func (e *phiEnv) pushes(stream, id string) []map[string]json.RawMessage {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.pushed[stream+"/"+id])
}

// patients are the two patients every record is made for.
var phiPatients = []struct {
	id        string
	synthetic bool
}{{demo.RealPatientID, false}, {demo.DeterioratingPatientID, true}}

// produce makes the records: events published from the catalogue and the classification, a
// live agent run and workflow run per patient with the events they emit, an ingested
// observation per patient with its device event, and a control event naming nobody.
func (e *phiEnv) produce() {
	t := e.t
	e.since = time.Now().Add(-time.Second)
	live := credKinds[0]
	publisher := e.key(live, access.ExecWorkflows, access.ExecAgents, access.WriteObservations)

	types := []string{"integration.vitals_note"} // an uncatalogued type: free-form
	for _, et := range events.Catalogue {
		types = append(types, et.Type)
	}
	for _, pt := range phiPatients {
		for _, typ := range types {
			payload := payloadFor(typ, pt.id)
			var ev struct{ PublishEvent struct{ ID string } }
			e.gqlOK(publisher, `mutation($t: String!, $p: ID!, $pl: JSON!) { publishEvent(type: $t, payload: $pl, projectId: $p) { id } }`,
				map[string]any{"t": typ, "p": e.project, "pl": payload}, &ev)
			subject, _ := phi.ClassifyEvent(typ, mustJSON(payload))
			e.records = append(e.records, &phiRecord{name: "published " + typ + " of " + pt.id, class: "event", id: ev.PublishEvent.ID,
				project: e.project, patient: pt.id, synthetic: pt.synthetic, need: subject.Need, typ: typ, published: payload,
				sample: typ == "device.observation_received" || typ == "integration.vitals_note"})
		}

		var ses struct{ RunAgent struct{ ID string } }
		e.gqlOK(publisher, `mutation($a: ID!, $p: String!) { runAgent(agentId: $a, patientId: $p) { id } }`,
			map[string]any{"a": e.agent, "p": pt.id}, &ses)
		e.records = append(e.records, &phiRecord{name: "session of " + pt.id, class: "session", id: ses.RunAgent.ID, patient: pt.id,
			synthetic: pt.synthetic, need: phi.AgentSession.Need, sample: true})
		e.emitted("sessionId", ses.RunAgent.ID, e.project, pt.id, pt.synthetic, "agent.run_completed", "agent.session.updated")

		var run struct{ RunWorkflow struct{ ID string } }
		e.gqlOK(publisher, `mutation($w: ID!, $in: JSON) { runWorkflow(workflowId: $w, input: $in) { id } }`,
			map[string]any{"w": e.flow, "in": map[string]any{"patient_id": pt.id}}, &run)
		e.records = append(e.records, &phiRecord{name: "run of " + pt.id, class: "run", id: run.RunWorkflow.ID, patient: pt.id,
			synthetic: pt.synthetic, need: phi.WorkflowRun.Need, sample: true})

		r := e.do(http.MethodPost, "/v1/observations", publisher, map[string]any{
			"resourceType": "Observation", "status": "final",
			"code":              map[string]any{"coding": []any{map[string]any{"system": "http://loinc.org", "code": clinical.LOINCHeartRate}}},
			"subject":           map[string]any{"reference": "Patient/" + pt.id},
			"effectiveDateTime": time.Now().UTC().Format(time.RFC3339),
			"valueQuantity":     map[string]any{"value": 131, "unit": "/min"},
		})
		var obs struct{ IDs []string }
		r.JSON(t, &obs)
		if r.Status != http.StatusAccepted || len(obs.IDs) != 1 {
			t.Fatalf("POST /v1/observations: %d %s", r.Status, r.Body)
		}
		e.emitted("observationId", obs.IDs[0], e.devices, pt.id, pt.synthetic, "device.observation_received")

		e.records = append(e.records, &phiRecord{name: "invoke on " + pt.id, class: "invoke", patient: pt.id, synthetic: pt.synthetic,
			need: phi.InvokeResult.Need, sample: true})
	}
	var ev struct{ PublishEvent struct{ ID string } }
	control := map[string]any{"note": "nobody's data"}
	e.gqlOK(publisher, `mutation($p: ID!, $pl: JSON!) { publishEvent(type: "integration.heartbeat", payload: $pl, projectId: $p) { id } }`,
		map[string]any{"p": e.project, "pl": control}, &ev)
	e.records = append(e.records, &phiRecord{name: "control event naming no patient", class: "event", id: ev.PublishEvent.ID,
		project: e.project, typ: "integration.heartbeat", published: control})

	// Every event must be in the event log before the reads.
	for _, r := range e.records {
		if r.class != "event" {
			continue
		}
		servertest.Eventually(t, 30*time.Second, "event "+r.id+" in the event log", func() bool {
			return slices.ContainsFunc(e.logged(r.project, r.typ), func(ev events.Event) bool { return ev.ID == r.id })
		})
	}
}

// logged is every event of typ in project's event log (Postgres or ClickHouse, as the node
// runs), newest first.
func (e *phiEnv) logged(project, typ string) []events.Event {
	if e.log == nil {
		e.log = e.s.EventLog()
	}
	var out []events.Event
	q := storage.EventQuery{ProjectID: project, Type: typ, Limit: 1000}
	for {
		page, err := e.log.QueryEvents(context.Background(), q)
		if err != nil {
			e.t.Fatalf("event log: %v", err)
		}
		out = append(out, page.Events...)
		if page.NextCursor == "" {
			return out
		}
		q.Cursor = page.NextCursor
	}
}

// emitted adds, as records, the events of types that the platform emitted for a change: the
// oldest of each type in project whose payload has field = arg.
func (e *phiEnv) emitted(field, arg, project, patient string, synthetic bool, types ...string) {
	t := e.t
	for _, typ := range types {
		var id string
		servertest.Eventually(t, 30*time.Second, typ+" of "+arg, func() bool {
			for _, ev := range slices.Backward(e.logged(project, typ)) {
				var payload map[string]any
				if json.Unmarshal(ev.Payload, &payload) == nil && payload[field] == arg {
					id = ev.ID
					return true
				}
			}
			return false
		})
		c, _ := phi.EventClassOf(typ)
		e.records = append(e.records, &phiRecord{name: "emitted " + typ + " of " + patient, class: "event", id: id, project: project,
			patient: patient, synthetic: synthetic, need: c.Need, typ: typ})
	}
}

// payloadFor fills every catalogue field of typ, the fields naming a patient with patient, and
// names the patient even where the catalogue does not (as an integration's payload may).
func payloadFor(typ, patient string) map[string]any {
	out := map[string]any{}
	et, ok := events.Lookup(typ)
	for _, f := range et.Payload {
		switch {
		case phi.IsPatientKey(f.Name):
			out[f.Name] = patient
		case f.Type == events.FieldNumber:
			out[f.Name] = 97.531
		case f.Type == events.FieldInteger:
			out[f.Name] = 4242
		case f.Type == events.FieldBoolean:
			out[f.Name] = true
		case f.Type == events.FieldDateTime:
			out[f.Name] = "2024-05-01T12:00:00Z"
		case f.Type == events.FieldObject:
			out[f.Name] = map[string]any{"k": "v-" + f.Name}
		case f.Type == events.FieldArray:
			out[f.Name] = []any{"v-" + f.Name}
		default:
			out[f.Name] = "v-" + f.Name
		}
	}
	if _, named := out["patientId"]; !named {
		out["patient_id"] = patient
	}
	if !ok {
		out["heartRate"] = 131
		out["note"] = map[string]any{"subject": map[string]any{"reference": "Patient/" + strings.Replace(patient, "_", "-", 1)}}
	}
	return out
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// cached memoizes a read per key.
func cached[T any](e *phiEnv, key string, read func() T) T {
	if v, ok := e.cache[key]; ok {
		return v.(T)
	}
	v := read()
	e.cache[key] = v
	return v
}

// byID indexes a list of objects by their id.
func byID(list []map[string]json.RawMessage) map[string]map[string]json.RawMessage {
	out := map[string]map[string]json.RawMessage{}
	for _, o := range list {
		var id string
		_ = json.Unmarshal(o["id"], &id)
		out[id] = o
	}
	return out
}

func one(o map[string]json.RawMessage, refused string) got {
	if o == nil {
		return got{refused: refused}
	}
	return got{objs: []map[string]json.RawMessage{o}}
}

func (e *phiEnv) restEvents(k credKind, r *phiRecord) got {
	list := cached(e, "rest events/"+k.name+"/"+r.project, func() map[string]map[string]json.RawMessage {
		resp := e.do(http.MethodGet, "/v1/events?limit=1000&projectId="+r.project+"&since="+e.since.UTC().Format(time.RFC3339Nano), e.key(k), nil)
		var page struct{ Data []map[string]json.RawMessage }
		if resp.Status == http.StatusOK {
			resp.JSON(e.t, &page)
		}
		return byID(page.Data)
	})
	return one(list[r.id], "absent")
}

func (e *phiEnv) gqlEvents(k credKind, r *phiRecord) got {
	list := e.gqlList(k, `query($p: ID!, $t: String, $s: DateTime) { events(projectId: $p, type: $t, since: $s, limit: 100) { id type payload redacted } }`,
		map[string]any{"p": r.project, "t": r.typ, "s": e.since.UTC().Format(time.RFC3339Nano)}, "events")
	return one(list[r.id], "absent")
}

// gqlList reads, once per credential kind and query, the list at path in a query's data,
// indexed by id.
func (e *phiEnv) gqlList(k credKind, query string, vars map[string]any, path ...string) map[string]map[string]json.RawMessage {
	return cached(e, k.name+query+fmt.Sprint(vars), func() map[string]map[string]json.RawMessage {
		data, _ := e.gql(e.key(k), query, vars)
		for _, f := range path {
			var m map[string]json.RawMessage
			_ = json.Unmarshal(data, &m)
			data = m[f]
		}
		var list []map[string]json.RawMessage
		_ = json.Unmarshal(data, &list)
		return byID(list)
	})
}

// streamed reads what a subscription of field pushed, waiting for a credential that must get it.
func streamed(field string) func(e *phiEnv, k credKind, r *phiRecord) got {
	return func(e *phiEnv, k credKind, r *phiRecord) got {
		return e.awaitPush(field+"/"+k.name, k, r)
	}
}

func (e *phiEnv) awaitPush(stream string, k credKind, r *phiRecord) got {
	if k.foreign() {
		return got{objs: e.pushes(stream, r.id), refused: "not subscribed"}
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if p := e.pushes(stream, r.id); len(p) > 0 {
			return got{objs: p}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return got{refused: "not pushed within 30 s"}
}

func (e *phiEnv) webhookBodies(k credKind, r *phiRecord) got {
	return e.awaitPush("webhook/"+k.name, k, r)
}

// deliveryRead reads, with k's credential, the delivery of r to the webhook of the kind that may
// read everything: what k sees of it is what both may see.
func (e *phiEnv) deliveryRead(k credKind, r *phiRecord) got {
	owner := credKinds[0]
	e.awaitPush("webhook/"+owner.name, owner, r)
	var delivery string
	if err := e.s.Pool().QueryRow(context.Background(), `select id from webhook_deliveries where webhook_id = $1 and event_id = $2`,
		e.hooks[owner.name], r.id).Scan(&delivery); err != nil {
		e.t.Fatalf("delivery of %s: %v", r.id, err)
	}
	resp := e.do(http.MethodGet, "/v1/webhooks/deliveries/"+delivery, e.key(k, access.AdminOrg), nil)
	var d struct{ Body map[string]json.RawMessage }
	if resp.Status != http.StatusOK {
		return got{refused: strconv.Itoa(resp.Status)}
	}
	resp.JSON(e.t, &d)
	return one(d.Body, "no body")
}

func (e *phiEnv) publishAs(k credKind, r *phiRecord) got {
	data, code := e.gql(e.key(k, access.ExecWorkflows), `mutation($t: String!, $p: ID!, $pl: JSON!) { publishEvent(type: $t, payload: $pl, projectId: $p) { id type payload redacted } }`,
		map[string]any{"t": r.typ, "p": r.project, "pl": r.published})
	return one(field(data, "publishEvent"), code)
}

func (e *phiEnv) agentSessions(k credKind, r *phiRecord) got {
	list := e.gqlList(k, `query($a: ID!) { agent(id: $a) { sessions { id patientId status input output error redacted } } }`,
		map[string]any{"a": e.agent}, "agent", "sessions")
	return one(list[r.id], "absent")
}

func (e *phiEnv) runAgentAs(k credKind, r *phiRecord) got {
	data, code := e.gql(e.key(k, access.ExecAgents), `mutation($a: ID!, $p: String!) { runAgent(agentId: $a, patientId: $p) { id patientId status input output error redacted } }`,
		map[string]any{"a": e.agent, "p": r.patient})
	return one(field(data, "runAgent"), code)
}

func (e *phiEnv) workflowRun(k credKind, r *phiRecord) got {
	data, code := e.gql(e.key(k), `query($id: ID!) { workflowRun(id: $id) { id input output redacted } }`, map[string]any{"id": r.id})
	return one(field(data, "workflowRun"), code)
}

func (e *phiEnv) workflowRuns(k credKind, r *phiRecord) got {
	list := e.gqlList(k, `query($w: ID!) { workflow(id: $w) { runs { id input output redacted } } }`, map[string]any{"w": e.flow},
		"workflow", "runs")
	return one(list[r.id], "absent")
}

func (e *phiEnv) restRun(k credKind, r *phiRecord) got {
	return e.restObject(e.do(http.MethodGet, "/v1/workflow-runs/"+r.id, e.key(k), nil))
}

func (e *phiEnv) runWorkflowAs(k credKind, r *phiRecord) got {
	data, code := e.gql(e.key(k, access.ExecWorkflows), `mutation($w: ID!, $in: JSON) { runWorkflow(workflowId: $w, input: $in) { id input output redacted } }`,
		map[string]any{"w": e.flow, "in": map[string]any{"patient_id": r.patient}})
	return one(field(data, "runWorkflow"), code)
}

func (e *phiEnv) startRunAs(k credKind, r *phiRecord) got {
	return e.restObject(e.do(http.MethodPost, "/api/v1/workflows/runs", e.key(k, access.ExecWorkflows),
		map[string]any{"workflow_id": e.flow, "trigger": "manual", "input": map[string]any{"patient_id": r.patient}}))
}

func (e *phiEnv) invokeAs(k credKind, r *phiRecord) got {
	return e.restObject(e.do(http.MethodPost, e.invoke, e.key(k, access.ExecAgents), map[string]any{"patientId": r.patient}))
}

// restObject is a REST answer as a got: the body on 2xx, else its error code.
func (e *phiEnv) restObject(resp *servertest.Response) got {
	if resp.Status >= 300 {
		var er struct{ Error struct{ Code string } }
		_ = json.Unmarshal(resp.Body, &er)
		if er.Error.Code == "" || resp.Status >= 500 {
			e.t.Fatalf("HTTP %d %s", resp.Status, resp.Body)
		}
		return got{refused: er.Error.Code}
	}
	var o map[string]json.RawMessage
	resp.JSON(e.t, &o)
	return got{objs: []map[string]json.RawMessage{o}}
}

// checkAudit: a live read that returns patient data is audited with the patients it returned; a
// read that returned none of it names none.
func (e *phiEnv) checkAudit() {
	t := e.t
	admin := e.f.key(demo.DemoOrgSlug, access.Live, access.AdminOrg)
	patientsOf := func(key string) []string {
		id := keyID(t, e.s, admin, key)
		var out []string
		page := auditOf(t, e.s, admin, id, func(p auditPage) bool { return len(p.Data) > 0 })
		for _, rec := range page.Data {
			out = append(out, rec.PatientIDs...)
		}
		return out
	}
	var run *phiRecord
	for _, r := range e.records {
		if r.class == "run" && !r.synthetic {
			run = r
		}
	}
	for _, c := range []struct {
		what string
		read func(key string) *servertest.Response
	}{
		{"GET /v1/events", func(key string) *servertest.Response {
			return e.do(http.MethodGet, "/v1/events?limit=1000&projectId="+e.project+"&since="+e.since.UTC().Format(time.RFC3339Nano), key, nil)
		}},
		{"query agent.sessions", func(key string) *servertest.Response {
			return e.do(http.MethodPost, "/graphql", key, map[string]any{"query": `query($a: ID!) { agent(id: $a) { sessions { id patientId output } } }`,
				"variables": map[string]any{"a": e.agent}})
		}},
		{"GET /v1/workflow-runs/{id}", func(key string) *servertest.Response {
			return e.do(http.MethodGet, "/v1/workflow-runs/"+run.id, key, nil)
		}},
	} {
		reader := e.s.Key(demo.DemoOrgSlug, access.Live, access.ReadPatients, access.ReadObservations)
		if r := c.read(reader); r.Status != http.StatusOK {
			t.Fatalf("%s: %d %s", c.what, r.Status, r.Body)
		}
		if got := patientsOf(reader); !slices.Contains(got, demo.RealPatientID) {
			t.Errorf("%s returned %s's data but its audit record names patients %v", c.what, demo.RealPatientID, got)
		}
		billing := e.s.Key(demo.DemoOrgSlug, access.Live, access.AdminBilling)
		if r := c.read(billing); r.Status != http.StatusOK {
			t.Fatalf("%s: %d %s", c.what, r.Status, r.Body)
		}
		if got := patientsOf(billing); len(got) != 0 {
			t.Errorf("%s returned no patient data to admin:billing but its audit record names patients %v", c.what, got)
		}
	}
}
