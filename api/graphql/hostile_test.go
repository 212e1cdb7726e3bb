package graphql_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"carehub/api/graphql"
	"carehub/api/graphql/spectest"
	"carehub/api/ws/wstest"
	"carehub/e2e/servertest"
	"carehub/storage/demo"
)

// patientPage is one alias of the amplification attack of issue 13: a page of 100 patients with
// the newest 100 observations of each (cost 40 201).
const patientPage = `patients(limit: 100) { id observations { id code valueQuantity effectiveDateTime } }`

// attack is that page under 60 aliases, a 5 KB query (cost 2 412 060).
func attack() string {
	var b strings.Builder
	b.WriteString("{")
	for i := range 60 {
		fmt.Fprintf(&b, " p%d: %s", i, patientPage)
	}
	b.WriteString(" }")
	return b.String()
}

// TestCostBudget: a query whose answer would be huge is refused before it runs, naming its cost
// and the budget, over HTTP and over WebSocket; realistic queries pass.
func TestCostBudget(t *testing.T) {
	s := start(t)
	key := s.DemoKey()
	if n := s.count(`select count(*) from observations o join patients p on p.id = o.patient_id where p.org_id = $1`, demo.DemoOrgID); n < 2000 {
		t.Fatalf("the demo organization has %d observations; the attack needs many to be one", n)
	}
	wantRefusal := func(t *testing.T, e servertest.GraphQLError) {
		t.Helper()
		if e.Code() != graphql.CodeBadUserInput || !strings.Contains(e.Message, "2412060") || !strings.Contains(e.Message, "100000") ||
			e.Extensions["cost"] != float64(2412060) || e.Extensions["maxCost"] != float64(graphql.DefaultMaxCost) {
			t.Fatalf("error %+v, want BAD_USER_INPUT naming the cost 2412060 and the budget 100000", e)
		}
	}

	t.Run("the amplification attack is refused over HTTP, and memory stays flat", func(t *testing.T) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		r := s.Do(http.MethodPost, "/graphql", key, map[string]any{"query": attack()})
		runtime.ReadMemStats(&after)
		if r.Status != http.StatusOK || len(r.Body) > 4096 {
			t.Fatalf("HTTP %d, %d bytes: %.300s", r.Status, len(r.Body), r.Body)
		}
		var res struct {
			Data   json.RawMessage           `json:"data"`
			Errors []servertest.GraphQLError `json:"errors"`
		}
		r.JSON(t, &res)
		if len(res.Errors) != 1 || res.Data != nil {
			t.Fatalf("response %s", r.Body)
		}
		wantRefusal(t, res.Errors[0])
		// Executed, the attack allocates well over a gigabyte (155 MB of answer); refused, it
		// allocates what parsing a 5 KB document takes. The bound leaves room for the node's
		// background work meanwhile.
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
			t.Fatalf("the refused request allocated %d MB", alloc>>20)
		}
	})

	t.Run("the attack is refused over WebSocket", func(t *testing.T) {
		wantRefusal(t, wsRefusal(t, s, key, attack(), nil))
	})

	t.Run("realistic queries pass", func(t *testing.T) {
		var page struct {
			Patients []struct {
				ID           string
				Observations []json.RawMessage
			}
		}
		s.MustGraphQL(t, key, "{ "+patientPage+" }", nil, &page) // cost 40 201: one page of the attack
		if len(page.Patients) == 0 || len(page.Patients[0].Observations) == 0 {
			t.Fatalf("page %+v", page)
		}
		s.MustGraphQL(t, key, "{ "+patientPage+" again: "+patientPage+" }", nil, nil) // 80 402
		s.MustGraphQL(t, key, spectest.IntrospectionQuery, nil, nil)                  // what the explorer and the spec tests send
		s.MustGraphQL(t, key, `query Organizations { organizations { id name slug plan } }`, nil, nil)
	})

	t.Run("the budget is configurable", func(t *testing.T) {
		cfg := servertest.Config(t)
		cfg.GraphQLMaxCost = 80
		small := servertest.StartConfig(t, cfg)
		res := small.GraphQL(small.DemoKey(), `query Organizations { organizations { id name slug plan } }`, nil) // 81
		if len(res.Errors) != 1 || !strings.Contains(res.Errors[0].Message, "estimated cost is 81, over the budget of 80") {
			t.Fatalf("errors %+v", res.Errors)
		}
	})

	t.Run("the budget counts limits given by variables", func(t *testing.T) {
		var q strings.Builder
		q.WriteString("query($n: Int) {")
		for i := range 5 {
			fmt.Fprintf(&q, " p%d: patients(limit: $n) { observations { id code } }", i)
		}
		q.WriteString(" }")
		s.MustGraphQL(t, key, q.String(), map[string]any{"n": 50}, nil) // 5 × (1 + 50 × 201) = 50 255
		res := fails(t, s, key, q.String(), map[string]any{"n": 100}, graphql.CodeBadUserInput)
		if !strings.Contains(res.Errors[0].Message, "estimated cost is 100505, over the budget of 100000") {
			t.Fatalf("errors %+v", res.Errors)
		}
		res = fails(t, s, key, q.String()+" query Other { apiVersion }", map[string]any{"n": 100}, graphql.CodeBadUserInput)
		if !strings.Contains(res.Errors[0].Message, "must be the only defined operation") {
			t.Fatalf("errors %+v", res.Errors) // no operation runs: graph-gophers says why
		}
	})
}

