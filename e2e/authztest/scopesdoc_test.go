package authztest

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"carehub/kernel/access"
)

var update = flag.Bool("update", false, "rewrite docs/SCOPES.md from the authorization matrix")

const scopesDoc = "../../docs/SCOPES.md"

// grant is one row of the spec's scope table (docs/API.md, Authentication 7).
type grant struct{ grants, level string }

// grants is the spec's scope table; TestScopesDoc fails when it and access.Scopes disagree.
var grants = map[string]grant{
	access.ReadPatients:      {"Read FHIR Patient resources", "Standard"},
	access.WritePatients:     {"Create and update Patient resources", "Standard"},
	access.ReadObservations:  {"Read FHIR Observations", "Standard"},
	access.WriteObservations: {"Create Observations (for example from devices)", "Standard"},
	access.ExecAgents:        {"Execute clinical AI agents", "Standard"},
	access.ExecWorkflows:     {"Trigger workflow runs", "Standard"},
	access.AdminOrg:          {"Manage organization settings and users", "Admin"},
	access.AdminBilling:      {"View and manage billing", "Admin"},
	access.PublishAssets:     {"Publish assets to the marketplace", "Publisher"},
}

// TestScopesDoc holds docs/SCOPES.md to the authorization matrix, which TestAuthorizationMatrix
// checks against a live node: the reference cannot say what the code does not do.
// go test ./e2e/authztest -run TestScopesDoc -args -update rewrites it.
func TestScopesDoc(t *testing.T) {
	if got, want := slices.Sorted(maps.Keys(grants)), slices.Sorted(slices.Values(access.Scopes)); !slices.Equal(got, want) {
		t.Fatalf("the scope table names %v, kernel/access has %v", got, want)
	}
	want := renderScopes()
	if *update {
		if err := os.WriteFile(scopesDoc, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(scopesDoc)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("docs/SCOPES.md is not what the authorization matrix says; run go test ./e2e/authztest -run TestScopesDoc -args -update\n--- want\n%s", want)
	}
}

func renderScopes() string {
	var b strings.Builder
	b.WriteString(`# Scopes

<!-- Generated from the authorization matrix (e2e/authztest/rows_test.go) by
go test ./e2e/authztest -run TestScopesDoc -args -update; do not edit. -->

An API key carries scopes chosen when it is created (least privilege); a JWT carries a subset of
its key's. An operation that needs a scope the credential lacks answers 403 ` + "`INSUFFICIENT_SCOPE`" + `
(GraphQL: ` + "`extensions.code`" + ` FORBIDDEN), naming the scope. The platform operator's key (made by
` + "`carehub keys create --platform`" + `) holds every scope. Every operation below is checked against a
live node, for each credential kind, by ` + "`TestAuthorizationMatrix`" + ` in ` + "`e2e/authztest`" + `; this page is
generated from the same table, so it cannot disagree with the code.

Besides the scopes, tenancy applies everywhere: another organization's resource is ` + "`NOT_FOUND`" + `,
never FORBIDDEN, and a test key (` + "`chk_test_`" + `) sees only synthetic patients. Patient data (PHI)
inside records any credential may read (event payloads, agent sessions, workflow runs, webhook
deliveries) is served only to credentials holding ` + "`read:patients`" + ` (observation values also
` + "`read:observations`" + `); elsewhere those fields are removed and the record says ` + "`redacted: true`" + `
(see [SECURITY.md](SECURITY.md) and [DECISIONS.md](DECISIONS.md) §2).

## The scopes

| scope | grants | level | operations and fields that need it |
|---|---|---|---|
`)
	for _, s := range access.Scopes {
		var ops []string
		for _, r := range rows {
			if slices.Contains(r.scopes, s) {
				ops = append(ops, "`"+r.op+"`")
			}
		}
		g := grants[s]
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", s, g.grants, g.level, orNone(strings.Join(ops, ", ")))
	}
	b.WriteString(`
## Every operation

"any credential" is any valid API key or JWT of the organization; "tenant" marks operations on
one organization's resource (another organization's is NOT_FOUND); "real patient" marks those a
test key gets NOT_FOUND for on a non-synthetic patient; "API key only" ones refuse a JWT.

| operation | needs | tenant | real patient | API key only |
|---|---|---|---|---|
`)
	for _, r := range rows {
		needs := "any credential"
		switch {
		case r.access == public_:
			needs = "nothing (public)"
		case r.access == platform:
			needs = "the platform operator"
		case len(r.scopes) > 0:
			needs = "`" + strings.Join(r.scopes, "` and `") + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", r.op, needs, yes(r.tenant), yes(r.real), yes(r.keyOnly))
	}
	return b.String()
}

func yes(v bool) string {
	if v {
		return "yes"
	}
	return ""
}

func orNone(s string) string {
	if s == "" {
		return "(no operation yet)"
	}
	return s
}
