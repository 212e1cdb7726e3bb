package agents_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"carehub/e2e/servertest"
	"carehub/kernel/access"
	"carehub/processors/inference/chat/llamacpptest"
	"carehub/storage/demo"
)

// recorder is a reverse proxy in front of the chat server that keeps the bodies of the
// completions carehub sent, so a test can read what left carehub.
type recorder struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []string
	auth   []string
}

func newRecorder(t *testing.T, target string) *recorder {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	proxy := httputil.NewSingleHostReverseProxy(u)
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			b, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			rec.mu.Lock()
			rec.bodies, rec.auth = append(rec.bodies, string(b)), append(rec.auth, r.Header.Get("Authorization"))
			rec.mu.Unlock()
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(rec.Close)
	return rec
}

// last returns the last completion body sent and its Authorization header.
func (r *recorder) last(t *testing.T) (string, string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.bodies) == 0 {
		t.Fatal("no completion reached the chat server")
	}
	return r.bodies[len(r.bodies)-1], r.auth[len(r.auth)-1]
}

type llmOutput struct {
	Skill, Text, Model, DeploymentID, FinishReason string
	Usage                                          struct{ PromptTokens, CompletionTokens, TotalTokens int }
	Deidentified                                   bool
	ObservationIDs                                 []string
}

const runLLM = `mutation($a: ID!, $p: String!, $in: JSON) { runAgent(agentId: $a, patientId: $p, input: $in) {
	id status output latencyMs tokensUsed completedAt error } }`