// TestStrictInput: a NUL byte in any text argument or variable, at any depth, is BAD_USER_INPUT
// naming it, before anything runs (before, Postgres refused it: SQLSTATE 22021, an INTERNAL error).
func TestStrictInput(t *testing.T) {
	s := start(t)
	key := s.DemoKey()
	prj := s.ProjectID(demo.SepsisProjectName)
	patient := s.id(`select id from patients where org_id = $1 limit 1`, demo.DemoOrgID)
	agent := s.id(`select id from agents where name = $1`, demo.Ward7AgentName)
	asset := map[string]any{"name": "Sepsis\x00 watch", "description": "d", "version": "1", "type": "MODEL", "category": "c",
		"pricingType": "FREE", "supportEmail": "a@example.com"}
	for _, tc := range []struct {
		name, query string
		vars        map[string]any
		ext, path   string // the extension naming the input, and its value
	}{
		{"patient id", `{ patient(id: "pat_\u0000") { id } }`, nil, "argument", "patient(id)"},
		{"patient id variable", `query($id: ID!) { patient(id: $id) { id } }`, map[string]any{"id": "pat_\x00"}, "variable", "$id"},
		{"patient id variable default", `query($id: ID! = "pat_\u0000") { patient(id: $id) { id } }`, nil, "variable", "$id"},
		{"nested field argument", `query($id: ID!) { p: patient(id: $id) { observations(code: "8867-4\u0000") { id } } }`, map[string]any{"id": patient}, "argument", "p.observations(code)"},
		{"events type", `query($p: ID!) { events(projectId: $p, type: "device.\u0000") { id } }`, map[string]any{"p": prj}, "argument", "events(type)"},
		{"events type variable", `query($p: ID!, $t: String) { events(projectId: $p, type: $t) { id } }`, map[string]any{"p": prj, "t": "a\x00"}, "variable", "$t"},
		{"publishEvent type", `mutation($p: ID!) { publishEvent(type: "lab.\u0000", payload: {}, projectId: $p) { id } }`, map[string]any{"p": prj}, "argument", "publishEvent(type)"},
		{"publishEvent JSON literal", `mutation($p: ID!) { publishEvent(type: "lab.result", payload: {note: ["ok", "a\u0000"]}, projectId: $p) { id } }`, map[string]any{"p": prj}, "argument", "publishEvent(payload.note[1])"},
		{"publishEvent JSON variable", `mutation($p: ID!, $x: JSON!) { publishEvent(type: "lab.result", payload: $x, projectId: $p) { id } }`,
			map[string]any{"p": prj, "x": map[string]any{"result": map[string]any{"note": "a\x00"}}}, "variable", "$x.result.note"},
		{"publishEvent JSON key", `mutation($p: ID!, $x: JSON!) { publishEvent(type: "lab.result", payload: $x, projectId: $p) { id } }`,
			map[string]any{"p": prj, "x": map[string]any{"k\x00": 1}}, "variable", `$x."k\x00"`},
		{"createAgent name", `mutation($p: ID!) { createAgent(name: "Ward\u0000", projectId: $p) { id } }`, map[string]any{"p": prj}, "argument", "createAgent(name)"},
		{"createAgent name variable", `mutation($p: ID!, $n: String!) { createAgent(name: $n, projectId: $p) { id } }`, map[string]any{"p": prj, "n": "\x00"}, "variable", "$n"},
		{"runAgent patientId", `mutation($a: ID!) { runAgent(agentId: $a, patientId: "pat_\u0000") { id } }`, map[string]any{"a": agent}, "argument", "runAgent(patientId)"},
		{"input object field", `mutation($in: SubmitAssetInput!) { submitAsset(input: $in) { id } }`, map[string]any{"in": asset}, "variable", "$in.name"},
		{"input object literal", `mutation { submitAsset(input: {name: "a", description: "x\u0000", version: "1", type: MODEL, category: "c", pricingType: FREE, supportEmail: "a@example.com"}) { id } }`,
			nil, "argument", "submitAsset(input.description)"},
		{"list item", `mutation($p: ID!) { createWorkflow(name: "w", projectId: $p, steps: ["notify", "\u0000"]) { id } }`, map[string]any{"p": prj}, "argument", "createWorkflow(steps[1])"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := fails(t, s, key, tc.query, tc.vars, graphql.CodeBadUserInput)
			if e := res.Errors[0]; len(res.Errors) != 1 || e.Extensions[tc.ext] != tc.path || !strings.Contains(e.Message, "NUL") {
				t.Fatalf("errors %+v, want one naming %s %s", res.Errors, tc.ext, tc.path)
			}
		})
	}

	t.Run("over WebSocket", func(t *testing.T) {
		e := wsRefusal(t, s, key, `subscription($p: ID!, $t: [String!]) { eventStream(projectId: $p, types: $t) { id } }`,
			map[string]any{"p": prj, "t": []any{"lab.*", "a\x00"}})
		if e.Code() != graphql.CodeBadUserInput || e.Extensions["variable"] != "$t[1]" {
			t.Fatalf("error %+v, want BAD_USER_INPUT naming $t[1]", e)
		}
	})
}

// wsRefusal runs an operation over WebSocket that must be refused before it runs, and returns
// its one error.
func wsRefusal(t *testing.T, s *node, key, query string, vars map[string]any) servertest.GraphQLError {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := wstest.Dial(ctx, "ws://"+s.Addr()+"/graphql", "Bearer "+key)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Subscribe(ctx, "op", query, vars)
	if err != nil {
		t.Fatal(err)
	}
	for m := range ch {
		t.Fatalf("data pushed: %.300s", m)
	}
	var opErr *wstest.OperationError
	if err := c.Err("op"); !errors.As(err, &opErr) || len(opErr.Errors) != 1 {
		t.Fatalf("err %v, want one operation error", err)
	}
	var e servertest.GraphQLError
	if err := json.Unmarshal(opErr.Errors[0], &e); err != nil {
		t.Fatal(err)
	}
	return e
}
