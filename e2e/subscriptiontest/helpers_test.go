package subscriptiontest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"carehub/api/ws/wstest"
	"carehub/e2e/servertest"
)

const (
	eventStreamQuery = `subscription($projectId: ID!, $types: [String!]) {
  eventStream(projectId: $projectId, types: $types) { id type payload source timestamp projectId severity }
}`
	publishMutation = `mutation($type: String!, $payload: JSON!, $projectId: ID!) {
  publishEvent(type: $type, payload: $payload, projectId: $projectId) { id type timestamp projectId }
}`
	// probeType is the type of the events ready publishes; watch drops them, so that a probe
	// still in flight when a test starts is never taken for one of its events.
	probeType = "probe.ready"
)

// testNode is a running carehub node under test.
type testNode struct {
	*servertest.Server
	hc *http.Client
}

func startNode(t *testing.T, opts ...servertest.Option) *testNode {
	return wrap(servertest.Start(t, opts...))
}

func wrap(s *servertest.Server) *testNode {
	return &testNode{Server: s, hc: &http.Client{Timeout: 30 * time.Second}}
}

func (n *testNode) wsURL() string { return "ws://" + n.Addr() + "/graphql" }

// gql posts one GraphQL operation. Unlike servertest.Server.GraphQL it reports errors instead of
// failing the test, so it may run on any goroutine.
func (n *testNode) gql(ctx context.Context, key, query string, vars map[string]any) (*servertest.GraphQLResponse, error) {
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.URL+"/graphql", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := n.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out servertest.GraphQLResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("graphql: HTTP %d: undecodable body: %w", resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK {
		return &out, fmt.Errorf("graphql: HTTP %d: %+v", resp.StatusCode, out.Errors)
	}
	return &out, nil
}

// mustGQL runs an operation that must succeed and decodes its data into out (if not nil).
func (n *testNode) mustGQL(t testing.TB, key, query string, vars map[string]any, out any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := n.gql(ctx, key, query, vars)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Errors) > 0 {
		t.Fatalf("graphql errors: %+v\nquery: %s", r.Errors, query)
	}
	if out != nil {
		if err := json.Unmarshal(r.Data, out); err != nil {
			t.Fatalf("decode data %s: %v", r.Data, err)
		}
	}
}

// published is what publishEvent returned.
type published struct {
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	Timestamp time.Time `json:"timestamp"`
	ProjectID string    `json:"projectId"`
}

// publish publishes an event through the publishEvent mutation; safe from any goroutine.
func (n *testNode) publish(ctx context.Context, key, projectID, typ string, payload map[string]any) (published, error) {
	r, err := n.gql(ctx, key, publishMutation, map[string]any{"type": typ, "payload": payload, "projectId": projectID})
	if err != nil {
		return published{}, err
	}
	if len(r.Errors) > 0 {
		return published{}, fmt.Errorf("publishEvent %s: %+v", typ, r.Errors)
	}
	var data struct {
		PublishEvent published `json:"publishEvent"`
	}
	if err := json.Unmarshal(r.Data, &data); err != nil || data.PublishEvent.ID == "" {
		return published{}, fmt.Errorf("publishEvent %s: data %s: %v", typ, r.Data, err)
	}
	return data.PublishEvent, nil
}

