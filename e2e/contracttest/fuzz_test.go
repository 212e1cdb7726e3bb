// Package contracttest holds the property-based tests of the REST and GraphQL contracts:
// Schemathesis, driven by the OpenAPI document the node serves or by the GraphQL schema it answers
// to introspection, against a whole node (DECISIONS §3, "the OpenAPI document is exact").
package contracttest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"carehub/cmd/carehub/node"
	"carehub/e2e/servertest"
	"carehub/internal/testenv"
	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/storage/demo"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// schemathesis returns the Schemathesis executable: $CAREHUB_SCHEMATHESIS, the one `make
// fuzz-deps` installs, or one on PATH. Without one the test skips, except under CI=true, where
// a contract that was not checked is a failure.
func schemathesis(t *testing.T) string {
	t.Helper()
	candidates := []string{os.Getenv("CAREHUB_SCHEMATHESIS")}
	if home, err := os.UserHomeDir(); err == nil {
		candidates = append(candidates, filepath.Join(home, ".cache", "carehub", "venv", "bin", "schemathesis"))
	}
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if _, err := os.Stat(c); err == nil {
			return c
		}
	}
	if p, err := exec.LookPath("schemathesis"); err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("schemathesis is not installed: run `make fuzz-deps` (or set CAREHUB_SCHEMATHESIS)")
	}
	testenv.Missing(t, "schemathesis is not installed: `make fuzz-deps` installs it (make test does)")
	return ""
}

// summary is Schemathesis's closing line, e.g. "== 1 passed, 2 warnings in 61.2s ==" or
// "== 4 failures, 1 error, 2 warnings in 8.43s ==", and its count of test cases.
var (
	summary   = regexp.MustCompile(`(?m)^=+ (.*) in [0-9.]+s =+$`)
	generated = regexp.MustCompile(`(?m)^\s*(\d+) generated`)
)

// TestOpenAPIFuzz runs Schemathesis against a node with every check it has (schemathesis.toml):
// no 5xx, only documented status codes, content types and response shapes, invalid data refused,
// valid data not refused as malformed, 405 with Allow for undeclared methods, 401 without a
// credential. The node runs the api and ingest roles: without the processors no webhook is ever
// delivered to the URLs the fuzzer invents.
func TestOpenAPIFuzz(t *testing.T) {
	bin := schemathesis(t)
	s := servertest.Start(t, servertest.WithRoles(node.RoleAPI, node.RoleIngest))
	key := s.DemoKey()
	spare, err := postgres.NewAPIKeys(s.Pool()).Create(context.Background(), apikeys.NewKey{OrgID: s.OrgID(demo.DemoOrgSlug),
		Name: "revoked by the fuzzer", Mode: access.Test})
	if err != nil {
		t.Fatal(err)
	}
	cfg := withTestData(t, s, key)
	run(t, bin, cfg, s.URL+"/v1/openapi.json", "CAREHUB_FUZZ_KEY="+key, "CAREHUB_FUZZ_SPARE_KEY_ID="+spare.ID)
}

// TestGraphQLFuzz runs Schemathesis against POST /graphql, driven by the schema the node answers
// to introspection, with every check it has for GraphQL (graphql.toml): no server error, no
// answer that contradicts the schema, valid queries served, invalid ones refused. The queries
// and mutations are those of a key holding every scope of the demo organization.
func TestGraphQLFuzz(t *testing.T) {
	bin := schemathesis(t)
	s := servertest.Start(t, servertest.WithRoles(node.RoleAPI, node.RoleIngest))
	run(t, bin, withHooks(t, "graphql.toml", "graphql_hooks.py", ""), s.URL+"/graphql", "CAREHUB_FUZZ_KEY="+s.DemoKey())
}

