package node_test

import (
	"testing"

	"carehub/storage/postgres/pgtest"
)

// The readiness tests start whole nodes on a database of their own.
func TestMain(m *testing.M) { pgtest.Main(m) }