func (n *testNode) mustPublish(t testing.TB, key, projectID, typ string, payload map[string]any) published {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := n.publish(ctx, key, projectID, typ, payload)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// projectID returns the id of the project called name of the organization with slug.
func (n *testNode) projectID(t testing.TB, key, slug, name string) string {
	t.Helper()
	var data struct {
		Projects []struct{ ID, Name string }
	}
	n.mustGQL(t, key, `query($org: ID!) { projects(organizationId: $org, limit: 100) { id name } }`,
		map[string]any{"org": n.OrgID(slug)}, &data)
	for _, p := range data.Projects {
		if p.Name == name {
			return p.ID
		}
	}
	t.Fatalf("organization %s has no project %q: %+v", slug, name, data.Projects)
	return ""
}

// metric returns the sum of the samples of metric name on the node's /metrics whose labels
// include every given `label="value"`.
func (n *testNode) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	v, err := scrape(n.hc, n.URL, name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func scrape(hc *http.Client, base, name string, labels ...string) (float64, error) {
	resp, err := hc.Get(base + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: HTTP %d", resp.StatusCode)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		metricName, labelSet, _ := strings.Cut(series, "{")
		if metricName != name {
			continue
		}
		match := true
		for _, l := range labels {
			if !strings.Contains(labelSet, l) {
				match = false
			}
		}
		if !match {
			continue
		}
		f, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			return 0, fmt.Errorf("metric %s: %q: %w", name, line, err)
		}
		sum += f
	}
	return sum, sc.Err()
}

// subscribers is the number of subscriptions the node runs: one per running subscription
// operation (of any field), registered when it sees the events from then on (identical ones
// share an execution and one fan-out subscriber).
func (n *testNode) subscribers(t testing.TB) int {
	return int(n.metric(t, "carehub_graphql_subscriptions"))
}

// waitSubscribers waits until the node runs exactly want subscriptions: the subscriptions
// a test just sent are then registered, and see every event published from now on.
func (n *testNode) waitSubscribers(t testing.TB, want int) {
	t.Helper()
	servertest.Eventually(t, 10*time.Second, fmt.Sprintf("%d subscriptions registered", want), func() bool {
		return n.subscribers(t) == want
	})
}

// ready waits until the node's fan-out hub reads the partitions the given projects' events go to.
// The hub starts at the tail of the events topic once its partitions are assigned, so an event
// published earlier is, by design, never delivered; a test that publishes right after start
// would race that. ready subscribes to probe events, publishes one every 250 ms until it
// arrives, and unsubscribes.
func (n *testNode) ready(t testing.TB, key string, projectIDs ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before := n.subscribers(t)
	c, err := wstest.Dial(ctx, n.wsURL(), "Bearer "+key)
	if err != nil {
		t.Fatalf("ready: %v", err)
	}
	defer func() {
		c.Close()
		n.waitSubscribers(t, before)
	}()
	for i, p := range projectIDs {
		ch, err := c.Subscribe(ctx, "probe"+strconv.Itoa(i), eventStreamQuery, map[string]any{"projectId": p, "types": []string{probeType}})
		if err != nil {
			t.Fatalf("ready: %v", err)
		}
		tick := time.NewTicker(250 * time.Millisecond)
		for arrived := false; !arrived; {
			if _, err := n.publish(ctx, key, p, probeType, map[string]any{"probe": i}); err != nil {
				t.Fatalf("ready: %v", err)
			}
			select {
			case _, ok := <-ch:
				if !ok {
					t.Fatalf("ready: probe subscription ended: %v", c.Err("probe"+strconv.Itoa(i)))
				}
				arrived = true
			case <-tick.C:
			case <-ctx.Done():
				t.Fatalf("ready: no probe event of project %s arrived within a minute: the fan-out does not deliver", p)
			}
		}
		tick.Stop()
	}
}

// protocol is one of the two WebSocket subprotocols and how to dial it.
type protocol struct {
	name string
	dial func(ctx context.Context, url, authorization string) (*wstest.Client, error)
}

var protocols = []protocol{{wstest.Subprotocol, wstest.Dial}, {wstest.LegacySubprotocol, wstest.DialLegacy}}

// dial connects to the node with key in protocol p; the client is closed when the test ends.
func (n *testNode) dial(t testing.TB, p protocol, key string) *wstest.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := p.dial(ctx, n.wsURL(), "Bearer "+key)
	if err != nil {
		t.Fatalf("%s: dial: %v", p.name, err)
	}
	t.Cleanup(c.Close)
	return c
}

// subscribe starts an operation that must be accepted; the returned channel yields its results.
func subscribe(t testing.TB, c *wstest.Client, id, query string, vars map[string]any) <-chan json.RawMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, err := c.Subscribe(ctx, id, query, vars)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// rejection waits for operation id to end with an error message and returns its error codes;
// it fails the test if the operation delivers a result or ends otherwise.
func rejection(t testing.TB, c *wstest.Client, id string, ch <-chan json.RawMessage) []string {
	t.Helper()
	select {
	case raw, ok := <-ch:
		if ok {
			t.Fatalf("operation %s delivered %s, want an error", id, raw)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("operation %s neither failed nor delivered within 10 s", id)
	}
	var oe *wstest.OperationError
	if err := c.Err(id); !errors.As(err, &oe) {
		t.Fatalf("operation %s ended with %v, want an error message", id, err)
	}
	var codes []string
	for _, raw := range oe.Errors {
		var e struct {
			Message    string         `json:"message"`
			Extensions map[string]any `json:"extensions"`
		}
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatalf("error %s: %v", raw, err)
		}
		code, _ := e.Extensions["code"].(string)
		codes = append(codes, code)
		t.Logf("operation %s rejected: %s (%s)", id, e.Message, code)
	}
	return codes
}

// arrival is one result of a subscription as the test saw it.
type arrival struct {
	at  time.Time       // when the client handed it over
	obj json.RawMessage // data.<field>
	ev  event           // obj decoded, for eventStream
	err error           // the result is not {data: {<field>: <object>}}
}

// event is an Event object as eventStream delivers it.
type event struct {
	ID        string         `json:"id"`
	Type      string         `json:"type"`
	Payload   map[string]any `json:"payload"`
	Source    string         `json:"source"`
	Timestamp time.Time      `json:"timestamp"`
	ProjectID string         `json:"projectId"`
	Severity  string         `json:"severity"`
}

// seq is payload.seq, or -1.
func (e event) seq() int {
	f, ok := e.Payload["seq"].(float64)
	if !ok {
		return -1
	}
	return int(f)
}

// watch timestamps and decodes the results of ch as they arrive, on a goroutine of its own so
// that a test busy publishing does not delay the timestamps. Every result must have the spec's
// shape {data: {<field>: <object>}}; for eventStream, probe events are dropped.
func watch(ch <-chan json.RawMessage, field string) <-chan arrival {
	out := make(chan arrival, 1<<14)
	go func() {
		defer close(out)
		for raw := range ch {
			a := arrival{at: time.Now()}
			a.obj, a.err = decode(raw, field)
			if a.err == nil && field == "eventStream" {
				if a.err = json.Unmarshal(a.obj, &a.ev); a.err == nil && a.ev.Type == probeType {
					continue
				}
			}
			out <- a
		}
	}()
	return out
}

// decode checks that raw is {"data": {field: {...}}} and nothing else, and returns the object.
func decode(raw json.RawMessage, field string) (json.RawMessage, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, fmt.Errorf("result %s is not a JSON object: %w", raw, err)
	}
	for k := range top {
		if k != "data" {
			return nil, fmt.Errorf("result has %q beside data: %s", k, raw)
		}
	}
	var data map[string]json.RawMessage
	if err := json.Unmarshal(top["data"], &data); err != nil || data == nil {
		return nil, fmt.Errorf("result's data is not an object: %s", raw)
	}
	obj, ok := data[field]
	if len(data) != 1 || !ok {
		return nil, fmt.Errorf("result's data is not {%q: ...}: %s", field, raw)
	}
	if t := bytes.TrimSpace(obj); len(t) == 0 || t[0] != '{' {
		return nil, fmt.Errorf("data.%s is not an object: %s", field, raw)
	}
	return obj, nil
}

