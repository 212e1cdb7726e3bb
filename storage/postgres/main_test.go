package postgres_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

// helperEnv makes the test binary act as a carehub that starts an attached cluster and
// then waits to be killed (TestLocalAttachedDiesWithParent).
const helperEnv = "CAREHUB_POSTGRES_TEST_HELPER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		attachedHelper(dir)
		return
	}
	pgtest.Main(m)
}

func attachedHelper(dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := postgres.StartLocal(ctx, dir, postgres.LocalConfig{Attached: true, Unsafe: true})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("ready", l.DataDir())
	time.Sleep(time.Minute) // the test kills us long before
	os.Exit(1)
}