// TestLLMAgent: an LLM agent on a real llama.cpp server (OpenAI-compatible chat, a tiny model
// built by tests/llamacpp) completes with the server's own token counts; the patient's
// identifiers reach only a backend covered by a BAA, and any other gets a de-identified context
// and refuses free text; a dead server gives FAILED sessions at once, sync and async, and the
// agent works again when it returns.
func TestLLMAgent(t *testing.T) {
	srv := llamacpptest.Start(t)
	rec := newRecorder(t, srv.URL)
	s := servertest.Start(t)
	key := s.DemoKey()
	project := s.ProjectID(demo.SepsisProjectName)
	var asset struct{ Assets []struct{ ID, Name string } }
	s.MustGraphQL(t, key, `{ assets(type: AGENT, limit: 50) { id name } }`, nil, &asset)
	var assetID string
	for _, a := range asset.Assets {
		if a.Name == "Discharge Summary Drafter" {
			assetID = a.ID
		}
	}
	var ins struct{ InstallAsset struct{ ID string } }
	s.MustGraphQL(t, key, `mutation($a: ID!, $p: ID!) { installAsset(assetId: $a, projectId: $p) { id } }`,
		map[string]any{"a": assetID, "p": project}, &ins)

	secret := "Bearer " + srv.APIKey // the server refuses calls without it
	deploy := func(baa bool) string {
		var d struct{ CreateDeployment struct{ ID string } }
		s.MustGraphQL(t, key, `mutation($i: ID!, $b: InferenceBackendInput) { createDeployment(installationId: $i, environment: "production",
			replicas: 2, backend: $b) { id } }`, map[string]any{"i": ins.InstallAsset.ID, "b": map[string]any{
			"protocol": "openai-chat", "url": rec.URL, "model": srv.Model, "authorization": secret, "baa": baa}}, &d)
		id := d.CreateDeployment.ID
		servertest.Eventually(t, 10*time.Second, "the deployment RUNNING", func() bool {
			var st struct{ Status string }
			s.Do(http.MethodGet, "/v1/deployments/"+id, key, nil).JSON(t, &st)
			return st.Status == "RUNNING"
		})
		return id
	}
	agent := func(dep, runMode string) string {
		var a struct{ CreateAgent struct{ ID, Skill string } }
		s.MustGraphQL(t, key, `mutation($p: ID!, $d: ID!, $m: String) { createAgent(projectId: $p, name: "Ward summary", runMode: $m,
			deploymentId: $d, instructions: "Summarise the overnight vitals for the morning handover.") { id skill } }`,
			map[string]any{"p": project, "d": dep, "m": runMode}, &a)
		if a.CreateAgent.Skill != "llm" {
			t.Fatalf("agent %+v", a.CreateAgent)
		}
		return a.CreateAgent.ID
	}
	run := func(agentID string, input any) (sessionView, llmOutput) {
		t.Helper()
		var d struct{ RunAgent sessionView }
		s.MustGraphQL(t, key, runLLM, map[string]any{"a": agentID, "p": demo.DeterioratingPatientID, "in": input}, &d)
		var out llmOutput
		if d.RunAgent.Output != nil {
			if err := json.Unmarshal(d.RunAgent.Output, &out); err != nil {
				t.Fatalf("output %s: %v", d.RunAgent.Output, err)
			}
		}
		return d.RunAgent, out
	}

	// A BAA backend: the identified context, the server's token counts.
	depBAA := deploy(true)
	withBAA := agent(depBAA, "")
	ses, out := run(withBAA, map[string]any{"question": "Is this patient deteriorating?", "maxTokens": 8})
	if ses.Status != "COMPLETED" || ses.TokensUsed == nil || ses.LatencyMs == nil || out.Skill != "llm" || out.Deidentified ||
		out.Usage.PromptTokens <= 0 || out.Usage.CompletionTokens > 8 || out.Usage.TotalTokens != out.Usage.PromptTokens+out.Usage.CompletionTokens ||
		*ses.TokensUsed != out.Usage.TotalTokens || len(out.ObservationIDs) == 0 {
		t.Fatalf("session %+v, output %s, error %v", ses, ses.Output, deref(ses.Error))
	}
	body, auth := rec.last(t)
	if !strings.Contains(body, demo.DeterioratingPatientID) || !strings.Contains(body, "Is this patient deteriorating?") ||
		!strings.Contains(body, "morning handover") || auth != secret {
		t.Errorf("what a BAA backend got (Authorization %q): %s", auth, body)
	}
	_, longer := run(withBAA, map[string]any{"question": "Is this patient deteriorating? " + strings.Repeat("Consider every vital sign in turn. ", 10), "maxTokens": 8})
	if longer.Usage.PromptTokens <= out.Usage.PromptTokens {
		t.Errorf("a longer question counted %d prompt tokens, the short one %d: not the server's count", longer.Usage.PromptTokens, out.Usage.PromptTokens)
	}

	// No BAA: a de-identified context, and free text refused before anything is sent.
	noBAA := agent(deploy(false), "")
	ses, out = run(noBAA, map[string]any{"maxTokens": 8})
	body, _ = rec.last(t)
	var birth string
	s.Pool().QueryRow(context.Background(), `select coalesce(birth_date, '') from patients where id = $1`, demo.DeterioratingPatientID).Scan(&birth)
	if ses.Status != "COMPLETED" || !out.Deidentified || strings.Contains(body, demo.DeterioratingPatientID) ||
		(birth != "" && strings.Contains(body, birth)) || strings.Contains(body, time.Now().UTC().Format("2006-01-02")) || !strings.Contains(body, "min ago") {
		t.Errorf("without a BAA: session %+v, output %s, sent %s", ses, ses.Output, body)
	}
	res := s.GraphQL(key, runLLM, map[string]any{"a": noBAA, "p": demo.DeterioratingPatientID, "in": map[string]any{"question": "How is Mr Smith?"}})
	if len(res.Errors) == 0 || res.Errors[0].Code() != "BAD_USER_INPUT" || !strings.Contains(fmtErr(res.Errors[0]), "business associate agreement") {
		t.Errorf("free text to a backend without a BAA: %+v", res.Errors)
	}
	if b, _ := rec.last(t); strings.Contains(b, "Mr Smith") {
		t.Error("the refused question reached the server")
	}

	// A test key sees only synthetic patients, through an LLM agent too.
	testKey := s.Key(demo.DemoOrgSlug, access.Test, access.ExecAgents)
	var real string
	s.Pool().QueryRow(context.Background(), `select id from patients where org_id = (select org_id from agents where id = $1) and not synthetic limit 1`, noBAA).Scan(&real)
	if real != "" {
		res := s.GraphQL(testKey, runLLM, map[string]any{"a": noBAA, "p": real, "in": nil})
		if len(res.Errors) == 0 || res.Errors[0].Code() != "NOT_FOUND" {
			t.Errorf("a test key on a real patient: %s %+v", res.Data, res.Errors)
		}
	}

	// The server dies: sessions FAIL at once and say why, sync and async; none stays RUNNING.
	srv.Kill()
	start := time.Now()
	ses, _ = run(withBAA, nil)
	if ses.Status != "FAILED" || ses.Error == nil || !strings.Contains(*ses.Error, "did not answer") || time.Since(start) > 15*time.Second {
		t.Errorf("with the server down (%s): %+v %v", time.Since(start), ses, deref(ses.Error))
	}
	async := agent(depBAA, "async")
	queued, _ := run(async, nil)
	servertest.Eventually(t, 30*time.Second, "the async session FAILED", func() bool {
		return scalar(t, s, `select status from agent_sessions where id = $1`, queued.ID) == "FAILED"
	})

	srv.Restart(t)
	servertest.Eventually(t, 30*time.Second, "a COMPLETED session after the server returned", func() bool {
		ses, _ := run(withBAA, map[string]any{"maxTokens": 4})
		return ses.Status == "COMPLETED"
	})
}

// fmtErr is a GraphQL error with its extensions, where the fields' reasons are.
func fmtErr(e servertest.GraphQLError) string {
	b, _ := json.Marshal(e)
	return string(b)
}

func scalar(t *testing.T, s *servertest.Server, sql string, args ...any) string {
	t.Helper()
	var v string
	if err := s.Pool().QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}
