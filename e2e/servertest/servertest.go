// Package servertest starts a whole carehub node in process for black-box tests: a fresh database
// cloned from the migrated template (carehub/storage/postgres/pgtest, whose Main the test package
// must call from TestMain), a Kafka-protocol broker (kfake per test, or the real broker named by
// CAREHUB_TEST_KAFKA_BROKERS, on which each test's nodes have a --kafka-namespace of their own),
// demo data, and the HTTP server on a free loopback port. The event and audit log are in Postgres, or in a fresh database on the ClickHouse server named by
// CAREHUB_CLICKHOUSE_URL when it is set (carehub/storage/clickhouse/chtest). Tests then talk to
// it only through its public API, as a client would.
package servertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/cmd/carehub/node"
	"carehub/internal/testenv"
	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/kernel/events"
	"carehub/kernel/ids"
	"carehub/kernel/sealing"
	"carehub/processors/audit"
	"carehub/processors/deployments"
	"carehub/processors/eventlog"
	"carehub/processors/fhirsubs"
	"carehub/processors/observations"
	"carehub/processors/webhooks"
	"carehub/processors/workflows"
	"carehub/storage"
	"carehub/storage/clickhouse"
	"carehub/storage/clickhouse/chtest"
	"carehub/storage/demo"
	"carehub/storage/kafka"
	"carehub/storage/kafka/kafkatest"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

// carehubGroups are the consumer groups a node runs.
var carehubGroups = []string{eventlog.DefaultGroup, webhooks.DefaultGroup, audit.DefaultGroup, observations.DefaultGroup,
	workflows.DefaultRunnerGroup, workflows.DefaultTriggersGroup, deployments.DefaultScorerGroup, fhirsubs.DefaultGroup}

// nodeGroups is carehubGroups as named in the Kafka namespace ns.
func nodeGroups(ns string) []string {
	groups := make([]string, len(carehubGroups))
	for i, g := range carehubGroups {
		groups[i] = kafka.Namespace(ns).Name(g)
	}
	return groups
}

// namespace gives t's nodes a Kafka namespace of their own on a shared real broker: topics and
// consumer groups no other test, and no other test package running at the same time, reads or
// writes, so nothing an earlier node produced reaches this test's node. When t ends (after its
// nodes stopped: cleanups run last-in first-out) the namespace's topics and groups are deleted,
// so a long-lived broker does not collect them. On kfake every test has a broker of its own and
// needs none of this.
func namespace(t testing.TB, brokers []string) string {
	t.Helper()
	ns := kafkatest.Name(t, "t")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			return
		}
		defer cl.Close()
		adm := kadm.NewClient(cl)
		groups := nodeGroups(ns)
		// Best effort, as kafkatest.Topic's: a leftover costs disk, not correctness.
		_, _ = adm.DeleteGroups(ctx, groups...)
		_, _ = adm.DeleteTopics(ctx, kafka.Namespace(ns).Topics().All()...)
	})
	return ns
}

// Server is a running node and what a test needs to call it.
type Server struct {
	*node.Node
	URL string
	cfg node.Config
	t   testing.TB
}

// Option adjusts the configuration before start.
type Option func(*node.Config)

// WithRoles runs only the given roles.
func WithRoles(roles ...string) Option { return func(c *node.Config) { c.Roles = roles } }

// WithoutSeed starts with an empty database.
func WithoutSeed() Option { return func(c *node.Config) { c.Seed = "none" } }

// Config returns a test configuration on a fresh database and broker.
func Config(t testing.TB, opts ...Option) node.Config {
	cfg := node.Defaults()
	cfg.DataDir = t.TempDir()
	// One sealing key for every node made from this configuration (a test's second node gets a
	// data dir of its own), as a deployment's nodes share one.
	cfg.SealingKeyFile = filepath.Join(t.TempDir(), "sealing.key")
	if err := sealing.Write(cfg.SealingKeyFile); err != nil {
		t.Fatal(err)
	}
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.DatabaseURL = pgtest.NewDSN(t)
	cfg.KafkaBrokers = kafkatest.Brokers(t)
	if chtest.Real() {
		cfg.ClickHouseURL = chtest.NewURL(t)
	}
	if kafkatest.Real() {
		cfg.KafkaNamespace = namespace(t, cfg.KafkaBrokers)
	}
	cfg.Partitions = 3
	cfg.WebhooksAllowPrivate = true
	cfg.ShutdownGrace = 10 * time.Second
	// Suites spread bursts over several keys of the demo organization to stay within a key's
	// rate; the organization's rate (auth's TestMiddlewareOrganizationRate, attacktest's
	// TestOrganizationRateShared, which sets it back to 0, the default) would refuse them.
	cfg.RatePerOrg, cfg.IngestRatePerOrg = 1e6, 1e6
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// Start starts a node with a fresh database and broker and stops it when the test ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	return StartConfig(t, Config(t, opts...))
}