// next returns the next arrival, failing the test on a malformed result, on the stream's end and
// after timeout.
func next(t testing.TB, arrivals <-chan arrival, timeout time.Duration, what string) arrival {
	t.Helper()
	select {
	case a, ok := <-arrivals:
		if !ok {
			t.Fatalf("%s: the subscription ended", what)
		}
		if a.err != nil {
			t.Fatalf("%s: %v", what, a.err)
		}
		return a
	case <-time.After(timeout):
		t.Fatalf("%s: nothing arrived within %v", what, timeout)
	}
	return arrival{}
}

// nextOf returns the next eventStream arrival of type typ, skipping the project's other events
// (platform events a test did not cause: a deployment the runtime starts, a triggered run).
func nextOf(t testing.TB, arrivals <-chan arrival, typ string, timeout time.Duration, what string) arrival {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		a := next(t, arrivals, time.Until(deadline), what)
		if a.ev.Type == typ {
			return a
		}
	}
}

// quiet fails the test if anything arrives within d.
func quiet(t testing.TB, arrivals <-chan arrival, d time.Duration, what string) {
	t.Helper()
	select {
	case a, ok := <-arrivals:
		if ok {
			t.Fatalf("%s: unexpected result %s (%v)", what, a.obj, a.err)
		}
	case <-time.After(d):
	}
}

// latencies summarises a distribution: count, min, p50, p90, p99, max (nearest rank).
func latencies(ds []time.Duration) string {
	if len(ds) == 0 {
		return "n=0"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) time.Duration {
		i := max(int(math.Ceil(p*float64(len(s))))-1, 0)
		return s[i].Round(100 * time.Microsecond)
	}
	return fmt.Sprintf("n=%d min=%v p50=%v p90=%v p99=%v max=%v", len(s), q(0), q(0.5), q(0.9), q(0.99), q(1))
}
