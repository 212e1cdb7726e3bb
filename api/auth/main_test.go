package auth

import (
	"context"
	"flag"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/kernel/access"
	"carehub/kernel/apikeys"
	"carehub/kernel/ids"
	"carehub/storage/postgres"
	"carehub/storage/postgres/pgtest"
)

func TestMain(m *testing.M) {
	// Fuzz workers run only the fuzz targets, which need no database: do not start a Postgres
	// per worker.
	flag.Parse()
	if f := flag.Lookup("test.fuzzworker"); f != nil && f.Value.String() == "true" {
		os.Exit(m.Run())
	}
	pgtest.Main(m)
}

// newOrg inserts an organization and returns its id.
func newOrg(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	id := ids.New(ids.Organization)
	if _, err := pool.Exec(context.Background(), `insert into organizations (id, name, slug, type, plan) values ($1, $2, $3, 'clinic', 'starter')`,
		id, "Org "+id, id); err != nil {
		t.Fatalf("insert organization: %v", err)
	}
	return id
}

// newKey creates a key and fails the test on error.
func newKey(t testing.TB, keys *postgres.APIKeys, nk apikeys.NewKey) *apikeys.CreatedKey {
	t.Helper()
	ck, err := keys.Create(context.Background(), nk)
	if err != nil {
		t.Fatalf("create key: %v", err)
	}
	return ck
}

// clock is a settable clock for tests, safe for concurrent use.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Now()} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

var allScopes = access.Scopes