// StartConfig starts a node with cfg (to restart a node on the same database and broker).
func StartConfig(t testing.TB, cfg node.Config) *Server {
	t.Helper()
	return StartLogged(t, cfg, Logger(t))
}

// StartLogged starts a node with cfg that logs to logger (to read what a node logs).
func StartLogged(t testing.TB, cfg node.Config, logger *slog.Logger) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := node.Start(ctx, cfg, logger)
	if err != nil {
		t.Fatalf("start carehub: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("stop carehub: %v", err)
		}
	})
	srv := &Server{Node: s, URL: s.URL(), cfg: cfg, t: t}
	// Before the node stops (cleanups run last registered first).
	t.Cleanup(func() {
		if t.Failed() {
			srv.diagnose(t)
		}
	})
	return srv
}

// Cfg is the configuration the node runs with.
func (s *Server) Cfg() node.Config { return s.cfg }

// EventLog is the store the node keeps its event log in (ClickHouse or Postgres, as configured),
// for tests that plant events to read back through the API.
func (s *Server) EventLog() storage.EventLog {
	s.t.Helper()
	if s.cfg.ClickHouseURL == "" {
		return postgres.NewEventLog(s.Pool())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := clickhouse.Open(ctx, s.cfg.ClickHouseURL, clickhouse.Config{})
	if err != nil {
		s.t.Fatalf("event log: %v", err)
	}
	s.t.Cleanup(func() { _ = store.Close() })
	return store
}

// AnalystDay is a day no seeded or pipeline event falls in: a suite that appends its own history
// there sees only its own events.
var AnalystDay = time.Date(2020, 2, 3, 0, 0, 0, 0, time.UTC)

// AppendAnalystHistory appends 30 events to project straight into the event log, one every 10
// minutes from AnalystDay: agent runs of agt_a (completed) and agt_b (failed), and observations
// of the real demo patient (patient data). It returns them oldest first.
func (s *Server) AppendAnalystHistory(orgID, project string) []events.Event {
	s.t.Helper()
	var evs []events.Event
	for i := range 30 {
		ev := events.Event{ID: ids.New(ids.Event), OrgID: orgID, ProjectID: project, Source: "system", Severity: "info",
			CreatedAt: AnalystDay.Add(time.Duration(i) * 10 * time.Minute)}
		switch i % 3 {
		case 0:
			ev.Type, ev.Payload = "agent.run_completed", json.RawMessage(fmt.Sprintf(`{"agentId":"agt_a","status":"COMPLETED","latencyMs":%d}`, i))
		case 1:
			ev.Type, ev.Severity, ev.Payload = "agent.run.failed", "error", json.RawMessage(`{"agentId":"agt_b","status":"FAILED","latencyMs":5}`)
		default:
			ev.Type, ev.Payload = "device.observation_received", json.RawMessage(`{"observationId":"obs_1","patientId":"`+demo.RealPatientID+`","code":"8867-4","value":88}`)
		}
		evs = append(evs, ev)
	}
	if err := s.EventLog().AppendEvents(context.Background(), evs); err != nil {
		s.t.Fatal(err)
	}
	return evs
}

// Logger logs to the test log at warn and above, or everything with CAREHUB_TEST_VERBOSE=1.
func Logger(t testing.TB) *slog.Logger {
	lvl := slog.LevelWarn
	if os.Getenv("CAREHUB_TEST_VERBOSE") != "" {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: lvl}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// OrgID returns the id of the organization with slug (demo.DemoOrgSlug for the demo tenant).
func (s *Server) OrgID(slug string) string {
	s.t.Helper()
	var id string
	if err := s.Pool().QueryRow(context.Background(), `select id from organizations where slug = $1`, slug).Scan(&id); err != nil {
		s.t.Fatalf("organization %s: %v", slug, err)
	}
	return id
}

// ProjectID returns the id of the project named name (demo.SepsisProjectName, say).
func (s *Server) ProjectID(name string) string {
	s.t.Helper()
	var id string
	if err := s.Pool().QueryRow(context.Background(), `select id from projects where name = $1`, name).Scan(&id); err != nil {
		s.t.Fatalf("project %s: %v", name, err)
	}
	return id
}

// Key creates an API key for the organization with slug and returns its secret.
func (s *Server) Key(slug, mode string, scopes ...string) string {
	s.t.Helper()
	k, err := postgres.NewAPIKeys(s.Pool()).Create(context.Background(), apikeys.NewKey{OrgID: s.OrgID(slug), Mode: mode, Scopes: scopes})
	if err != nil {
		s.t.Fatalf("create key: %v", err)
	}
	return k.Secret
}

// DemoKey is a live key of the demo organization with every scope.
func (s *Server) DemoKey() string { return s.Key(demo.DemoOrgSlug, access.Live, access.Scopes...) }

// PlatformKey is a platform operator key.
func (s *Server) PlatformKey() string {
	s.t.Helper()
	k, err := postgres.NewAPIKeys(s.Pool()).Create(context.Background(), apikeys.NewKey{Platform: true, Mode: access.Live})
	if err != nil {
		s.t.Fatalf("create platform key: %v", err)
	}
	return k.Secret
}

// Response is a decoded HTTP response.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into v, failing the test on error.
func (r *Response) JSON(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("decode %d response %q: %v", r.Status, r.Body, err)
	}
}

// Do sends a request with the key (if non-empty) and a JSON body (if non-nil).
func (s *Server) Do(method, path, key string, body any) *Response {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		switch b := body.(type) {
		case []byte:
			rd = bytes.NewReader(b)
		case string:
			rd = strings.NewReader(b)
		default:
			buf, err := json.Marshal(body)
			if err != nil {
				s.t.Fatalf("encode body: %v", err)
			}
			rd = bytes.NewReader(buf)
		}
	}
	req, err := http.NewRequest(method, s.URL+path, rd)
	if err != nil {
		s.t.Fatalf("request: %v", err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("read %s %s: %v", method, path, err)
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// GraphQLResponse is a GraphQL response body.
type GraphQLResponse struct {
	Data   json.RawMessage `json:"data"`
	Errors []GraphQLError  `json:"errors"`
}

// GraphQLError is one element of a GraphQL errors array.
type GraphQLError struct {
	Message    string           `json:"message"`
	Path       []any            `json:"path"`
	Locations  []map[string]int `json:"locations"`
	Extensions map[string]any   `json:"extensions"`
}

// Code is extensions.code.
func (e GraphQLError) Code() string { s, _ := e.Extensions["code"].(string); return s }

// GraphQL posts a query with variables and decodes the response; HTTP status must be 200.
func (s *Server) GraphQL(key, query string, vars map[string]any) *GraphQLResponse {
	s.t.Helper()
	r := s.Do(http.MethodPost, "/graphql", key, map[string]any{"query": query, "variables": vars})
	if r.Status != http.StatusOK {
		s.t.Fatalf("graphql: HTTP %d: %s", r.Status, r.Body)
	}
	var out GraphQLResponse
	r.JSON(s.t, &out)
	return &out
}

// MustGraphQL posts a query that must succeed, failing t on any error, and decodes its data into
// v (unless nil).
func (s *Server) MustGraphQL(t testing.TB, key, query string, vars map[string]any, v any) {
	t.Helper()
	res := s.GraphQL(key, query, vars)
	if len(res.Errors) > 0 {
		t.Fatalf("errors: %+v\nquery: %s", res.Errors, query)
	}
	if v != nil {
		if err := json.Unmarshal(res.Data, v); err != nil {
			t.Fatalf("decode %s: %v", res.Data, err)
		}
	}
}

// Eventually polls cond until it holds, failing t when timeout passes first (testenv.Eventually).
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, timeout, what, cond)
}

// Subscribers returns how many GraphQL subscriptions the node runs now (each registered for the
// events from then on; identical ones share an execution and one fan-out subscriber), read from
// /metrics as a monitoring client would.
func (s *Server) Subscribers() int {
	s.t.Helper()
	r := s.Do(http.MethodGet, "/metrics", "", nil)
	for _, line := range strings.Split(string(r.Body), "\n") {
		if v, ok := strings.CutPrefix(line, "carehub_graphql_subscriptions "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				s.t.Fatalf("carehub_graphql_subscriptions %q: %v", v, err)
			}
			return int(n)
		}
	}
	return 0
}

// WaitSubscribers waits until the node runs at least n GraphQL subscriptions. A subscription
// that is registered sees every event published after it, so a test that waits here before it
// publishes needs no pause.
func (s *Server) WaitSubscribers(n int) {
	s.t.Helper()
	Eventually(s.t, 20*time.Second, fmt.Sprintf("%d subscriptions registered", n), func() bool { return s.Subscribers() >= n })
}
