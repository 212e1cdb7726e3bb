package graphql_test

import (
	"testing"

	"carehub/api/graphql"
	"carehub/kernel/fault"
)

// A dependency that cannot serve is UNAVAILABLE, as REST's 503: the client may retry.
func TestUnavailableCode(t *testing.T) {
	if got := graphql.Code(fault.Unavailable("the event store is down")); got != "UNAVAILABLE" {
		t.Fatalf("Code = %q", got)
	}
}
