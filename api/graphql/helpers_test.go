package graphql_test

import (
	"strings"
	"testing"

	"carehub/e2e/servertest"
	"carehub/storage/postgres/pgtest"
)

// node wraps a started server with the ids the tests use.
type node struct {
	*servertest.Server
	t testing.TB
}

func start(t testing.TB) *node {
	t.Helper()
	return &node{servertest.Start(t), t}
}

// id returns a single value of a query on the node's database, failing the test when absent.
func (n *node) id(sql string, args ...any) string {
	return pgtest.Scalar[string](n.t, n.Pool(), sql, args...)
}

func (n *node) assetID(name string) string {
	return n.id(`select id from assets where name = $1`, name)
}

// count returns a count(*) query's result.
func (n *node) count(sql string, args ...any) int {
	return pgtest.Scalar[int](n.t, n.Pool(), sql, args...)
}

// fails runs a query that must fail with code and returns the response.
func fails(t testing.TB, s *node, key, query string, vars map[string]any, code string) *servertest.GraphQLResponse {
	t.Helper()
	res := s.GraphQL(key, query, vars)
	if len(res.Errors) == 0 {
		t.Fatalf("want %s, got data %s\nquery: %s", code, res.Data, query)
	}
	for _, e := range res.Errors {
		if e.Code() != code {
			t.Fatalf("want every error %s, got %s: %+v\nquery: %s", code, e.Code(), res.Errors, query)
		}
		if len(e.Path) > 0 && len(e.Locations) == 0 {
			t.Errorf("error with a path but no locations: %+v", e)
		}
	}
	return res
}

// dataIsNull reports whether a response's data is JSON null (or absent).
func dataIsNull(res *servertest.GraphQLResponse) bool {
	return len(res.Data) == 0 || strings.TrimSpace(string(res.Data)) == "null"
}
