package node

import (
	"slices"
	"strings"
	"testing"
)

func names(cs []component) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.name)
	}
	return out
}

// TestStartOrder checks the real table for every combination of roles: each component starts
// once, after everything it needs, and a node starts only what its roles need.
func TestStartOrder(t *testing.T) {
	for mask := 1; mask < 1<<len(AllRoles); mask++ {
		var roles []string
		for i, r := range AllRoles {
			if mask&(1<<i) != 0 {
				roles = append(roles, r)
			}
		}
		t.Run(strings.Join(roles, ","), func(t *testing.T) {
			plan, err := startOrder(components, roles)
			if err != nil {
				t.Fatal(err)
			}
			order := names(plan)
			needed := map[string]bool{}
			for _, c := range plan {
				for _, n := range c.needs {
					needed[n] = true
				}
			}
			for i, c := range plan {
				if slices.Contains(order[:i], c.name) {
					t.Errorf("%s starts twice: %v", c.name, order)
				}
				for _, n := range c.needs {
					if !slices.Contains(order[:i], n) {
						t.Errorf("%s starts before %s, which it needs: %v", c.name, n, order)
					}
				}
				tagged := slices.ContainsFunc(c.roles, func(r string) bool { return slices.Contains(roles, r) })
				if !tagged && !needed[c.name] {
					t.Errorf("%s starts although no role of %v runs it and nothing needs it", c.name, roles)
				}
			}
			for _, c := range components {
				if slices.ContainsFunc(c.roles, func(r string) bool { return slices.Contains(roles, r) }) && !slices.Contains(order, c.name) {
					t.Errorf("%s is tagged with one of %v but does not start", c.name, roles)
				}
			}
		})
	}
}

// TestRolesStartTheirOwn pins what separates the roles: an api-only node runs no consumer group,
// a processors-only node mounts no authenticated routes.
func TestRolesStartTheirOwn(t *testing.T) {
	tests := []struct {
		roles      []string
		want, not  []string
		wantBefore [][2]string
	}{
		{roles: []string{RoleAPI}, want: []string{"postgres", "kafka", "router", "edge", "api"},
			not: []string{"observation-intake", "outbox-relay", "eventlog-writer", "webhook-dispatcher", "workflow-runner"}},
		{roles: []string{RoleIngest}, want: []string{"edge", "observation-intake", "outbox-relay"},
			not: []string{"api", "agents", "observation-writer"}},
		{roles: []string{RoleProcessors}, want: []string{"eventlog-writer", "audit-writer", "observation-writer",
			"workflow-runner", "workflow-triggers", "agent-worker", "deployment-controller", "webhook-dispatcher"},
			not: []string{"edge", "authenticator", "api", "observation-intake"}},
		// Routes match in mount order; the api's are mounted first, as they always were.
		{roles: AllRoles, want: []string{"api", "observation-intake"}, wantBefore: [][2]string{{"api", "observation-intake"}, {"seed", "kafka"}}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.roles, ","), func(t *testing.T) {
			plan, err := startOrder(components, tt.roles)
			if err != nil {
				t.Fatal(err)
			}
			order := names(plan)
			for _, n := range tt.want {
				if !slices.Contains(order, n) {
					t.Errorf("%s missing from %v", n, order)
				}
			}
			for _, n := range tt.not {
				if slices.Contains(order, n) {
					t.Errorf("%s should not start with roles %v: %v", n, tt.roles, order)
				}
			}
			for _, p := range tt.wantBefore {
				if slices.Index(order, p[0]) > slices.Index(order, p[1]) {
					t.Errorf("%s should start before %s: %v", p[0], p[1], order)
				}
			}
		})
	}
}

// TestEveryComponentHasARole: a row no role reaches is dead wiring.
func TestEveryComponentHasARole(t *testing.T) {
	plan, err := startOrder(components, AllRoles)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range components {
		if !slices.Contains(names(plan), c.name) {
			t.Errorf("no role starts %s", c.name)
		}
	}
}

func TestStartOrderRejectsBadTables(t *testing.T) {
	tests := []struct {
		name  string
		table []component
		want  string
	}{
		{"cycle", []component{{name: "a", roles: []string{"r"}, needs: []string{"b"}}, {name: "b", needs: []string{"a"}}},
			"components need each other: a → b → a"},
		{"unknown need", []component{{name: "a", roles: []string{"r"}, needs: []string{"nope"}}},
			`component "a" needs "nope", which is not in the table`},
		{"duplicate", []component{{name: "a", roles: []string{"r"}}, {name: "a"}}, `component "a" is listed twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := startOrder(tt.table, []string{"r"})
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}
