package auth

import (
	"flag"
	"os"
	"sync"
	"testing"
	"time"

	"carehub/kernel/access"
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
