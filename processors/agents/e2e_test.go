package agents_test

// Black-box tests and benchmarks: a whole carehub node (e2e/servertest) driven over HTTP
// GraphQL and WebSocket. Async sessions need the node's processors role to run the agent Worker.

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"carehub/api/ws/wstest"
	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/storage/demo"
)

const runAgent = `mutation($a: ID!, $p: String!) { runAgent(agentId: $a, patientId: $p) {
	id status output latencyMs tokensUsed completedAt error } }`

type sessionView struct {
	ID, Status            string
	Output                json.RawMessage
	LatencyMs, TokensUsed *int
	CompletedAt           *string
	Error                 *string
}

// TestRunAgentOverGraphQL: runAgent (sync, the default) on the deteriorating patient answers the
// COMPLETED session with a NEWS2 output whose score a hand computation over the patient's stored
// rows reproduces; the qualifying score's report is in the output.
func TestRunAgentOverGraphQL(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	var ward7 string
	if err := s.Pool().QueryRow(context.Background(), `select id from agents where name = $1`, demo.Ward7AgentName).Scan(&ward7); err != nil {
		t.Fatal(err)
	}
	var d struct{ RunAgent sessionView }
	s.MustGraphQL(t, key, runAgent, map[string]any{"a": ward7, "p": demo.DeterioratingPatientID}, &d)
	ses := d.RunAgent
	if ses.Status != "COMPLETED" || ses.CompletedAt == nil || ses.LatencyMs == nil || ses.TokensUsed == nil || *ses.TokensUsed <= 0 {
		t.Fatalf("session %+v", ses)
	}
	out := decodeOutput(t, ses.Output)
	total, _ := handNEWS2(latest(t, s.Pool(), demo.DeterioratingPatientID))
	if out.Skill != "news2" || out.Score == nil || *out.Score != total || total != 11 || out.Severity != "CRITICAL" {
		t.Fatalf("output score %v, hand-computed %d: %s", deref(out.Score), total, ses.Output)
	}
	if !strings.HasPrefix(out.ReportID, "rpt_") || len(out.Recommendations) == 0 || len(out.Components) != 7 {
		t.Fatalf("output %s", ses.Output)
	}
}

// TestAsyncSessionUpdates: an async run answers QUEUED at once; agentSessionUpdated delivers the
// session when it completes; every state change (QUEUED, RUNNING, COMPLETED) was announced.
func TestAsyncSessionUpdates(t *testing.T) {
	s := servertest.Start(t)
	key := s.DemoKey()
	project := s.ProjectID(demo.SepsisProjectName)
	var c struct{ CreateAgent struct{ ID string } }
	s.MustGraphQL(t, key, `mutation($p: ID!) { createAgent(name: "Async qSOFA", projectId: $p, runMode: "async", skill: "qsofa") { id } }`,
		map[string]any{"p": project}, &c)
	agent := c.CreateAgent.ID

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ws, err := wstest.Dial(ctx, "ws"+strings.TrimPrefix(s.URL, "http")+"/graphql", "Bearer "+key)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	updates, err := ws.Subscribe(ctx, "s", `subscription($a: ID!) { agentSessionUpdated(agentId: $a) { id status output completedAt } }`,
		map[string]any{"a": agent})
	if err != nil {
		t.Fatal(err)
	}
	s.WaitSubscribers(1) // registered before the run

	var d struct{ RunAgent sessionView }
	s.MustGraphQL(t, key, runAgent, map[string]any{"a": agent, "p": demo.DeterioratingPatientID}, &d)
	if d.RunAgent.Status != "QUEUED" || d.RunAgent.CompletedAt != nil || d.RunAgent.Output != nil && string(d.RunAgent.Output) != "null" {
		t.Fatalf("async runAgent answered %+v", d.RunAgent)
	}
	for {
		select {
		case msg, ok := <-updates:
			if !ok {
				t.Fatalf("subscription ended: %v", ws.Err("s"))
			}
			var u struct {
				Data struct{ AgentSessionUpdated sessionView }
			}
			if err := json.Unmarshal(msg, &u); err != nil {
				t.Fatal(err)
			}
			got := u.Data.AgentSessionUpdated
			if got.ID != d.RunAgent.ID || got.Status != "COMPLETED" {
				continue
			}
			if o := decodeOutput(t, got.Output); o.Score == nil || *o.Score != 2 || o.Positive == nil || !*o.Positive || got.CompletedAt == nil {
				t.Fatalf("completed session %+v", got)
			}
			rows, _ := s.Pool().Query(ctx, `select value->'payload'->>'status' from outbox where value->>'type' = 'agent.session.updated'
and value->'payload'->>'sessionId' = $1 order by seq`, got.ID)
			var statuses []string
			for rows.Next() {
				var st string
				_ = rows.Scan(&st)
				statuses = append(statuses, st)
			}
			if !slices.Equal(statuses, []string{"QUEUED", "RUNNING", "COMPLETED"}) {
				t.Fatalf("agent.session.updated %v", statuses)
			}
			return
		case <-ctx.Done():
			t.Fatal("agentSessionUpdated did not deliver the completed session")
		}
	}
}

// BenchmarkRunAgentGraphQL measures sync runAgent (NEWS2 on the deteriorating patient) over HTTP
// GraphQL, one request at a time, and reports p50 and p99 latency: with test keys, and with live
// keys, whose calls also wait for their HIPAA audit record to be acknowledged by the broker.
// Requests rotate over keys so the per-credential rate limit (50/s) does not shape the figure.
func BenchmarkRunAgentGraphQL(b *testing.B) {
	s := servertest.Start(b)
	var ward7 string
	if err := s.Pool().QueryRow(context.Background(), `select id from agents where name = $1`, demo.Ward7AgentName).Scan(&ward7); err != nil {
		b.Fatal(err)
	}
	vars := map[string]any{"a": ward7, "p": demo.DeterioratingPatientID}
	for _, mode := range []string{access.Test, access.Live} {
		keys := make([]string, 40)
		for i := range keys {
			keys[i] = s.Key(demo.DemoOrgSlug, mode, access.ExecAgents)
		}
		b.Run("keys="+mode, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			for i := range b.N {
				start := time.Now()
				res := s.GraphQL(keys[i%len(keys)], runAgent, vars)
				lat = append(lat, time.Since(start))
				if len(res.Errors) > 0 {
					b.Fatalf("errors %+v", res.Errors)
				}
			}
			b.StopTimer()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds())/1000, "p99-ms")
		})
	}
}