// run runs Schemathesis with the configuration file cfg against the schema at url, and fails
// the test unless it finds nothing.
func run(t *testing.T, bin, cfg, url string, env ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--config-file", cfg, "run", url)
	cmd.Dir = t.TempDir() // whatever Schemathesis writes stays out of the source tree
	cmd.Env = append(append(os.Environ(), env...), "NO_COLOR=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	line := "no summary"
	if m := summary.FindSubmatch(out.Bytes()); m != nil {
		line = string(m[1])
	}
	cases := "?"
	if m := generated.FindSubmatch(out.Bytes()); m != nil {
		cases = string(m[1])
	}
	if err != nil {
		t.Fatalf("schemathesis: %v: %s (%s test cases)\n%s", err, line, cases, out.String())
	}
	report := out.String()
	if i := strings.LastIndex(report, "= SUMMARY ="); i >= 0 {
		report = report[i:]
	}
	t.Logf("schemathesis: %s test cases, %s, in %s\n%s", cases, line, time.Since(start).Round(time.Second), report)
}

// Queries listing ids of the demo organization ($1).
const (
	projects    = `select id from projects where org_id = $1`
	workflows   = `select w.id from workflows w join projects p on p.id = w.project_id where p.org_id = $1`
	deployments = `select d.id from deployments d join projects p on p.id = d.project_id where p.org_id = $1`
	patients    = `select id from patients where org_id = $1`
)

// testData binds parameters to ids that exist in the demo organization, half of the time, so
// that operations on one resource get past 404 to their own logic and answers. Each entry names
// operations by a path regex (no two overlap: Schemathesis takes the parameters of the first
// entry that matches) and maps parameters ("path.id", "query.projectId", "body.workflow_id") to
// the query listing their ids.
var testData = []struct {
	paths  string
	params map[string]string
}{
	{`^/v1/organizations/\{id\}$`, map[string]string{"path.id": `select $1::text`}},
	{`^/v1/projects/\{id\}$`, map[string]string{"path.id": projects}},
	{`^/v1/events$`, map[string]string{"query.projectId": projects}},
	{`^/v1/webhooks$`, map[string]string{"query.projectId": projects, "body.projectId": projects}},
	{`^/v1/webhooks/\{id\}`, map[string]string{"path.id": `select id from webhooks where org_id = $1`}},
	{`^/v1/agents/\{id\}$`, map[string]string{"path.id": `select a.id from agents a join projects p on p.id = a.project_id where p.org_id = $1`}},
	{`^/v1/workflows/\{id\}$`, map[string]string{"path.id": workflows}},
	{`^/api/v1/workflows/runs$`, map[string]string{"body.workflow_id": workflows}},
	{`^/v1/deployments/\{id\}$`, map[string]string{"path.id": deployments}},
	{`^/v1/deployments/\{id\}/invoke$`, map[string]string{"path.id": deployments, "body.patientId": patients}},
	{`^/v1/patients/\{id\}`, map[string]string{"path.id": patients}},
}

// withTestData writes schemathesis.toml with the testData bindings added, and returns its path.
func withTestData(t *testing.T, s *servertest.Server, key string) string {
	t.Helper()
	org := s.OrgID(demo.DemoOrgSlug)
	// A subscription for the webhook operations to read, change, rotate and delete.
	project := s.ProjectID(demo.SepsisProjectName)
	if r := s.Do(http.MethodPost, "/v1/webhooks", key, map[string]any{"projectId": project,
		"url": "https://hooks.example.org/carehub", "events": []string{"agent.*"}}); r.Status != http.StatusCreated {
		t.Fatalf("create webhook: HTTP %d %s", r.Status, r.Body)
	}
	// A running deployment for the deployment operations. No processors role runs its controller
	// here, so the test marks it RUNNING itself: PENDING would answer every invocation 503.
	var installation string
	if err := s.Pool().QueryRow(context.Background(), `select i.id from installations i join assets a on a.id = i.asset_id
where i.project_id = $1 and a.name = $2`, project, demo.NEWS2ModelName).Scan(&installation); err != nil {
		t.Fatal(err)
	}
	res := s.GraphQL(key, `mutation($i: ID!) { createDeployment(installationId: $i, environment: "production", replicas: 1) { id } }`,
		map[string]any{"i": installation})
	var created struct{ CreateDeployment struct{ ID string } }
	if len(res.Errors) > 0 || json.Unmarshal(res.Data, &created) != nil {
		t.Fatalf("createDeployment: %+v", res.Errors)
	}
	if _, err := s.Pool().Exec(context.Background(), `update deployments set status = 'RUNNING' where id = $1`, created.CreateDeployment.ID); err != nil {
		t.Fatal(err)
	}
	var ops, dicts strings.Builder
	dictionary := map[string]string{} // query → dictionary name
	for _, d := range testData {
		var params []string
		for _, param := range slices.Sorted(maps.Keys(d.params)) {
			sql := d.params[param]
			name, ok := dictionary[sql]
			if !ok {
				rows, err := s.Pool().Query(context.Background(), sql, org)
				if err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
				ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil || len(ids) == 0 {
					t.Fatalf("%s: %v ids, %v", sql, ids, err)
				}
				name = fmt.Sprintf("ids%d", len(dictionary))
				dictionary[sql] = name
				quoted, _ := json.Marshal(ids) // a JSON array of strings is a TOML array
				fmt.Fprintf(&dicts, "\n[dictionaries.%s]\nvalues = %s\n", name, quoted)
			}
			params = append(params, fmt.Sprintf("%q = { dictionary = %q, probability = 0.5 }", param, name))
		}
		fmt.Fprintf(&ops, "\n[[operations]]\ninclude-path-regex = %q\nparameters = { %s }\n", d.paths, strings.Join(params, ", "))
	}
	return withHooks(t, "schemathesis.toml", "hooks.py", ops.String()+dicts.String())
}

// withHooks writes the configuration file base with its hooks file (which Schemathesis finds by
// an absolute path only: it runs in a temporary directory) and extra appended, and returns its
// path.
func withHooks(t *testing.T, base, hooks, extra string) string {
	t.Helper()
	text, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	if hooks, err = filepath.Abs(hooks); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), base)
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "hooks = %q\n%s%s", hooks, text, extra), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}
